#include "replay/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "prism/limits.h"

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::DType;
using trace::Node;
using trace::NodeKind;

constexpr uint32_t kNo = trace::kNoIndex;

struct Op {
  bool fwd;
  int chunk;
  int mb;
};

// Megatron-LM's pipeline order for one pipeline rank: warm-up forwards, steady 1F1B, cool-down backwards.
std::vector<Op> Schedule(int p, int s, int v, int m) {
  std::vector<Op> ops;
  if (v == 1) {
    int warm = std::min(p - s - 1, m);
    for (int i = 0; i < warm; ++i) ops.push_back({true, 0, i});
    for (int i = 0; i < m - warm; ++i) {
      ops.push_back({true, 0, warm + i});
      ops.push_back({false, 0, i});
    }
    for (int i = m - warm; i < m; ++i) ops.push_back({false, 0, i});
    return ops;
  }
  // Interleaved: virtual microbatch k runs model chunk (k mod p*v) / p of microbatch (k / p*v) * p + k mod p;
  // backwards walk the chunks in reverse.
  const int total = m * v;
  int warm = std::min((p - s - 1) * 2 + (v - 1) * p, total);
  auto fwd = [&](int k) { return Op{true, (k % (p * v)) / p, (k / (p * v)) * p + k % p}; };
  auto bwd = [&](int k) { return Op{false, v - 1 - (k % (p * v)) / p, (k / (p * v)) * p + k % p}; };
  for (int k = 0; k < warm; ++k) ops.push_back(fwd(k));
  for (int i = 0; i < total - warm; ++i) {
    ops.push_back(fwd(warm + i));
    ops.push_back(bwd(i));
  }
  for (int k = total - warm; k < total; ++k) ops.push_back(bwd(k));
  return ops;
}

struct Sizes {
  int layers_per_chunk = 1;
  double fwd_attn_us = 0, fwd_mlp_us = 0, bwd_attn_us = 0, bwd_mlp_us = 0;  // per layer
  double fwd_us = 0, bwd_us = 0;                                            // per chunk
  uint64_t act_bytes = 0, tp_bytes = 0, a2a_bytes = 0;
  double dense_params_chunk = 0, expert_params_chunk = 0;  // per rank
  uint64_t grad_bytes_chunk = 0, param_bytes_chunk = 0, expert_grad_bytes_chunk = 0, expert_param_bytes_chunk = 0;
  int buckets = 1;
  double optimizer_us = 0;
};

uint64_t RoundUp(double bytes, uint64_t multiple) {
  uint64_t b = static_cast<uint64_t>(std::ceil(std::max(bytes, 0.0)));
  multiple = std::max<uint64_t>(multiple, 1);
  return (b + multiple - 1) / multiple * multiple;
}

// One pipeline stage's graph; copied into the class of every tensor-parallel rank of that stage.
class StageBuilder {
 public:
  StageBuilder(const SynthOptions& o, const Sizes& z, int stage, uint32_t slot_tp, uint32_t slot_pp, uint32_t slot_dp,
               uint32_t slot_ep, uint32_t slot_edp)
      : o_(o), z_(z), s_(stage), slot_tp_(slot_tp), slot_pp_(slot_pp), slot_dp_(slot_dp), slot_ep_(slot_ep),
        slot_edp_(slot_edp) {
    cls_.streams = {{"compute", {}}, {"pp_recv_prev", {}}, {"pp_recv_next", {}}, {"pp_send_next", {}},
                    {"pp_send_prev", {}}, {"dp", {}}};
  }

  trace::RoleClass Build(std::vector<std::string> slots) {
    cls_.comm_slots = std::move(slots);
    std::vector<uint32_t> prev_iter_gate;  // nodes the next iteration's first compute waits for
    for (int it = 0; it < o_.iterations; ++it) {
      iter_ = static_cast<uint32_t>(it);
      prev_iter_gate = Iteration(prev_iter_gate);
    }
    // Drop empty streams (e.g. no pipeline or no data parallelism).
    std::vector<trace::Stream> kept;
    for (auto& st : cls_.streams) {
      if (!st.nodes.empty()) kept.push_back(std::move(st));
    }
    cls_.streams = std::move(kept);
    return std::move(cls_);
  }

 private:
  enum Stream { kCompute = 0, kRecvPrev, kRecvNext, kSendNext, kSendPrev, kDp };

