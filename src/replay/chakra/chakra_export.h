// PrismTrace -> Chakra execution traces that ASTRA-sim reads: one <prefix>.<rank>.et file per rank (a
// GlobalMetadata, then one Node per Prism node) and the communicator-group JSON ({"<pg_name>": [ranks]}).
// docs/chakra.md says what maps to what.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "prism/trace.h"
#include "replay/chakra/chakra_attrs.h"

namespace prism::chakra {

struct ExportOptions {
  std::string out_dir;                            // created when missing
  std::string prefix = "prism";                   // files <out_dir>/<prefix>.<rank>.et
  std::string comm_group_file = "comm_group.json";  // inside out_dir
  // Write the prism_* attributes (stream, slot, iteration, dtype, root, exact duration, class, layout) that
  // let import-chakra give back the same graph. ASTRA-sim ignores them.
  bool prism_attrs = true;
  // What an ALL_GATHER's comm_size counts: each rank's input (bytes / ranks, what ASTRA-sim reads) or the
  // whole output (bytes).
  AllGatherCommSize allgather_comm_size = AllGatherCommSize::kInput;
};

struct ExportSummary {
  int32_t ranks = 0;
  uint64_t nodes = 0;
  std::map<std::string, uint64_t> by_type;  // Chakra node type (and comm_type) -> nodes written
  size_t comm_groups = 0;
  std::string workload;         // what ASTRA-sim's --workload-configuration takes: <out_dir>/<prefix>
  std::string comm_group_path;  // what its --comm-group-configuration takes
  std::vector<std::string> warnings;  // what ASTRA-sim will not simulate as Prism does

  std::string Format() const;
};

// Writes the files. `t` should be valid (ReadTrace validates it). Returns false with *error on an I/O failure
// or a trace that does not hold together (a rank bound to a communicator that does not exist).
bool ExportChakra(const trace::Trace& t, const ExportOptions& opts, ExportSummary* summary, std::string* error);

}  // namespace prism::chakra
