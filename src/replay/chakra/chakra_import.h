// Chakra execution traces (one ET file per rank, as ASTRA-sim reads them) -> PrismTrace.
// docs/chakra.md says what maps to what; in short:
//   COMP_NODE                         -> compute (duration_micros), stream "compute" ("cpu" when is_cpu_op)
//   COMM_COLL_NODE (comm_type, comm_size, pg_name)  -> coll on the communicator of pg_name, stream "comm.<slot>";
//                                      bytes = comm_size (all-gather: comm_size x ranks, ASTRA-sim's reading)
//   COMM_SEND_NODE / COMM_RECV_NODE (comm_src, comm_dst, comm_size, comm_tag)
//                                      -> send/recv, peer in communicator ranks, stream "send|recv.<slot>.<peer>"
//   data_deps (+ ctrl_deps)            -> stream order plus `after` edges
//   anything else (METADATA_NODE, MEM_LOAD_NODE, GATHER, ...) -> not represented: counted by kind and reported,
//                                         dependencies through it kept transitively
// Ranks whose mapped node lists are identical (communicators compared by slot) share one role class.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "prism/trace.h"
#include "replay/chakra/chakra_attrs.h"

namespace prism::chakra {

struct ImportOptions {
  // A directory holding <prefix>.<rank>.et (or .et.gz) files, or a path prefix as ASTRA-sim's
  // --workload-configuration takes it ("dir/prefix" for dir/prefix.0.et, dir/prefix.1.et, ...).
  std::string input;
  // With a directory that holds several prefixes: which one.
  std::string prefix;
  // ASTRA-sim's communicator-group JSON ({"<group id>": [ranks...]}). Empty: <dir>/comm_group.json when that
  // exists, else only groups from METADATA nodes (PyTorch's process-group table) and the world.
  std::string comm_group;
  // Honour ctrl_deps as dependencies like data_deps. ASTRA-sim's feeder honours data_deps only.
  bool ctrl_deps = true;
  // What an ALL_GATHER's comm_size counts: each rank's input (ASTRA-sim's reading; bytes = comm_size x ranks)
  // or the whole output (bytes = comm_size).
  AllGatherCommSize allgather_comm_size = AllGatherCommSize::kInput;
  // The imported graph's send_completion. kInvalid: what files Prism wrote say (prism_send_completion; none:
  // none), else kEager, as ASTRA-sim replays sends (they complete without their receive).
  trace::SendCompletion send_completion = trace::SendCompletion::kInvalid;
  // Threads reading rank files (0: one per core, at most 4). The result does not depend on it.
  int threads = 0;
};

struct ImportSummary {
  int32_t world_size = 0;
  std::vector<std::string> files;                      // per rank
  std::string comm_group_file;                         // the file used, if any
  std::map<std::string, uint64_t> imported;            // Prism kind (+ op) -> nodes, over all ranks
  std::map<std::string, uint64_t> not_represented;     // Chakra kind -> nodes, over all ranks
  double not_represented_us = 0.0;                     // their duration_micros, summed
  uint64_t after_edges = 0;
  size_t comms = 0;
  size_t classes = 0;
  bool from_prism = false;                             // the files carry Prism's round-trip attributes
  trace::SendCompletion send_completion = trace::SendCompletion::kInvalid;  // what the graph says
  std::vector<std::string> notes;                      // one line each, for stderr

  // Lines for stdout: ranks, classes, communicators, nodes by kind, what was not represented.
  std::string Format() const;
};

// Reads every rank's file, one node at a time, and builds `out` (validated with ValidateTrace). Memory is what the
// distinct ranks need, not the whole trace: ranks whose mapped nodes are the same but for their communicators,
// peers and tags are stored once. Returns false with *error naming the file and node (Chakra node id and name)
// for unreadable or inconsistent input: a missing rank file, a dependency on a node that is not in the file, a
// dependency cycle, a collective without comm_type or comm_size, an unknown process group, members disagreeing
// on a collective, a send without its receive.
bool ImportChakra(const ImportOptions& opts, trace::Trace* out, ImportSummary* summary, std::string* error);

// The same import by the reference importer, which reads each file into protobuf messages and keeps every
// rank's nodes until the end (memory grows with the whole trace). ImportChakra streams instead and gives the
// same graph, summary and messages. Kept as the baseline of bench/chakra_import_bench and the reference of
// tests/unit/chakra_stream_test.
bool ImportChakraDocument(const ImportOptions& opts, trace::Trace* out, ImportSummary* summary, std::string* error);

}  // namespace prism::chakra
