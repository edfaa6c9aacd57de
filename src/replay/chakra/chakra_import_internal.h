// Pieces both importers share (chakra_import.cc streams the files; chakra_import_document.cc is the reference that
// keeps every rank's nodes): rank files, communicator groups, Chakra's collective types, role-class comparison
// and the graph-level fields. Not an API: only the two importers include this.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "prism/trace.h"
#include "replay/chakra/chakra_import.h"

namespace prism::chakra::internal {

// <prefix>.<rank>.et[.gz], index = rank.
struct RankFiles {
  std::vector<std::string> paths;
  std::string dir;
};
bool FindRankFiles(const ImportOptions& opts, RankFiles* out, std::string* error);

struct Group {
  std::vector<int32_t> ranks;  // communicator-rank order
  std::string desc;
  std::string source;  // where it was defined, for messages
};

// The files, the rank count, the comm-group file: what both importers do before reading any rank.
bool StartImport(const ImportOptions& opts, ImportSummary* summary, RankFiles* files,
                 std::map<std::string, Group>* groups, std::string* error);

// PyTorch's process-group table in a METADATA node's inputs.values (docs/chakra.md). False, adding nothing, for
// a METADATA node that is not such a table.
bool ParsePgTable(const std::string& values, int32_t world, std::map<std::string, Group>* out,
                  const std::string& source);

// The comm-group file wins over METADATA tables; a disagreement is a note.
void MergeMetadataGroups(std::map<std::string, Group>&& metadata_groups, std::map<std::string, Group>* groups,
                         ImportSummary* summary);

std::string NodeRef(const std::string& file, uint64_t id, const std::string& name);

// Chakra's CollectiveCommType -> Prism. *representable is false for GATHER/SCATTER; kInvalid otherwise means
// a value outside the enum.
trace::CollOp MapCommType(int64_t t, bool* representable);

std::string Plural(uint64_t n, const std::string& what);

// A communicator of the imported graph, before ids are final.
struct CommInfo {
  std::string key;
  std::vector<int32_t> ranks;
  std::string desc;
  bool pair = false;
  bool world = false;
};

// What decides folding: two ranks share a class when their classes are equal by SameClass (names aside).
size_t HashClass(const trace::RoleClass& c);
bool SameClass(const trace::RoleClass& a, const trace::RoleClass& b);

// What rank 0's GlobalMetadata says of the whole graph.
struct GraphAttrs {
  bool from_prism = false;
  std::optional<std::string> layout, topology, send_completion;
};

// world_size, layout, topology, send_completion of `out` (which is reset), and summary->from_prism.
void StartGraph(const ImportOptions& opts, int32_t world, const GraphAttrs& rank0, trace::Trace* out,
                ImportSummary* summary);

// Validates `out` and writes the summary's counts and its "not represented" note.
bool FinishImport(const trace::Trace& out, ImportSummary* summary, std::string* error);

}  // namespace prism::chakra::internal