  uint32_t Add(int stream, Node n, std::vector<uint32_t> after = {}) {
    n.id = next_id_++;
    n.iter = iter_;
    // `after` names nodes of other streams only: drop unknowns, duplicates and same-stream predecessors.
    after.erase(std::remove_if(after.begin(), after.end(),
                               [&](uint32_t a) { return a == kNo || stream_of_[a] == stream; }),
                after.end());
    std::sort(after.begin(), after.end());
    after.erase(std::unique(after.begin(), after.end()), after.end());
    stream_of_.push_back(stream);
    n.after = std::move(after);
    cls_.streams[stream].nodes.push_back(std::move(n));
    return cls_.streams[stream].nodes.back().id;
  }
  uint32_t Compute(std::string name, double us, std::vector<uint32_t> after = {}) {
    Node n;
    n.kind = NodeKind::kCompute;
    n.dur_us = us;
    n.name = std::move(name);
    return Add(kCompute, std::move(n), std::move(after));
  }
  uint32_t Coll(int stream, CollOp op, uint32_t slot, uint64_t bytes, DType dt, std::string name,
                std::vector<uint32_t> after = {}) {
    Node n;
    n.kind = NodeKind::kColl;
    n.op = op;
    n.comm_slot = slot;
    n.bytes = bytes;
    n.dtype = dt;
    n.name = std::move(name);
    return Add(stream, std::move(n), std::move(after));
  }
  uint32_t P2P(bool send, int peer_stage, uint64_t bytes, std::string name, std::vector<uint32_t> after, int stream) {
    Node n;
    n.kind = send ? NodeKind::kSend : NodeKind::kRecv;
    n.comm_slot = slot_pp_;
    n.peer = peer_stage;  // the pipeline communicator lists stages in order
    n.bytes = bytes;
    n.dtype = DType::kBF16;
    n.name = std::move(name);
    return Add(stream, std::move(n), std::move(after));
  }

  // Tensor-parallel collectives around one compute piece (sequence parallel: all-gather in, reduce-scatter out;
  // otherwise one all-reduce after).
  void TpIn(const std::string& what, std::vector<uint32_t>* nodes, std::vector<uint32_t>* after) {
    if (slot_tp_ == kNo || !o_.sequence_parallel) return;
    nodes->push_back(Coll(kCompute, CollOp::kAllGather, slot_tp_, z_.tp_bytes, DType::kBF16, "tp ag " + what, *after));
    after->clear();
  }
  void TpOut(const std::string& what, std::vector<uint32_t>* nodes) {
    if (slot_tp_ == kNo) return;
    nodes->push_back(Coll(kCompute, o_.sequence_parallel ? CollOp::kReduceScatter : CollOp::kAllReduce, slot_tp_,
                          z_.tp_bytes, DType::kBF16, (o_.sequence_parallel ? "tp rs " : "tp ar ") + what));
  }

  // The compute of one op (forward or backward of one chunk and microbatch): returns its nodes in order.
  std::vector<uint32_t> OpCompute(const Op& op, const std::string& tag, std::vector<uint32_t> after, int pieces) {
    std::vector<uint32_t> nodes;
    const bool split = slot_tp_ != kNo || slot_ep_ != kNo;
    if (!split) {
      double us = op.fwd ? z_.fwd_us : z_.bwd_us;
      for (int i = 0; i < pieces; ++i) {
        std::string name = tag + (pieces > 1 ? " part" + std::to_string(i) : "");
        nodes.push_back(Compute(name, us / pieces, i == 0 ? after : std::vector<uint32_t>{}));
      }
      return nodes;
    }
    for (int l = 0; l < z_.layers_per_chunk; ++l) {
      std::string L = tag + " L" + std::to_string(l);
      double attn = op.fwd ? z_.fwd_attn_us : z_.bwd_attn_us;
      double mlp = op.fwd ? z_.fwd_mlp_us : z_.bwd_mlp_us;
      // Forward runs attention then MLP; backward the reverse.
      for (int half = 0; half < 2; ++half) {
        bool is_attn = op.fwd ? half == 0 : half == 1;
        std::string what = L + (is_attn ? " attn" : " mlp");
        TpIn(what, &nodes, &after);
        if (!is_attn && slot_ep_ != kNo) {
          nodes.push_back(Coll(kCompute, CollOp::kAllToAll, slot_ep_, z_.a2a_bytes, DType::kBF16, "ep dispatch " + what, after));
          after.clear();
        }
        nodes.push_back(Compute(what, is_attn ? attn : mlp, after));
        after.clear();
        if (!is_attn && slot_ep_ != kNo) {
          nodes.push_back(Coll(kCompute, CollOp::kAllToAll, slot_ep_, z_.a2a_bytes, DType::kBF16, "ep combine " + what));
        }
        TpOut(what, &nodes);
      }
    }
    return nodes;
  }

