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
  std::error_code ec;
  fs::create_directories(opts.out_dir, ec);
  if (ec || !fs::is_directory(opts.out_dir)) {
    *error = opts.out_dir + ": cannot create directory" + (ec ? ": " + ec.message() : "");
    return false;
  }
  const fs::path dir(opts.out_dir);
  summary->workload = (dir / opts.prefix).string();
  summary->comm_group_path = (dir / opts.comm_group_file).string();

  // Process-group names: ASTRA-sim parses them as integers and treats "" and "0" as the whole world, so
  // communicator k of the trace (array position) is group k + 1.
  std::unordered_map<uint32_t, size_t> comm_pos;
  json groups = json::object();
  for (size_t c = 0; c < t.comms.size(); ++c) {
    comm_pos[t.comms[c].id] = c;
    groups[std::to_string(c + 1)] = t.comms[c].ranks;
  }
  {
    std::ofstream out(summary->comm_group_path);
    out << groups.dump(1) << "\n";
    if (!out) {
      *error = summary->comm_group_path + ": cannot write";
      return false;
    }
  }
  summary->comm_groups = t.comms.size();

  json layout = {{"tp", t.layout.tp}, {"pp", t.layout.pp}, {"dp", t.layout.dp}, {"cp", t.layout.cp},
                 {"ep", t.layout.ep}, {"etp", t.layout.etp}, {"order", t.layout.order}};
  uint64_t astra_unsupported = 0, zero_p2p = 0, uneven_allgather = 0;
  std::unordered_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> file_order;  // class -> order
  for (int32_t r = 0; r < t.world_size; ++r) {
    const trace::RankBinding& b = t.ranks[r];
    const trace::RoleClass& cls = t.classes[b.cls];
    EtFile f;
    f.metadata.set_version(kEtVersion);
    std::vector<size_t> slot_comm(b.comms.size());
    json descs = json::object();
    for (size_t s = 0; s < b.comms.size(); ++s) {
      auto it = comm_pos.find(b.comms[s]);
      if (it == comm_pos.end()) {
        *error = "rank " + std::to_string(r) + " binds slot '" + cls.comm_slots[s] + "' to communicator " +
                 std::to_string(b.comms[s]) + ", which the trace does not define";
        return false;
      }
      slot_comm[s] = it->second;
      descs[std::to_string(it->second + 1)] = t.comms[it->second].desc;
    }
    if (opts.prism_attrs) {
      auto* m = f.metadata.mutable_attr();
      *m->Add() = MakeStringAttr(kAttrClass, cls.name);
      *m->Add() = MakeStringAttr(kAttrLayout, layout.dump());
      if (!t.topology.empty()) *m->Add() = MakeStringAttr(kAttrTopology, t.topology);
      *m->Add() = MakeStringAttr(kAttrComms, descs.dump());
      if (t.send_completion != trace::SendCompletion::kInvalid) {
        *m->Add() = MakeStringAttr(kAttrSendCompletion, std::string(trace::ToString(t.send_completion)));
      }
    }
    auto cached = file_order.find(b.cls);
    if (cached == file_order.end()) cached = file_order.emplace(b.cls, FileOrder(cls)).first;
    for (auto [s, k] : cached->second) {
      const trace::Stream& st = cls.streams[s];
      const trace::Node& n = st.nodes[k];
      const trace::Node* prev = k > 0 ? &st.nodes[k - 1] : nullptr;
      {
        et::Node& c = f.nodes.emplace_back();
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
          const size_t ci = slot_comm.at(n.comm_slot);
          const std::string pg = std::to_string(ci + 1);
          const auto& members = t.comms[ci].ranks;
          *attrs->Add() = MakeBoolAttr(kAttrIsCpuOp, false);
          if (n.kind == NodeKind::kColl) {
            c.set_type(et::COMM_COLL_NODE);
            const et::CollectiveCommType ct = CommType(n.op);
            *attrs->Add() = MakeIntAttr(kAttrCommType, ct);
            type_label = "COMM_COLL_NODE " + et::CollectiveCommType_Name(ct);
            if (n.op == CollOp::kReduce || n.op == CollOp::kBarrier) ++astra_unsupported;
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
            if (n.bytes == 0) ++zero_p2p;
          }
          // ASTRA-sim reads an all-gather's comm_size as each rank's input (docs/chakra.md, "comm_size").
          uint64_t size = n.bytes;
          if (n.kind == NodeKind::kColl && n.op == CollOp::kAllGather &&
              opts.allgather_comm_size == AllGatherCommSize::kInput) {
            size = n.bytes / members.size();
            if (size * members.size() != n.bytes) {
              ++uneven_allgather;
              if (opts.prism_attrs) *attrs->Add() = MakeIntAttr(kAttrBytes, static_cast<int64_t>(n.bytes));
            }
          }
          *attrs->Add() = MakeIntAttr(kAttrCommSize, static_cast<int64_t>(size));
          *attrs->Add() = MakeStringAttr(kAttrPgName, pg);
        }
        if (opts.prism_attrs) {
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
        summary->by_type[type_label]++;
      }
    }
    summary->nodes += f.nodes.size();
    const std::string path = summary->workload + "." + std::to_string(r) + ".et";
    if (!WriteEtFile(path, f, error)) return false;
  }
  summary->ranks = t.world_size;
  if (astra_unsupported > 0) {
    summary->warnings.push_back(std::to_string(astra_unsupported) +
                                " REDUCE/BARRIER collective nodes: ASTRA-sim's workload layer stops with "
                                "\"Unsupported collective comm type\" on these");
  }
  if (uneven_allgather > 0) {
    summary->warnings.push_back(std::to_string(uneven_allgather) +
                                " all-gather nodes whose bytes are not a multiple of their communicator's size: "
                                "comm_size (each rank's input) is rounded down" +
                                (opts.prism_attrs ? std::string("; prism_bytes keeps the exact size") : ""));
  }
  if (zero_p2p > 0) {
    summary->warnings.push_back(std::to_string(zero_p2p) +
                                " send/recv nodes of 0 bytes: ASTRA-sim's analytical network asserts size > 0");
  }
  return true;
}

}  // namespace prism::chakra
