#include "replay/chakra/chakra_export.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "replay/chakra/chakra_attrs.h"
#include "replay/chakra/chakra_et_io.h"

namespace prism::chakra {

namespace fs = std::filesystem;
using json = nlohmann::json;
using trace::CollOp;
using trace::NodeKind;

namespace {

et::CollectiveCommType CommType(CollOp op) {
  switch (op) {
    case CollOp::kAllReduce: return et::ALL_REDUCE;
    case CollOp::kAllGather: return et::ALL_GATHER;
    case CollOp::kReduceScatter: return et::REDUCE_SCATTER;
    case CollOp::kBroadcast: return et::BROADCAST;
    case CollOp::kReduce: return et::REDUCE;
    case CollOp::kAllToAll: return et::ALL_TO_ALL;
    case CollOp::kBarrier: return et::BARRIER;
    case CollOp::kInvalid: break;
  }
  return et::ALL_REDUCE;  // not reached for a validated trace
}

// What import-chakra reads back from duration_micros alone (see RankReader::Classify, chakra_import_rank_reader.cc).
double ReadBack(uint64_t micros, bool comm) {
  if (!comm) return static_cast<double>(micros);
  return micros > 0 ? static_cast<double>(micros) : -1.0;
}

// The class's nodes as (stream, position) in a topological order of stream order plus `after` edges.
// Why: a reader that streams the file (Chakra's feeder reads a window of nodes) then never meets a
// dependency on a node it has not read yet. Nodes on a dependency cycle (a graph that would deadlock) follow
// in stream order.
std::vector<std::pair<uint32_t, uint32_t>> FileOrder(const trace::RoleClass& cls) {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> where;
  std::vector<std::vector<uint32_t>> pending(cls.streams.size());
  for (uint32_t s = 0; s < cls.streams.size(); ++s) {
    pending[s].resize(cls.streams[s].nodes.size());
    for (uint32_t k = 0; k < cls.streams[s].nodes.size(); ++k) where[cls.streams[s].nodes[k].id] = {s, k};
  }
  std::unordered_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> waiting;  // id -> nodes after it
  for (uint32_t s = 0; s < cls.streams.size(); ++s) {
    for (uint32_t k = 0; k < cls.streams[s].nodes.size(); ++k) {
      const trace::Node& n = cls.streams[s].nodes[k];
      pending[s][k] = k > 0 ? 1 : 0;
      for (uint32_t a : n.after) {
        if (!where.count(a)) continue;
        ++pending[s][k];
        waiting[a].push_back({s, k});
      }
    }
  }
  std::vector<std::pair<uint32_t, uint32_t>> order, queue;
  for (uint32_t s = 0; s < cls.streams.size(); ++s) {
    if (!cls.streams[s].nodes.empty() && pending[s][0] == 0) queue.push_back({s, 0});
  }
  for (size_t q = 0; q < queue.size(); ++q) {
    auto [s, k] = queue[q];
    order.push_back({s, k});
    auto release = [&](uint32_t s2, uint32_t k2) {
      if (--pending[s2][k2] == 0) queue.push_back({s2, k2});
    };
    if (k + 1 < cls.streams[s].nodes.size()) release(s, k + 1);
    auto it = waiting.find(cls.streams[s].nodes[k].id);
    if (it != waiting.end()) {
      for (auto [s2, k2] : it->second) release(s2, k2);
    }
  }
  if (order.size() < where.size()) {
    std::vector<std::vector<char>> emitted(cls.streams.size());
    for (uint32_t s = 0; s < cls.streams.size(); ++s) emitted[s].assign(cls.streams[s].nodes.size(), 0);
    for (auto [s, k] : order) emitted[s][k] = 1;
    for (uint32_t s = 0; s < cls.streams.size(); ++s) {
      for (uint32_t k = 0; k < cls.streams[s].nodes.size(); ++k) {
        if (!emitted[s][k]) order.push_back({s, k});
      }
    }
  }
  return order;
}

// ExportChakra's state and steps, in its order. A step that returns false has set *error.
class ChakraExporter {
 public:
  ChakraExporter(const trace::Trace& t, const ExportOptions& opts, ExportSummary* summary, std::string* error)
      : t_(t), opts_(opts), summary_(summary), error_(error) {}