  // Where an op's pipeline input comes from and where its output goes (-1: nowhere).
  int InputFrom(const Op& op) const {
    const int p = o_.pp, v = o_.vpp;
    if (slot_pp_ == kNo) return -1;
    if (op.fwd) return (s_ == 0 && op.chunk == 0) ? -1 : (s_ - 1 + p) % p;
    return (s_ == p - 1 && op.chunk == v - 1) ? -1 : (s_ + 1) % p;
  }
  int OutputTo(const Op& op) const {
    const int p = o_.pp, v = o_.vpp;
    if (slot_pp_ == kNo) return -1;
    if (op.fwd) return (s_ == p - 1 && op.chunk == v - 1) ? -1 : (s_ + 1) % p;
    return (s_ == 0 && op.chunk == 0) ? -1 : (s_ - 1 + p) % p;
  }
  std::string OpTag(const Op& op) const {
    return std::string(op.fwd ? "fwd" : "bwd") + (o_.vpp > 1 ? " c" + std::to_string(op.chunk) : "") + " mb" +
           std::to_string(op.mb);
  }
  // Forward activations travel to the next stage, gradients to the previous one: one stream per direction, so
  // the two halves of an exchange never queue behind each other.
  uint32_t Recv(const Op& op, std::vector<uint32_t> after) {
    return P2P(false, InputFrom(op), z_.act_bytes, it_ + (op.fwd ? "recv act" : "recv grad") + OpTag(op).substr(3),
               std::move(after), op.fwd ? kRecvPrev : kRecvNext);
  }
  uint32_t Send(const Op& op, std::vector<uint32_t> after) {
    return P2P(true, OutputTo(op), z_.act_bytes, it_ + (op.fwd ? "send act" : "send grad") + OpTag(op).substr(3),
               std::move(after), op.fwd ? kSendNext : kSendPrev);
  }

  // One blocking exchange of Megatron's non-interleaved 1F1B (p2p_communication.py): every op is posted once the
  // previous compute and the previous exchange are done; the next compute waits for all of them.
  void Exchange(const std::vector<Op>& sends, const std::vector<Op>& recvs) {
    std::vector<uint32_t> after = pending_;
    after.push_back(last_compute_);
    std::vector<uint32_t> ops;
    for (const Op& op : sends) {
      if (OutputTo(op) >= 0) ops.push_back(Send(op, after));
    }
    for (const Op& op : recvs) {
      if (InputFrom(op) >= 0) ops.push_back(Recv(op, after));
    }
    if (!ops.empty()) pending_ = ops;
  }

  std::vector<uint32_t> RunCompute(const Op& op, std::vector<uint32_t> after, int pieces) {
    std::vector<uint32_t> nodes = OpCompute(op, it_ + OpTag(op), std::move(after), pieces);
    last_compute_ = nodes.back();
    return nodes;
  }

