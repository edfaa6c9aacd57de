#include "interpose/core/cost.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <string>

#include "common/log.h"
#include "interpose/core/config.h"
#include "replay/topology.h"
#include "replay/cost_model.h"

namespace prism::interpose {

struct CommCostState {
  int nranks = 1;
  int nnodes = 1;
  int local_ranks = 1;
  replay::CommTuning tuning;
  bool tuned = false;
  uint64_t id = 0;  // unique for the process's life (OperationCost's memo keys on it, not on the address)
};

namespace {

using payload::OpKind;

struct Model {
  replay::Topology topo;
  bool topo_ok = false;
  replay::CostModel model;
  bool model_ok = false;
  std::string description;
};

Model& TheModel() {
  static Model* m = [] {
    auto* m = new Model();
    std::string error;
    const Config& c = Cfg();
    try {
      if (!c.topology.empty()) {
        m->topo_ok = replay::LoadTopology(c.topology, &m->topo, &error);
        if (!m->topo_ok) Log("interpose")->error("PRISM_TOPOLOGY: {}; using the default topology", error);
      }
      if (!m->topo_ok) {
        m->topo = replay::Topology();
        if (c.gpus_per_node > 0) m->topo.gpus_per_node = c.gpus_per_node;
        m->topo_ok = true;
      }
      m->model_ok = m->model.Init(m->topo, replay::CostModelOptions::FromEnvironment(), &error);
      if (!m->model_ok) Log("interpose")->error("cost model: {}; using the alpha-beta fallback", error);
    } catch (...) {
      m->topo = replay::Topology();
    }
    m->description = m->model_ok ? "cost model over topology '" + m->topo.name + "'" : "alpha-beta fallback";
    if (c.fixed_dur_us >= 0) m->description = "fixed " + std::to_string(c.fixed_dur_us) + " us (PRISM_FIXED_DUR_US)";
    return m;
  }();
  return *m;
}

trace::CollOp ToCollOp(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return trace::CollOp::kAllReduce;
    case OpKind::kAllGather: return trace::CollOp::kAllGather;
    case OpKind::kReduceScatter: return trace::CollOp::kReduceScatter;
    case OpKind::kBroadcast: return trace::CollOp::kBroadcast;
    case OpKind::kReduce: return trace::CollOp::kReduce;
    case OpKind::kAllToAll: return trace::CollOp::kAllToAll;
    case OpKind::kGather: return trace::CollOp::kAllGather;      // NCCL runs it as p2p; same volume at the root
    case OpKind::kScatter: return trace::CollOp::kBroadcast;
    default: return trace::CollOp::kInvalid;
  }
}

// Alpha-beta ring model (FALLBACK, used only where the replay cost model cannot be): per-step latency and per-rank
// link bandwidth of the default topology; nccl-tests' bus-bandwidth factors.
double FallbackUs(const replay::Topology& t, const CommCostState& s, OpKind op, uint64_t bytes) {
  const bool inter = s.nnodes > 1;
  const replay::LinkParams& link = inter ? t.ab_inter : t.ab_intra;
  const double n = std::max(1, s.nranks);
  const double bw = std::max(1e-3, link.bandwidth_GBps) * 1e3;  // bytes per us
  double steps = 0, factor = 0;
  switch (op) {
    case OpKind::kAllReduce: steps = 2 * (n - 1); factor = 2 * (n - 1) / n; break;
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
    case OpKind::kGather:
    case OpKind::kScatter: steps = n - 1; factor = (n - 1) / n; break;
    case OpKind::kBroadcast:
    case OpKind::kReduce: steps = n - 1; factor = 1; break;
    case OpKind::kSend:
    case OpKind::kRecv: {
      const replay::LinkParams& p = inter ? t.p2p_inter : t.p2p_intra;
      return p.latency_us + static_cast<double>(bytes) / (std::max(1e-3, p.bandwidth_GBps) * 1e3);
    }
    default: return 0;
  }
  if (s.nranks <= 1) return 0;
  return steps * link.latency_us + factor * static_cast<double>(bytes) / bw;
}

}  // namespace

std::shared_ptr<CommCostState> MakeCommCost(const std::vector<int32_t>& members, int nranks) {
  static std::atomic<uint64_t> next_id{0};
  auto s = std::make_shared<CommCostState>();
  s->id = next_id.fetch_add(1, std::memory_order_relaxed) + 1;
  Model& m = TheModel();
  s->nranks = std::max(1, nranks);
  const int gpn = std::max(1, m.topo.gpus_per_node);
  if (!members.empty()) {
    std::vector<int> nodes;
    for (int32_t r : members) nodes.push_back(m.topo.NodeOf(r));
    std::sort(nodes.begin(), nodes.end());
    int best = 0, distinct = 0;
    for (size_t i = 0; i < nodes.size();) {
      size_t j = i;
      while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
      best = std::max<int>(best, static_cast<int>(j - i));
      ++distinct;
      i = j;
    }
    s->nnodes = std::max(1, distinct);
    s->local_ranks = std::max(1, best);
  } else {
    s->local_ranks = std::min(s->nranks, gpn);
    s->nnodes = (s->nranks + gpn - 1) / gpn;
  }
  if (m.model_ok) {
    replay::CommShape shape;
    if (!members.empty()) {
      shape = m.model.Shape(members.data(), members.size());
    } else {
      shape.nranks = s->nranks;
      shape.nnodes = s->nnodes;
      shape.local_ranks = s->local_ranks;
    }
    s->tuning = m.model.Tune(shape);
    s->tuned = true;
  }
  return s;
}

int CommChannels(const CommCostState* state) {
  if (state != nullptr && state->tuned) return std::max(state->tuning.ring.channels, state->tuning.comm_channels);
  return 0;
}

