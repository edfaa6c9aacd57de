// Communication cost model: how long one NCCL call takes at the target scale.
//
// Two models, selected by the topology ("model" key) or CostModelOptions::model:
//  - kNccl: NCCL's own tuner model (src/graph/tuning.cc of NCCL 2.28.9): per-communicator latency and bandwidth
//    tables for every algorithm (Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT) x protocol (LL,
//    LL128, Simple), built from an emulation of NCCL's channel search over the topology; a call picks the
//    fastest enabled entry, as NCCL does, honouring NCCL_ALGO / NCCL_PROTO.
//  - kAlphaBeta: a plain alpha-beta ring model whose answers can be computed by hand (docs/cost-model.md).
// Send/receive and all-to-all (which NCCL runs as grouped p2p and does not model) use the topology's p2p links.
//
// Shared by the replay engine and the shim: the per-call functions take no locks, allocate nothing, do no I/O
// and never throw. Typical use (once per communicator, then per call):
//   CostModel model;  model.Init(topology, CostModelOptions::FromEnvironment(), &error);
//   CommTuning tuning = model.Tune(model.Shape(ranks, nranks));
//   CommCost cost = model.Collective(tuning, trace::CollOp::kAllReduce, bytes, trace::DType::kBF16);
//   // cost.time_us, cost.Label() == "Ring/Simple"
#pragma once

#include <cstdint>
#include <string>

#include "prism/trace.h"
#include "replay/topology.h"

namespace prism::replay {

// NCCL's indices (NCCL_ALGO_*, NCCL_PROTO_*, ncclFunc_t): the tables below are laid out like NCCL's.
enum class NcclAlgo : int8_t { kTree = 0, kRing, kCollNetDirect, kCollNetChain, kNvls, kNvlsTree, kPat };
enum class NcclProto : int8_t { kLL = 0, kLL128, kSimple };
enum class NcclFunc : int8_t { kBroadcast = 0, kReduce, kAllGather, kReduceScatter, kAllReduce };
inline constexpr int kNumAlgos = 7;
inline constexpr int kNumProtos = 3;
inline constexpr int kNumFuncs = 5;

const char* ToString(NcclAlgo a);    // NCCL's spelling: "Tree", "Ring", "CollNetDirect", ... "PAT"
const char* ToString(NcclProto p);   // "LL", "LL128", "Simple"
const char* ToString(NcclFunc f);    // "Broadcast", ... "AllReduce"

// Which algorithms and protocols NCCL may use per function (NCCL_ALGO / NCCL_PROTO).
struct NcclEnable {
  bool algo[kNumFuncs][kNumAlgos];
  bool proto[kNumFuncs][kNumProtos];
  NcclEnable();
};

// Parses NCCL_ALGO and NCCL_PROTO values with NCCL 2.28's grammar: "Ring,Tree", "^LL128",
// "allreduce:tree,ring;allgather:ring" (case-insensitive). Empty string: unset. False + *error on a token
// NCCL would reject.
bool ParseNcclAlgoProto(const std::string& nccl_algo, const std::string& nccl_proto, NcclEnable* out,
                        std::string* error);

struct CostModelOptions {
  CostModelKind model = CostModelKind::kInvalid;  // kInvalid: the topology's "model"
  std::string nccl_algo;                           // NCCL_ALGO value ("" = unset)
  std::string nccl_proto;                          // NCCL_PROTO value ("" = unset)
  // NCCL_ALGO and NCCL_PROTO from the environment (never called on a hot path).
  static CostModelOptions FromEnvironment();
};

// Where a communicator's members sit: what NCCL's tuner looks at.
struct CommShape {
  int nranks = 1;
  int nnodes = 1;
  int local_ranks = 1;  // most members on one node (NCCL's localRanks / maxLocalRanks)
  bool operator==(const CommShape&) const = default;
};

// NCCL's channel-search result for one algorithm family (ncclTopoGraph: nChannels, bwIntra, bwInter).
struct NcclGraph {
  int channels = 0;
  float bw_intra = 0;  // GB/s per channel
  float bw_inter = 0;
};

// Per-communicator tables (what ncclTopoTuneModel computes at communicator init).
struct CommTuning {
  CommShape shape;
  NcclGraph ring, nvls;     // tree and collnet use the ring graph (docs/cost-model.md)
  int comm_channels = 1;    // comm->nChannels after duplication (used by the ring plateau rule)
  float latency_us[kNumFuncs][kNumAlgos][kNumProtos];
  float bandwidth_GBps[kNumFuncs][kNumAlgos][kNumProtos];  // algorithm bandwidth; 0 = not available
};

enum class CostMethod : uint8_t { kNone = 0, kNccl, kAlphaBeta, kP2P, kRecorded };

struct CommCost {
  double time_us = 0.0;
  CostMethod method = CostMethod::kNone;
  NcclAlgo algo = NcclAlgo::kRing;     // kNccl only
  NcclProto proto = NcclProto::kSimple;
  bool fallback = false;  // NCCL_ALGO/NCCL_PROTO left nothing: NCCL would fail the call; Ring/Simple assumed
  // "Ring/Simple", "alpha-beta", "p2p", "recorded", "none".
  const char* Label() const;
};

class CostModel {
 public:
  // False + *error for a bad NCCL_ALGO/NCCL_PROTO value or a topology the model cannot use.
  bool Init(const Topology& topology, const CostModelOptions& options, std::string* error);