  std::vector<uint32_t> Iteration(const std::vector<uint32_t>& gate) {
    const int p = o_.pp, v = o_.vpp, m = o_.microbatches;
    const std::vector<Op> ops = Schedule(p, s_, v, m);
    it_ = o_.iterations > 1 ? "it" + std::to_string(iter_) + " " : "";
    // Last backward of each chunk: where its gradient buckets become ready.
    std::vector<int> last_bwd(v, -1);
    for (size_t j = 0; j < ops.size(); ++j) {
      if (!ops[j].fwd) last_bwd[ops[j].chunk] = static_cast<int>(j);
    }
    const bool dp = slot_dp_ != kNo;
    const CollOp grad_op = o_.distributed_optimizer ? CollOp::kReduceScatter : CollOp::kAllReduce;
    const uint64_t bucket_bytes = RoundUp(static_cast<double>(z_.grad_bytes_chunk) / z_.buckets,
                                          static_cast<uint64_t>(o_.dp) * trace::DTypeSize(o_.grad_dtype));
    std::vector<uint32_t> grad_nodes;
    // The iteration starts when the previous one's optimizer step and parameter all-gathers are done.
    pending_ = gate;
    last_compute_ = kNo;
    auto compute = [&](size_t j) {
      const Op& op = ops[j];
      const bool bucket_here = dp && o_.overlap_grad_reduce && !op.fwd && last_bwd[op.chunk] == static_cast<int>(j);
      std::vector<uint32_t> after = pending_;
      pending_.clear();
      if (v > 1 && InputFrom(op) >= 0) after.push_back(recv_of_[j]);
      std::vector<uint32_t> nodes = RunCompute(op, after, bucket_here ? z_.buckets : 1);
      if (bucket_here) {
        // Bucket b is ready once the backward passed its share of the chunk.
        std::vector<uint32_t> computes;
        for (uint32_t id : nodes) {
          if (cls_.streams[kCompute].nodes[FindCompute(id)].kind == NodeKind::kCompute) computes.push_back(id);
        }
        for (int b = 0; b < z_.buckets; ++b) {
          size_t at = std::max<size_t>(1, (b + 1) * computes.size() / z_.buckets) - 1;
          grad_nodes.push_back(Coll(kDp, grad_op, slot_dp_, bucket_bytes, o_.grad_dtype,
                                    it_ + "dp grad c" + std::to_string(op.chunk) + " bucket" + std::to_string(b),
                                    {computes[at]}));
        }
      }
    };
    std::vector<uint32_t> last_sends;
    if (v == 1) {
      // forward_backward_pipelining_without_interleaving.
      const int warm = std::min(p - s_ - 1, m), rem = m - warm;
      size_t j = 0;
      for (int i = 0; i < warm; ++i, ++j) {
        Exchange({}, {ops[j]});  // recv_forward
        compute(j);
        Exchange({ops[j]}, {});  // send_forward
      }
      if (rem > 0) Exchange({}, {ops[j]});  // recv_forward
      for (int i = 0; i < rem; ++i) {
        const size_t f = j, b = j + 1;
        compute(f);
        Exchange({ops[f]}, {ops[b]});  // send_forward_recv_backward
        compute(b);
        if (i == rem - 1) {
          Exchange({ops[b]}, {});  // send_backward
        } else {
          Exchange({ops[b]}, {ops[b + 1]});  // send_backward_recv_forward
        }
        j += 2;
      }
      for (; j < ops.size(); ++j) {
        Exchange({}, {ops[j]});  // recv_backward
        compute(j);
        Exchange({ops[j]}, {});  // send_backward
      }
      last_sends = pending_;
    } else {
      // Interleaved schedule, as Megatron runs it with --overlap-p2p-communication: a receive is posted when the
      // schedule reaches its op, sends do not block, and a compute waits only for its own input.
      recv_of_.assign(ops.size(), kNo);
      uint32_t send_next = kNo, send_prev = kNo;
      for (size_t j = 0; j < ops.size(); ++j) {
        if (InputFrom(ops[j]) >= 0) {
          std::vector<uint32_t> after = {last_compute_};
          if (j == 0) after.insert(after.end(), gate.begin(), gate.end());
          recv_of_[j] = Recv(ops[j], after);
        }
        compute(j);
        if (OutputTo(ops[j]) >= 0) (ops[j].fwd ? send_next : send_prev) = Send(ops[j], {last_compute_});
      }
      last_sends = {send_next, send_prev};
    }
    const uint32_t last_compute = last_compute_;
    // Gradient synchronisation, optimizer step, parameter all-gather.
    if (dp && !o_.overlap_grad_reduce) {
      for (int c = 0; c < v; ++c) {
        for (int b = 0; b < z_.buckets; ++b) {
          grad_nodes.push_back(Coll(kDp, grad_op, slot_dp_, bucket_bytes, o_.grad_dtype,
                                    it_ + "dp grad c" + std::to_string(c) + " bucket" + std::to_string(b), {last_compute}));
        }
      }
    }
    if (slot_edp_ != kNo) {
      for (int c = 0; c < v; ++c) {
        grad_nodes.push_back(Coll(kDp, grad_op, slot_edp_, z_.expert_grad_bytes_chunk, o_.grad_dtype,
                                  it_ + "edp expert grad c" + std::to_string(c), {last_compute}));
      }
    }
    std::vector<uint32_t> opt_after = grad_nodes;
    // The last pipeline messages must be out before the step (Megatron waits for outstanding sends).
    opt_after.insert(opt_after.end(), last_sends.begin(), last_sends.end());
    uint32_t step = Compute(it_ + "optimizer step", z_.optimizer_us, opt_after);
    std::vector<uint32_t> gate_next = {step};
    if (o_.distributed_optimizer) {
      const uint64_t pbytes = RoundUp(static_cast<double>(z_.param_bytes_chunk) / z_.buckets,
                                      static_cast<uint64_t>(o_.dp) * 2);
      if (dp) {
        for (int c = 0; c < v; ++c) {
          for (int b = 0; b < z_.buckets; ++b) {
            gate_next.push_back(Coll(kDp, CollOp::kAllGather, slot_dp_, pbytes, DType::kBF16,
                                     it_ + "dp param c" + std::to_string(c) + " bucket" + std::to_string(b), {step}));
          }
        }
      }
      if (slot_edp_ != kNo) {
        for (int c = 0; c < v; ++c) {
          gate_next.push_back(Coll(kDp, CollOp::kAllGather, slot_edp_, z_.expert_param_bytes_chunk, DType::kBF16,
                                   it_ + "edp expert param c" + std::to_string(c), {step}));
        }
      }
    }
    return gate_next;
  }