uint64_t OperationBytes(OpKind op, uint64_t count, payload::DataType dtype, int nranks) {
  const uint64_t b = count * payload::DataTypeSize(dtype);
  const uint64_t n = static_cast<uint64_t>(std::max(1, nranks));
  switch (op) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
    case OpKind::kGather:
    case OpKind::kScatter: return b * n;
    default: return b;
  }
}

namespace {

// The last costs a thread computed, direct-mapped by their arguments: a training step repeats the same operations
// (communicator, kind, size) every iteration, and the model's evaluation (NCCL's tuning tables over algorithms and
// protocols) cost a unit about a microsecond of its host time. The model and a communicator's tables never change
// after they are built, so an entry stays right for the life of the process.
struct CostMemo {
  uint64_t state_id = 0;  // 0: empty
  uint64_t bytes = 0;
  int32_t self = 0, peer = 0;
  uint8_t op = 0, dtype = 0;
  OpCost cost;
};
constexpr uint32_t kCostMemoSize = 64;  // power of two; 3 KiB of every thread's static TLS
thread_local CostMemo t_cost_memo[kCostMemoSize];
std::atomic<uint64_t> g_model_evaluations{0};

CostMemo& MemoSlot(uint64_t id, OpKind op, uint64_t bytes, payload::DataType dtype, int32_t self, int32_t peer) {
  uint64_t h = id * 0x9E3779B97F4A7C15ull ^ bytes * 0xC2B2AE3D27D4EB4Full;
  h ^= (static_cast<uint64_t>(op) << 8 | static_cast<uint64_t>(dtype)) * 0x165667B19E3779F9ull;
  h ^= (static_cast<uint64_t>(static_cast<uint32_t>(self)) << 32 | static_cast<uint32_t>(peer)) * 0x27D4EB2F165667C5ull;
  return t_cost_memo[(h >> 40) & (kCostMemoSize - 1)];
}

OpCost ModelCost(const CommCostState* state, OpKind op, uint64_t bytes, payload::DataType dtype, int32_t self,
                 int32_t peer) {
  g_model_evaluations.fetch_add(1, std::memory_order_relaxed);
  OpCost c;
  Model& m = TheModel();
  CommCostState fallback_state;
  const CommCostState& s = state != nullptr ? *state : fallback_state;
  if (m.model_ok) {
    replay::CommCost cc;
    if (op == OpKind::kSend || op == OpKind::kRecv) {
      // Unknown global peer: assume the neighbour (same node), NCCL's usual pipeline placement within a node.
      const int32_t me = self >= 0 ? self : 0;
      cc = m.model.SendRecv(bytes, me, peer >= 0 ? peer : me + 1);
    } else if (s.tuned) {
      cc = m.model.Collective(s.tuning, ToCollOp(op), bytes, TraceDTypeOf(dtype));
    } else {
      goto fallback;
    }
    c.dur_ns = static_cast<uint64_t>(std::max(0.0, cc.time_us) * 1000.0);
    c.source = CostSource::kModel;
    if (cc.method == replay::CostMethod::kNccl) {
      c.algo = static_cast<uint8_t>(static_cast<int>(cc.algo) + 1);
      c.proto = static_cast<uint8_t>(static_cast<int>(cc.proto) + 1);
    }
    return c;
  }
fallback:
  c.dur_ns = static_cast<uint64_t>(FallbackUs(m.topo, s, op, bytes) * 1000.0);
  c.source = CostSource::kFallback;
  return c;
}

}  // namespace

OpCost OperationCost(const CommCostState* state, OpKind op, uint64_t bytes, payload::DataType dtype, int32_t self,
                     int32_t peer) {
  OpCost c;
  const Config& cfg = Cfg();
  if (cfg.fixed_dur_us >= 0) {
    c.dur_ns = static_cast<uint64_t>(std::llround(cfg.fixed_dur_us * 1000.0));
    c.source = CostSource::kFixed;
    return c;
  }
  if (state == nullptr) return ModelCost(state, op, bytes, dtype, self, peer);
  CostMemo& m = MemoSlot(state->id, op, bytes, dtype, self, peer);
  if (m.state_id == state->id && m.bytes == bytes && m.op == static_cast<uint8_t>(op) &&
      m.dtype == static_cast<uint8_t>(dtype) && m.self == self && m.peer == peer)
    return m.cost;
  c = ModelCost(state, op, bytes, dtype, self, peer);
  m = CostMemo{state->id, bytes, self, peer, static_cast<uint8_t>(op), static_cast<uint8_t>(dtype), c};
  return c;
}

const char* CostModelDescription() { return TheModel().description.c_str(); }

uint64_t CostModelEvaluations() { return g_model_evaluations.load(std::memory_order_relaxed); }

trace::DType TraceDTypeOf(payload::DataType t) {
  using payload::DataType;
  switch (t) {
    case DataType::kInt8: return trace::DType::kI8;
    case DataType::kUint8: return trace::DType::kU8;
    case DataType::kInt32: return trace::DType::kI32;
    case DataType::kUint32: return trace::DType::kU32;
    case DataType::kInt64: return trace::DType::kI64;
    case DataType::kUint64: return trace::DType::kU64;
    case DataType::kFloat16: return trace::DType::kF16;
    case DataType::kFloat32: return trace::DType::kF32;
    case DataType::kFloat64: return trace::DType::kF64;
    case DataType::kBfloat16: return trace::DType::kBF16;
    case DataType::kFloat8e4m3: return trace::DType::kF8E4M3;
    case DataType::kFloat8e5m2: return trace::DType::kF8E5M2;
  }
  return trace::DType::kInvalid;
}

}  // namespace prism::interpose