  bool CreateOutDir();
  bool WriteCommGroups();
  bool WriteRanks();
  void AddWarnings();

 private:
  bool WriteRank(int32_t r);
  bool BindSlots(int32_t r, const trace::RankBinding& b, const trace::RoleClass& cls, std::vector<size_t>* slot_comm,
                 json* descs);
  void AddRankAttrs(const trace::RoleClass& cls, const json& descs, EtFile* f);
  void AddNode(int32_t r, const trace::RoleClass& cls, const std::vector<size_t>& slot_comm, uint32_t s, uint32_t k,
               EtFile* f);
  std::string AddCommAttrs(int32_t r, const trace::Node& n, const std::vector<size_t>& slot_comm, et::Node& c);
  void AddPrismNodeAttrs(const trace::RoleClass& cls, const trace::Stream& st, const trace::Node& n, uint64_t micros,
                         et::Node& c);

  const trace::Trace& t_;
  const ExportOptions& opts_;
  ExportSummary* summary_;
  std::string* error_;
  std::unordered_map<uint32_t, size_t> comm_pos_;  // communicator id -> its position in t.comms
  json layout_;
  uint64_t astra_unsupported_ = 0, zero_p2p_ = 0, uneven_allgather_ = 0;
  std::unordered_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> file_order_;  // class -> order
};

bool ChakraExporter::CreateOutDir() {
  std::error_code ec;
  fs::create_directories(opts_.out_dir, ec);
  if (ec || !fs::is_directory(opts_.out_dir)) {
    *error_ = opts_.out_dir + ": cannot create directory" + (ec ? ": " + ec.message() : "");
    return false;
  }
  const fs::path dir(opts_.out_dir);
  summary_->workload = (dir / opts_.prefix).string();
  summary_->comm_group_path = (dir / opts_.comm_group_file).string();
  return true;
}

// Process-group names: ASTRA-sim parses them as integers and treats "" and "0" as the whole world, so
// communicator k of the trace (array position) is group k + 1.
bool ChakraExporter::WriteCommGroups() {
  json groups = json::object();
  for (size_t c = 0; c < t_.comms.size(); ++c) {
    comm_pos_[t_.comms[c].id] = c;
    groups[std::to_string(c + 1)] = t_.comms[c].ranks;
  }
  {
    std::ofstream out(summary_->comm_group_path);
    out << groups.dump(1) << "\n";
    if (!out) {
      *error_ = summary_->comm_group_path + ": cannot write";
      return false;
    }
  }
  summary_->comm_groups = t_.comms.size();
  return true;
}

bool ChakraExporter::WriteRanks() {
  layout_ = {{"tp", t_.layout.tp}, {"pp", t_.layout.pp}, {"dp", t_.layout.dp}, {"cp", t_.layout.cp},
             {"ep", t_.layout.ep}, {"etp", t_.layout.etp}, {"order", t_.layout.order}};
  for (int32_t r = 0; r < t_.world_size; ++r) {
    if (!WriteRank(r)) return false;
  }
  return true;
}

// One file per rank: its class's nodes in file order, with the rank's communicators.
bool ChakraExporter::WriteRank(int32_t r) {
  const trace::RankBinding& b = t_.ranks[r];
  const trace::RoleClass& cls = t_.classes[b.cls];
  EtFile f;
  f.metadata.set_version(kEtVersion);
  std::vector<size_t> slot_comm(b.comms.size());
  json descs = json::object();
  if (!BindSlots(r, b, cls, &slot_comm, &descs)) return false;
  if (opts_.prism_attrs) AddRankAttrs(cls, descs, &f);
  auto cached = file_order_.find(b.cls);
  if (cached == file_order_.end()) cached = file_order_.emplace(b.cls, FileOrder(cls)).first;
  for (auto [s, k] : cached->second) AddNode(r, cls, slot_comm, s, k, &f);
  summary_->nodes += f.nodes.size();
  const std::string path = summary_->workload + "." + std::to_string(r) + ".et";
  return WriteEtFile(path, f, error_);
}

// Each slot's communicator (its position in t.comms) and the descriptions by group name.
bool ChakraExporter::BindSlots(int32_t r, const trace::RankBinding& b, const trace::RoleClass& cls,
                               std::vector<size_t>* slot_comm, json* descs) {
  for (size_t s = 0; s < b.comms.size(); ++s) {
    auto it = comm_pos_.find(b.comms[s]);
    if (it == comm_pos_.end()) {
      *error_ = "rank " + std::to_string(r) + " binds slot '" + cls.comm_slots[s] + "' to communicator " +
                std::to_string(b.comms[s]) + ", which the trace does not define";
      return false;
    }
    (*slot_comm)[s] = it->second;
    (*descs)[std::to_string(it->second + 1)] = t_.comms[it->second].desc;
  }
  return true;
}

void ChakraExporter::AddRankAttrs(const trace::RoleClass& cls, const json& descs, EtFile* f) {
  auto* m = f->metadata.mutable_attr();
  *m->Add() = MakeStringAttr(kAttrClass, cls.name);
  *m->Add() = MakeStringAttr(kAttrLayout, layout_.dump());
  if (!t_.topology.empty()) *m->Add() = MakeStringAttr(kAttrTopology, t_.topology);
  *m->Add() = MakeStringAttr(kAttrComms, descs.dump());
  if (t_.send_completion != trace::SendCompletion::kInvalid) {
    *m->Add() = MakeStringAttr(kAttrSendCompletion, std::string(trace::ToString(t_.send_completion)));
  }
}

void ChakraExporter::AddNode(int32_t r, const trace::RoleClass& cls, const std::vector<size_t>& slot_comm, uint32_t s,
                             uint32_t k, EtFile* f) {
  const trace::Stream& st = cls.streams[s];
  const trace::Node& n = st.nodes[k];
  const trace::Node* prev = k > 0 ? &st.nodes[k - 1] : nullptr;
  et::Node& c = f->nodes.emplace_back();
  c.set_id(n.id);
  c.set_name(n.name);
  // Stream order becomes a data dependency on the previous node of the stream; `after` edges follow.
  if (prev) c.add_data_deps(prev->id);
  for (uint32_t a : n.after) {
    if (!prev || a != prev->id) c.add_data_deps(a);
  }
  const bool comm = n.kind != NodeKind::kCompute;
  const uint64_t micros = n.dur_us > 0 ? static_cast<uint64_t>(std::llround(n.dur_us)) : 0;
  c.set_duration_micros(micros);
  auto* attrs = c.mutable_attr();
  std::string type_label;
  if (!comm) {
    c.set_type(et::COMP_NODE);
    *attrs->Add() = MakeBoolAttr(kAttrIsCpuOp, st.name == "cpu");
    type_label = "COMP_NODE";
  } else {
    type_label = AddCommAttrs(r, n, slot_comm, c);
  }
  if (opts_.prism_attrs) AddPrismNodeAttrs(cls, st, n, micros, c);
  summary_->by_type[type_label]++;
}

// A communication node's type and attributes; returns its type label for the summary.
std::string ChakraExporter::AddCommAttrs(int32_t r, const trace::Node& n, const std::vector<size_t>& slot_comm,
                                         et::Node& c) {
  auto* attrs = c.mutable_attr();
  std::string type_label;
  const size_t ci = slot_comm.at(n.comm_slot);
  const std::string pg = std::to_string(ci + 1);
  const auto& members = t_.comms[ci].ranks;
  *attrs->Add() = MakeBoolAttr(kAttrIsCpuOp, false);
  if (n.kind == NodeKind::kColl) {
    c.set_type(et::COMM_COLL_NODE);
    const et::CollectiveCommType ct = CommType(n.op);
    *attrs->Add() = MakeIntAttr(kAttrCommType, ct);
    type_label = "COMM_COLL_NODE " + et::CollectiveCommType_Name(ct);
    if (n.op == CollOp::kReduce || n.op == CollOp::kBarrier) ++astra_unsupported_;
  } else {
    const bool send = n.kind == NodeKind::kSend;
    const int32_t peer = members.at(static_cast<size_t>(n.peer));
    c.set_type(send ? et::COMM_SEND_NODE : et::COMM_RECV_NODE);
    *attrs->Add() = MakeInt32Attr(kAttrCommSrc, send ? r : peer);
    *attrs->Add() = MakeInt32Attr(kAttrCommDst, send ? peer : r);
    // Why the group as tag: ASTRA-sim pairs messages in order per (src, dst, tag, size); one tag per
    // communicator gives Prism's rule (in order per communicator, src and dst).
    *attrs->Add() = MakeInt32Attr(kAttrCommTag, static_cast<int32_t>(ci + 1));
    type_label = send ? "COMM_SEND_NODE" : "COMM_RECV_NODE";
    if (n.bytes == 0) ++zero_p2p_;
  }
  // ASTRA-sim reads an all-gather's comm_size as each rank's input (docs/chakra.md, "comm_size").
  uint64_t size = n.bytes;
  if (n.kind == NodeKind::kColl && n.op == CollOp::kAllGather &&
      opts_.allgather_comm_size == AllGatherCommSize::kInput) {
    size = n.bytes / members.size();
    if (size * members.size() != n.bytes) {
      ++uneven_allgather_;
      if (opts_.prism_attrs) *attrs->Add() = MakeIntAttr(kAttrBytes, static_cast<int64_t>(n.bytes));
    }
  }
  *attrs->Add() = MakeIntAttr(kAttrCommSize, static_cast<int64_t>(size));
  *attrs->Add() = MakeStringAttr(kAttrPgName, pg);
  return type_label;
}

// What only import-chakra reads (opts.prism_attrs): what Chakra's own fields do not carry.
void ChakraExporter::AddPrismNodeAttrs(const trace::RoleClass& cls, const trace::Stream& st, const trace::Node& n,
                                       uint64_t micros, et::Node& c) {
  auto* attrs = c.mutable_attr();
  const bool comm = n.kind != NodeKind::kCompute;
  *attrs->Add() = MakeStringAttr(kAttrStream, st.name);
  if (comm) *attrs->Add() = MakeStringAttr(kAttrSlot, cls.comm_slots.at(n.comm_slot));
  if (n.iter != 0) *attrs->Add() = MakeIntAttr(kAttrIter, n.iter);
  if (comm && n.dtype != trace::DType::kU8) {
    *attrs->Add() = MakeStringAttr(kAttrDtype, std::string(trace::ToString(n.dtype)));
  }
  if (n.kind == NodeKind::kColl && (n.op == CollOp::kBroadcast || n.op == CollOp::kReduce)) {
    *attrs->Add() = MakeInt32Attr(kAttrRoot, n.root);
  }
  if (ReadBack(micros, comm) != n.dur_us) *attrs->Add() = MakeDoubleAttr(kAttrDurUs, n.dur_us);
}

void ChakraExporter::AddWarnings() {
  summary_->ranks = t_.world_size;
  if (astra_unsupported_ > 0) {
    summary_->warnings.push_back(std::to_string(astra_unsupported_) +
                                 " REDUCE/BARRIER collective nodes: ASTRA-sim's workload layer stops with "
                                 "\"Unsupported collective comm type\" on these");
  }
  if (uneven_allgather_ > 0) {
    summary_->warnings.push_back(std::to_string(uneven_allgather_) +
                                 " all-gather nodes whose bytes are not a multiple of their communicator's size: "
                                 "comm_size (each rank's input) is rounded down" +
                                 (opts_.prism_attrs ? std::string("; prism_bytes keeps the exact size") : ""));
  }
  if (zero_p2p_ > 0) {
    summary_->warnings.push_back(std::to_string(zero_p2p_) +
                                 " send/recv nodes of 0 bytes: ASTRA-sim's analytical network asserts size > 0");
  }
}

}  // namespace

std::string ExportSummary::Format() const {
  std::ostringstream os;
  os << "ranks: " << ranks << " (" << workload << ".0.et .. " << workload << "." << ranks - 1 << ".et)\n";
  os << "nodes: " << nodes;
  for (const auto& [k, v] : by_type) os << ", " << k << " " << v;
  os << "\ncomm groups: " << comm_groups << " (" << comm_group_path << ")\n";
  os << "ASTRA-sim: --workload-configuration=" << workload << " --comm-group-configuration=" << comm_group_path
     << "\n";
  return os.str();
}

bool ExportChakra(const trace::Trace& t, const ExportOptions& opts, ExportSummary* summary, std::string* error) {
  ExportSummary local;
  if (!summary) summary = &local;
  *summary = ExportSummary{};
  ChakraExporter x(t, opts, summary, error);
  if (!x.CreateOutDir() || !x.WriteCommGroups() || !x.WriteRanks()) return false;
  x.AddWarnings();
  return true;
}

}  // namespace prism::chakra