  // Position of node `id` in the compute stream (ids there are increasing).
  size_t FindCompute(uint32_t id) const {
    const auto& v = cls_.streams[kCompute].nodes;
    auto it = std::lower_bound(v.begin(), v.end(), id, [](const Node& n, uint32_t x) { return n.id < x; });
    return static_cast<size_t>(it - v.begin());
  }

  const SynthOptions& o_;
  const Sizes& z_;
  int s_;
  uint32_t slot_tp_, slot_pp_, slot_dp_, slot_ep_, slot_edp_;
  trace::RoleClass cls_;
  uint32_t next_id_ = 0;
  uint32_t iter_ = 0;
  std::vector<int> stream_of_;       // node id -> stream
  std::string it_;                   // name prefix of the current iteration
  std::vector<uint32_t> pending_;    // exchange ops the next compute waits for
  uint32_t last_compute_ = kNo;
  std::vector<uint32_t> recv_of_;    // interleaved: op index -> its input receive
};

bool Check(bool ok, const std::string& msg, std::string* error) {
  if (!ok && error) *error = msg;
  return ok;
}


// Synthesize's steps, in its order.
class Synthesis {
 public:
  Synthesis(const SynthOptions& o, std::string* error) : o_(o), error_(error) {}

  // False, with *error, for options out of their bounds or inconsistent.
  bool CheckOptions();
  void ComputeSizes();
  void StartTrace();
  void AddSlots();
  void AddComms();
  void AddClasses();
  trace::Trace TakeTrace() { return std::move(t_); }

 private:
  int32_t RankOf(int ti, int di, int si) const;
  uint32_t Slot(bool used, const char* name);
  void AddComm(uint32_t sl, const char* desc, const std::vector<int32_t>& ranks);

  const SynthOptions& o_;
  std::string* error_;
  int64_t world_ = 0;
  int chunks_ = 0, layers_ = 0;
  Sizes z_;
  bool moe_ = false;
  int edp_ = 0;
  trace::Trace t_;
  std::vector<std::string> slots_;
  uint32_t slot_tp_ = kNo, slot_pp_ = kNo, slot_dp_ = kNo, slot_ep_ = kNo, slot_edp_ = kNo;
  std::vector<std::vector<uint32_t>> comm_of_;  // [slot][rank]
};

