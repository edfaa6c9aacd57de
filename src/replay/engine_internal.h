// The replay engine's state and plan (Simulator::Impl), shared by the files the engine is split into; engine.h
// says what the engine does. Not an interface: only these files include it.
//   engine.cc           the simulation: the ready-list walk and the matching of collectives and messages (the hot
//                       loop), Run and the symmetric fast path
//   engine_plan.cc      the plan: role classes flattened, ranks bound to communicators, the graph's checks
//   engine_diagnose.cc  a graph that cannot finish: the wait-for chain, a message nobody receives
//   engine_results.cc   a finished run: SimResult, the critical path, Chrome trace events
// Why the helpers defined in the class stay here: the hot loop inlines them, and the other files use them too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/engine.h"
#include "replay/symmetric.h"

namespace prism::replay {
namespace internal {

using trace::CollOp;
using trace::DType;
using trace::Node;
using trace::NodeKind;

constexpr uint32_t kNone = trace::kNoIndex;

// A node as the engine walks it: the fields it needs, packed, in stream order.
struct FlatNode {
  NodeKind kind = NodeKind::kInvalid;
  CollOp op = CollOp::kInvalid;
  DType dtype = DType::kInvalid;
  uint32_t stream = 0;
  uint32_t slot = kNone;
  int32_t peer = -1;
  int32_t root = -1;
  uint32_t seq = 0;       // coll: index among the slot's collectives; p2p: among (slot, peer, direction)
  uint32_t iter_idx = 0;  // index into SimResult::iteration_ids
  uint64_t bytes = 0;
  double dur_us = -1.0;
  const Node* src = nullptr;
};

struct ClassPlan {
  const trace::RoleClass* cls = nullptr;
  std::vector<FlatNode> nodes;
  std::vector<uint32_t> stream_begin;           // nstreams + 1 offsets into nodes
  std::vector<uint32_t> after_off, after_idx;   // node -> flat nodes it waits for
  std::vector<uint32_t> wake_off, wake_stream;  // node -> streams that wait for it (to retry when it finishes)
  std::vector<std::vector<uint32_t>> slot_colls;  // slot -> its collectives (flat), in sequence order
  std::vector<uint8_t> slot_used;
  uint32_t nstreams() const { return static_cast<uint32_t>(stream_begin.size() - 1); }
};

struct PendingColl {
  uint32_t arrived = 0;
  int32_t first_rank = -1;
  uint32_t first_flat = 0;
  int32_t last_rank = -1;  // the member that arrived last (the one everybody waited for)
  double max_arrival = 0.0;
};

struct P2PKey {
  uint32_t comm;
  int32_t src, dst;
  uint32_t seq;
  bool operator==(const P2PKey&) const = default;
};
struct P2PKeyHash {
  size_t operator()(const P2PKey& k) const {
    uint64_t h = k.comm * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(static_cast<uint32_t>(k.src)) << 32 | static_cast<uint32_t>(k.dst)) + 0x7F4A7C15 +
         (h << 6) + (h >> 2);
    h ^= k.seq * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};
struct PendingP2P {
  int32_t rank;
  uint32_t flat;
  double arrival;
  double ready = -1.0;  // an eager send that completed first: when its data is at the receiver
};

struct CostKey {
  uint32_t shape;
  CollOp op;
  DType dtype;
  uint64_t bytes;
  bool operator==(const CostKey&) const = default;
};
struct CostKeyHash {
  size_t operator()(const CostKey& k) const {
    uint64_t h = k.bytes * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(k.shape) << 16 | static_cast<uint64_t>(k.op) << 8 | static_cast<uint64_t>(k.dtype)) +
         (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// Labels counted per communicator: NCCL's 21 algorithm/protocol pairs, then alpha-beta, p2p, recorded.
constexpr int kLabelCount = kNumAlgos * kNumProtos + 3;

struct CommStats {
  uint64_t calls = 0, bytes = 0;
  double time_us = 0.0, wait_us = 0.0;
  uint64_t label_calls[kLabelCount] = {};
  double label_time[kLabelCount] = {};
};

inline std::string NodeLabel(const FlatNode& n) {
  std::string s = "node " + std::to_string(n.src->id);
  if (!n.src->name.empty()) s += " '" + n.src->name + "'";
  return s;
}

}  // namespace internal

struct Simulator::Impl {
  using FlatNode = internal::FlatNode;
  using ClassPlan = internal::ClassPlan;
  using PendingColl = internal::PendingColl;
  using P2PKey = internal::P2PKey;
  using PendingP2P = internal::PendingP2P;
  using CostKey = internal::CostKey;
  using CommStats = internal::CommStats;
  static constexpr uint32_t kNone = internal::kNone;

  const trace::Trace& t;
  const CostModel& model;
  EngineOptions opt;
  // The role classes (the fast path's replica graph reads the original graph's in place).
  const std::vector<trace::RoleClass>& tclasses;

  // Plan (shared by ranks of a class).
  std::vector<ClassPlan> classes;
  std::vector<uint32_t> iter_values;
  std::unordered_map<uint32_t, uint32_t> comm_index;  // comm id -> index in t.comms
  // Per rank.
  std::vector<uint32_t> r_cls;
  std::vector<uint64_t> r_node_off;
  std::vector<uint32_t> r_stream_off;
  std::vector<uint32_t> r_slot_off;
  std::vector<uint32_t> slot_comm;      // (rank, slot) -> comm index (kNone: unbound)
  std::vector<int32_t> slot_commrank;   // (rank, slot) -> position in that comm (-1: not a member)
  std::vector<float> compute_scale;     // per rank (empty: all 1)
  // Per comm.
  std::vector<uint32_t> comm_shape;     // comm index -> shape id
  std::vector<CommShape> shapes;
  std::vector<CommTuning> tunings;      // per shape
  std::vector<CommTuning> base_tunings; // per shape, baseline model (what-if scaling of recorded durations)
  std::vector<uint64_t> inst_base;
  std::vector<uint32_t> inst_count;
  std::vector<CommStats> comm_stats;