  const Topology& topology() const { return topo_; }
  CostModelKind kind() const { return kind_; }

  // The shape of a communicator whose members are these global ranks (placement from the topology).
  // Allocates (a small node set); call once per communicator.
  CommShape Shape(const int32_t* ranks, size_t nranks) const;

  // NCCL's tables for a communicator of this shape. No allocation, no I/O, never throws.
  CommTuning Tune(const CommShape& shape) const noexcept;

  // One collective (bytes = nccl-tests' S: see docs/trace-format.md). No allocation, no I/O, never throws.
  CommCost Collective(const CommTuning& tuning, trace::CollOp op, uint64_t bytes, trace::DType dtype) const noexcept;

  // One send/receive pair between two global ranks. No allocation, no I/O, never throws.
  CommCost SendRecv(uint64_t bytes, int32_t src_rank, int32_t dst_rank) const noexcept;

  // The largest message a send on a communicator of this shape completes without its receive: NCCL's p2p
  // connection buffer, NCCL_STEPS (8) slots of the p2p chunk size (NCCL 2.28 src/init.cc computeBuffSizes: the
  // net chunk, 128 KiB, when the communicator spans nodes; the NVLink chunk, 512 KiB, on one NVLink node; the
  // PCI chunk, 128 KiB, otherwise): 1 MiB or 4 MiB. One channel's buffer (NCCL may spread a message over more).
  uint64_t SendBufferBytes(const CommShape& shape) const noexcept;

  // For tests and docs: the time NCCL's model gives one algorithm/protocol (negative when unavailable).
  double NcclTime(const CommTuning& tuning, NcclFunc func, NcclAlgo algo, NcclProto proto, uint64_t bytes,
                  trace::DType dtype) const noexcept;

 private:
  CommCost AlphaBeta(const CommShape& shape, trace::CollOp op, uint64_t bytes) const noexcept;
  CommCost AllToAll(const CommShape& shape, uint64_t bytes) const noexcept;
  CommTuning TuneWith(const CommShape& shape, const NcclEnable& enable) const noexcept;
  NcclGraph SearchRing(const CommShape& shape) const noexcept;
  NcclGraph SearchNvls(const CommShape& shape) const noexcept;
  int NicsUsable(int local_ranks) const noexcept;

  Topology topo_;
  CostModelKind kind_ = CostModelKind::kNccl;
  NcclEnable enable_;
  bool amd_cpu_ = false;
};

// nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md): busbw = algbw * factor.
double BusBwFactor(trace::CollOp op, int nranks);

}  // namespace prism::replay