bool Synthesis::CheckOptions() {
  auto positive = [&](int v, const char* name) {
    return Check(v >= 1, std::string("--") + name + " must be at least 1 (got " + std::to_string(v) + ")", error_);
  };
  if (!positive(o_.tp, "tp") || !positive(o_.pp, "pp") || !positive(o_.dp, "dp") || !positive(o_.ep, "ep") ||
      !positive(o_.vpp, "vpp") || !positive(o_.microbatches, "microbatches") ||
      !positive(o_.iterations, "iterations") || !positive(o_.hidden, "hidden") || !positive(o_.seq_len, "seq-len") ||
      !positive(o_.micro_batch_size, "micro-batch-size") || !positive(o_.moe_topk, "moe-topk")) {
    return false;
  }
  if (!Check(o_.microbatches <= kSynthMaxMicrobatches,
             "--microbatches " + std::to_string(o_.microbatches) + " is more than " +
                 std::to_string(kSynthMaxMicrobatches), error_) ||
      !Check(o_.iterations <= kSynthMaxIterations,
             "--iterations " + std::to_string(o_.iterations) + " is more than " + std::to_string(kSynthMaxIterations),
             error_)) {
    return false;
  }
  for (auto [name, v] : {std::pair{"fwd-us", o_.fwd_us}, {"bwd-us", o_.bwd_us}, {"optimizer-us", o_.optimizer_us}}) {
    // Why -1 alone: it is the "derive it" default; any other negative, NaN or huge value is a typo.
    if (!(v == -1.0 || (v >= 0 && v <= limits::kMaxDurationUs))) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "--%s %.6g is outside 0..%.0e us", name, v, limits::kMaxDurationUs);
      return Check(false, buf, error_);
    }
  }
  {
    // An upper estimate of one class's nodes (forward + backward per microbatch and chunk, each with its
    // per-layer collectives), refused before anything is allocated.
    const int64_t per_layer = (o_.tp_comm ? 4 : 0) + (o_.ep > 1 ? 4 : 0);
    const int64_t layers_est = o_.layers > 0 ? o_.layers : 32 + o_.pp * o_.vpp;
    const int64_t nodes = static_cast<int64_t>(o_.iterations) * o_.microbatches * o_.vpp * 2 *
                          (4 + per_layer * ((layers_est + o_.pp * o_.vpp - 1) / (o_.pp * o_.vpp)));
    if (!Check(nodes <= kSynthMaxNodesPerClass,
               "the graph would hold about " + std::to_string(nodes) + " nodes per rank (--iterations x "
               "--microbatches x --vpp x layers), more than " + std::to_string(kSynthMaxNodesPerClass),
               error_)) {
      return false;
    }
  }
  world_ = static_cast<int64_t>(o_.tp) * o_.pp * o_.dp;
  if (!Check(world_ <= limits::kMaxWorldSize, "world size tp*pp*dp = " + std::to_string(world_) + " is more than " +
                                                  std::to_string(limits::kMaxWorldSize) + " ranks", error_)) {
    return false;
  }
  if (!Check(o_.dp % o_.ep == 0, "--ep " + std::to_string(o_.ep) + " must divide --dp " + std::to_string(o_.dp),
             error_)) {
    return false;
  }
  if (o_.ep > 1 && !Check(o_.num_experts >= o_.ep && o_.num_experts % o_.ep == 0,
                          "--num-experts " + std::to_string(o_.num_experts) + " must be a multiple of --ep " +
                              std::to_string(o_.ep),
                          error_)) {
    return false;
  }
  if (o_.vpp > 1) {
    if (!Check(o_.pp > 1, "--vpp needs --pp > 1", error_)) return false;
    if (!Check(o_.microbatches % o_.pp == 0, "the interleaved schedule (--vpp > 1) needs --microbatches (" +
                                                 std::to_string(o_.microbatches) + ") to be a multiple of --pp (" +
                                                 std::to_string(o_.pp) + ")", error_)) {
      return false;
    }
  }
  chunks_ = o_.pp * o_.vpp;
  layers_ = o_.layers > 0 ? o_.layers : ((32 + chunks_ - 1) / chunks_) * chunks_;
  if (!Check(layers_ % chunks_ == 0,
             "--layers " + std::to_string(layers_) + " must be a multiple of pp*vpp = " + std::to_string(chunks_),
             error_)) {
    return false;
  }
  if (!Check(o_.tflops > 0, "--tflops must be positive", error_)) return false;
  return true;
}