  // State.
  std::vector<double> finish;    // per (rank, node); < 0: not finished
  std::vector<uint32_t> cursor;  // per (rank, stream): flat index of its next node
  std::vector<uint8_t> posted;   // per (rank, stream): its head node waits for a match
  std::vector<uint8_t> queued;
  std::vector<uint64_t> work;    // (rank << 32) | stream
  std::vector<PendingColl> pending;
  std::unordered_map<P2PKey, PendingP2P, internal::P2PKeyHash> p2p;
  std::unordered_map<CostKey, CommCost, internal::CostKeyHash> cost_cache;
  std::vector<double> wait_slot;                        // per (rank, slot), us
  std::vector<std::vector<std::pair<int32_t, double>>> waited_on;  // per rank: (rank, us)
  uint64_t events = 0, total_events = 0, next_progress = 0;
  bool ran = false;

  SimResult res;

  // Symmetric fast path: the fold and the engine that replays replica 0 (null: the full replay ran).
  std::unique_ptr<ReplicaFold> fold;
  std::unique_ptr<Impl> replica;

  trace::SendCompletion send_mode;

  Impl(const trace::Trace& tr, const CostModel& m, EngineOptions o, const std::vector<trace::RoleClass>* cls = nullptr)
      : t(tr), model(m), opt(std::move(o)), tclasses(cls ? *cls : tr.classes),
        send_mode(EffectiveSendCompletion(opt, tr)) {}

  bool Fail(SimResult::Status st, std::string msg) {
    if (res.status == SimResult::Status::kOk) {
      res.status = st;
      res.error = std::move(msg);
    }
    return false;
  }

  // ---- Plan (engine_plan.cc) -----------------------------------------------------------------------------

  bool BuildClass(uint32_t ci, ClassPlan* cp);
  bool Plan();

  // The slot of `rank` bound to communicator index `comm` (kNone: none).
  uint32_t SlotOf(int32_t rank, uint32_t comm) const {
    for (uint32_t s = r_slot_off[rank]; s < r_slot_off[rank + 1]; ++s) {
      if (slot_comm[s] == comm) return s - r_slot_off[rank];
    }
    return kNone;
  }

  // ---- Simulation (engine.cc) ----------------------------------------------------------------------------

  void Push(int32_t rank, uint32_t stream);

  // When the node's inputs were ready: its stream predecessor and its `after` nodes finished. pred: the node
  // that set it (kNone: none, the node could start at 0).
  double Arrival(int32_t rank, uint32_t flat, uint32_t* pred = nullptr) const {
    const ClassPlan& cp = classes[r_cls[rank]];
    const double* fin = finish.data() + r_node_off[rank];
    double arr = 0.0;
    uint32_t p = kNone;
    const FlatNode& n = cp.nodes[flat];
    if (flat > cp.stream_begin[n.stream]) {
      arr = fin[flat - 1];
      p = flat - 1;
    }
    for (uint32_t i = cp.after_off[flat]; i < cp.after_off[flat + 1]; ++i) {
      uint32_t a = cp.after_idx[i];
      if (p == kNone || fin[a] > arr) {
        p = a;
        arr = std::max(arr, fin[a]);
      }
    }
    if (pred) *pred = p;
    return arr;
  }

  void Finished(int32_t rank, uint32_t flat, double end);
  void CompleteMember(int32_t rank, uint32_t flat, double end);
  void AddWait(int32_t rank, uint32_t slot, int32_t on, double us);
  const CommCost& ModelCost(uint32_t comm, trace::CollOp op, trace::DType dtype, uint64_t bytes);
  double Rescaled(double recorded_us, double model_now_us, double model_base_us) const;
  bool PostColl(int32_t rank, uint32_t flat, double arrival);
  bool PostP2P(int32_t rank, uint32_t flat, double arrival);

  // Whether a message on this communicator completes eagerly (its send does not wait for the receive).
  bool Eager(uint32_t comm, uint64_t bytes) const {
    switch (send_mode) {
      case trace::SendCompletion::kEager: return true;
      case trace::SendCompletion::kNccl: return bytes <= model.SendBufferBytes(shapes[comm_shape[comm]]);
      default: return false;
    }
  }

  double P2PDuration(int32_t src, int32_t dst, uint64_t bytes, double recorded, CommCost* cost) const;
  void CountP2P(uint32_t comm, uint64_t bytes, double dur, const CommCost& cost);
  bool Advance(int32_t rank, uint32_t stream);
  void Simulate();
  SimResult Run();
  bool RunFolded(std::string* why);

  // ---- Deadlock diagnosis (engine_diagnose.cc) -----------------------------------------------------------

  std::string Where(int32_t rank, uint32_t flat) const;
  std::string CommName(uint32_t comm) const;
  struct Hop {
    int32_t rank = -1;
    uint32_t stream = 0;
  };
  bool WaitsFor(int32_t rank, uint32_t stream, std::string* line, Hop* next) const;
  void DiagnoseDeadlock();
  void ReportUnreceived();

  // ---- Results (engine_results.cc) -----------------------------------------------------------------------

  void Collect();
  void BuildCriticalPath();
  void AppendRankTrace(nlohmann::json& events, int32_t r, int32_t pid, const Impl* global) const;
  nlohmann::json ChromeTrace(const std::vector<int32_t>& ranks) const;
};

}  // namespace prism::replay