// Sizes, FLOPs and times.
void Synthesis::ComputeSizes() {
  const double h = o_.hidden, s = o_.seq_len, b = o_.micro_batch_size, tp = o_.tp;
  moe_ = o_.ep > 1;
  z_.layers_per_chunk = layers_ / chunks_;
  const double per_us = o_.tflops * 1e6;  // FLOPs per microsecond
  const double attn_flops = (8 * b * s * h * h + 4 * b * s * s * h) / tp;
  const double mlp_flops = 16 * b * s * h * h * (moe_ ? o_.moe_topk : 1) / tp;
  z_.fwd_attn_us = attn_flops / per_us;
  z_.fwd_mlp_us = mlp_flops / per_us;
  z_.bwd_attn_us = 2 * z_.fwd_attn_us;
  z_.bwd_mlp_us = 2 * z_.fwd_mlp_us;
  if (o_.fwd_us >= 0) {  // scale the per-layer split to the given per-chunk totals
    double f = o_.fwd_us / (z_.layers_per_chunk * (z_.fwd_attn_us + z_.fwd_mlp_us));
    z_.fwd_attn_us *= f;
    z_.fwd_mlp_us *= f;
  }
  double bwd_total = o_.bwd_us >= 0 ? o_.bwd_us : 2 * z_.layers_per_chunk * (z_.fwd_attn_us + z_.fwd_mlp_us);
  {
    double f = bwd_total / (z_.layers_per_chunk * (z_.bwd_attn_us + z_.bwd_mlp_us));
    z_.bwd_attn_us *= f;
    z_.bwd_mlp_us *= f;
  }
  z_.fwd_us = z_.layers_per_chunk * (z_.fwd_attn_us + z_.fwd_mlp_us);
  z_.bwd_us = z_.layers_per_chunk * (z_.bwd_attn_us + z_.bwd_mlp_us);
  const bool sp = o_.sequence_parallel && o_.tp > 1;
  const double tokens_bytes = s * b * h * 2;  // one bf16 activation tensor
  z_.act_bytes = o_.act_bytes > 0 ? o_.act_bytes : static_cast<uint64_t>(tokens_bytes / (sp ? tp : 1));
  z_.tp_bytes = static_cast<uint64_t>(tokens_bytes);
  z_.a2a_bytes = static_cast<uint64_t>(tokens_bytes * o_.moe_topk / (sp ? tp : 1));
  z_.dense_params_chunk = z_.layers_per_chunk * (moe_ ? 4 : 12) * h * h / tp;
  z_.expert_params_chunk =
      moe_ ? z_.layers_per_chunk * (static_cast<double>(o_.num_experts) / o_.ep) * 8 * h * h / tp : 0;
  const int gsize = trace::DTypeSize(o_.grad_dtype);
  z_.grad_bytes_chunk = o_.grad_bytes > 0
                            ? o_.grad_bytes
                            : RoundUp(z_.dense_params_chunk * gsize, static_cast<uint64_t>(o_.dp) * gsize);
  z_.param_bytes_chunk =
      RoundUp(static_cast<double>(z_.grad_bytes_chunk) / gsize * 2, static_cast<uint64_t>(o_.dp) * 2);
  edp_ = o_.dp / o_.ep;
  z_.expert_grad_bytes_chunk = RoundUp(z_.expert_params_chunk * gsize, static_cast<uint64_t>(edp_) * gsize);
  z_.expert_param_bytes_chunk = RoundUp(z_.expert_params_chunk * 2, static_cast<uint64_t>(edp_) * 2);
  z_.buckets = o_.dp_buckets > 0 ? o_.dp_buckets
                                 : std::max(1, static_cast<int>(std::ceil(z_.dense_params_chunk / 40e6)));
  // Adam with a distributed optimizer touches ~24 bytes per local parameter (fp32 param, grad, two moments) at
  // ~3 TB/s of HBM.
  double local_params = (z_.dense_params_chunk + z_.expert_params_chunk) * o_.vpp /
                        (o_.distributed_optimizer ? o_.dp : 1);
  z_.optimizer_us = o_.optimizer_us >= 0 ? o_.optimizer_us : local_params * 24 / 3e12 * 1e6;
}

void Synthesis::StartTrace() {
  t_.world_size = static_cast<int32_t>(world_);
  t_.layout.tp = o_.tp;
  t_.layout.pp = o_.pp;
  t_.layout.dp = o_.dp;
  t_.layout.ep = o_.ep;
  t_.layout.order = "tp-cp-ep-dp-pp";
  t_.topology = o_.topology;
}

int32_t Synthesis::RankOf(int ti, int di, int si) const {
  return static_cast<int32_t>(ti + o_.tp * (di + o_.dp * si));
}

// Which slots exist.
void Synthesis::AddSlots() {
  slot_tp_ = Slot(o_.tp > 1 && o_.tp_comm, "tp");
  slot_pp_ = Slot(o_.pp > 1, "pp");
  slot_dp_ = Slot(o_.dp > 1, "dp");
  slot_ep_ = Slot(moe_, "ep");
  slot_edp_ = Slot(moe_ && edp_ > 1, "edp");
}

uint32_t Synthesis::Slot(bool used, const char* name) {
  if (!used) return kNo;
  slots_.push_back(name);
  return static_cast<uint32_t>(slots_.size() - 1);
}

// Communicators; comm_of[slot][rank].
void Synthesis::AddComms() {
  comm_of_.assign(slots_.size(), std::vector<uint32_t>(world_, kNo));
  if (slot_tp_ != kNo) {
    for (int si = 0; si < o_.pp; ++si) {
      for (int di = 0; di < o_.dp; ++di) {
        std::vector<int32_t> r;
        for (int ti = 0; ti < o_.tp; ++ti) r.push_back(RankOf(ti, di, si));
        AddComm(slot_tp_, "TENSOR_MODEL_PARALLEL", r);
      }
    }
  }
  if (slot_pp_ != kNo) {
    for (int di = 0; di < o_.dp; ++di) {
      for (int ti = 0; ti < o_.tp; ++ti) {
        std::vector<int32_t> r;
        for (int si = 0; si < o_.pp; ++si) r.push_back(RankOf(ti, di, si));
        AddComm(slot_pp_, "PIPELINE_MODEL_PARALLEL", r);
      }
    }
  }
  if (slot_dp_ != kNo) {
    for (int si = 0; si < o_.pp; ++si) {
      for (int ti = 0; ti < o_.tp; ++ti) {
        std::vector<int32_t> r;
        for (int di = 0; di < o_.dp; ++di) r.push_back(RankOf(ti, di, si));
        AddComm(slot_dp_, "DATA_PARALLEL", r);
      }
    }
  }
  if (slot_ep_ != kNo) {  // expert groups: ep consecutive data-parallel ranks (Megatron's tp-ep-dp-pp order)
    for (int si = 0; si < o_.pp; ++si) {
      for (int ti = 0; ti < o_.tp; ++ti) {
        for (int d0 = 0; d0 < o_.dp; d0 += o_.ep) {
          std::vector<int32_t> r;
          for (int e = 0; e < o_.ep; ++e) r.push_back(RankOf(ti, d0 + e, si));
          AddComm(slot_ep_, "EXPERT_MODEL_PARALLEL", r);
        }
      }
    }
  }
  if (slot_edp_ != kNo) {
    for (int si = 0; si < o_.pp; ++si) {
      for (int ti = 0; ti < o_.tp; ++ti) {
        for (int e = 0; e < o_.ep; ++e) {
          std::vector<int32_t> r;
          for (int di = e; di < o_.dp; di += o_.ep) r.push_back(RankOf(ti, di, si));
          AddComm(slot_edp_, "EXPERT_DATA_PARALLEL", r);
        }
      }
    }
  }
}

void Synthesis::AddComm(uint32_t sl, const char* desc, const std::vector<int32_t>& ranks) {
  trace::Comm c;
  c.id = static_cast<uint32_t>(t_.comms.size());
  c.ranks = ranks;
  c.desc = desc;
  for (int32_t r : ranks) comm_of_[sl][r] = c.id;
  t_.comms.push_back(std::move(c));
}

// Classes: one per (tp, pp) position; every tp rank of a stage runs the same nodes.
void Synthesis::AddClasses() {
  t_.classes.reserve(static_cast<size_t>(o_.tp) * o_.pp);
  for (int si = 0; si < o_.pp; ++si) {
    StageBuilder sb(o_, z_, si, slot_tp_, slot_pp_, slot_dp_, slot_ep_, slot_edp_);
    trace::RoleClass stage = sb.Build(slots_);
    for (int ti = 0; ti < o_.tp; ++ti) {
      trace::RoleClass c = stage;
      c.name = "tp" + std::to_string(ti) + "-pp" + std::to_string(si);
      t_.classes.push_back(std::move(c));
    }
  }
  t_.ranks.resize(world_);
  for (int si = 0; si < o_.pp; ++si) {
    for (int di = 0; di < o_.dp; ++di) {
      for (int ti = 0; ti < o_.tp; ++ti) {
        int32_t r = RankOf(ti, di, si);
        trace::RankBinding& rb = t_.ranks[r];
        rb.cls = static_cast<uint32_t>(si * o_.tp + ti);
        for (size_t sl = 0; sl < slots_.size(); ++sl) rb.comms.push_back(comm_of_[sl][r]);
      }
    }
  }
}

}  // namespace

bool Synthesize(const SynthOptions& o, trace::Trace* out, std::string* error) {
  Synthesis s(o, error);
  if (!s.CheckOptions()) return false;
  s.ComputeSizes();
  s.StartTrace();
  s.AddSlots();
  s.AddComms();
  s.AddClasses();
  *out = s.TakeTrace();
  return true;
}

}  // namespace prism::replay
