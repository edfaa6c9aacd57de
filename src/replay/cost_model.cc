#include "replay/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <strings.h>
#include <vector>

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::DType;

// ---- NCCL 2.28.9 tables (src/graph/tuning.cc, ncclTunerConstantsDefaults; src/graph/search.cc speeds).
// Latencies in us, bandwidths in GB/s. Rows: Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT;
// columns: LL, LL128, Simple.
constexpr float kBaseLat[kNumAlgos][kNumProtos] = {
    {6.8f, 14.0f, 8.4f}, {6.6f, 14.0f, 8.4f}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {8.0f, 8.0f, 8.0f}};
constexpr int kHwNvlink = 0, kHwPci = 1, kHwNet = 2;
constexpr float kHwLat[3][kNumAlgos][kNumProtos] = {
    // NVLink
    {{.6f, 1.25f, 4.0f}, {.6f, 1.9f, 3.4f}, {0, 0, 3.7f}, {0, 0, 2.8f}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0f}},
    // PCI
    {{1.0f, 1.9f, 4.0f}, {1.0f, 2.5f, 5.7f}, {0, 0, 3.7f}, {0, 0, 2.8f}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0f}},
    // Network
    {{5.0f, 8.5f, 14}, {2.7f, 4.0f, 14.0f}, {0, 0, 31}, {0, 0, 30}, {0, 0, 18}, {0, 0, 20.9f}, {0, 0, 14}},
};
// [compute-capability index: Volta, Ampere, Hopper, Blackwell][nodes index: 1, 2, 3+].
constexpr double kLlMaxBw[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {2 * 141.0, 2 * 45.0, 2 * 35.0}};
constexpr double kPerChMaxRingLL128Bw[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {2 * 36.7, 34.6, 2 * 36.7}};
constexpr double kPerChMaxTreeLL128Bw[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double kPerChMaxTreeBw[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};
constexpr double kPerChMaxNvlsTreeBw[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0.0, 57.7, 45.5}, {0.0, 96.0, 43.8}};
constexpr float kNvlsEfficiency[4] = {0.0f, 0.0f, 0.85f, 0.74f};
// Tree AllReduce correction per power-of-two size, 64 B .. 256 MB (ncclTopoGetAlgoTime).
constexpr float kTreeCorrection[kNumProtos][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};
// Channel-search speeds (search.cc): tried from the top down.
constexpr float kSpeedIntra[] = {40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0};
constexpr float kSpeedInter[] = {48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                 7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
constexpr float kSm90SpeedIntra[] = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
constexpr float kSm90SpeedInter[] = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                                     15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
constexpr float kSm100SpeedIntra[] = {90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0};
constexpr float kSm100SpeedInter[] = {96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0,
                                      17.5, 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
constexpr int kMaxSearchChannels = 32;  // MAXCHANNELS / 2
constexpr int kMaxChannels = 64;        // MAXCHANNELS
constexpr int kMaxNvlsArity = 32;       // NCCL_MAX_NVLS_ARITY
constexpr int kMaxDirectArity = 7;      // NCCL_MAX_DIRECT_ARITY

const char* const kAlgoNames[kNumAlgos] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
const char* const kProtoNames[kNumProtos] = {"LL", "LL128", "Simple"};
const char* const kFuncNames[kNumFuncs] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
// Labels "Algo/Proto" for CommCost::Label without allocation.
const char* const kLabels[kNumAlgos][kNumProtos] = {
    {"Tree/LL", "Tree/LL128", "Tree/Simple"},
    {"Ring/LL", "Ring/LL128", "Ring/Simple"},
    {"CollNetDirect/LL", "CollNetDirect/LL128", "CollNetDirect/Simple"},
    {"CollNetChain/LL", "CollNetChain/LL128", "CollNetChain/Simple"},
    {"NVLS/LL", "NVLS/LL128", "NVLS/Simple"},
    {"NVLSTree/LL", "NVLSTree/LL128", "NVLSTree/Simple"},
    {"PAT/LL", "PAT/LL128", "PAT/Simple"}};

constexpr int A(NcclAlgo a) { return static_cast<int>(a); }
constexpr int P(NcclProto p) { return static_cast<int>(p); }
constexpr int F(NcclFunc f) { return static_cast<int>(f); }
constexpr int kTree = A(NcclAlgo::kTree), kRing = A(NcclAlgo::kRing), kCnd = A(NcclAlgo::kCollNetDirect),
              kCnc = A(NcclAlgo::kCollNetChain), kNvls = A(NcclAlgo::kNvls), kNvlsTree = A(NcclAlgo::kNvlsTree),
              kPat = A(NcclAlgo::kPat);
constexpr int kLL = P(NcclProto::kLL), kLL128 = P(NcclProto::kLL128), kSimple = P(NcclProto::kSimple);
constexpr int kBcast = F(NcclFunc::kBroadcast), kReduce = F(NcclFunc::kReduce), kAllGather = F(NcclFunc::kAllGather),
              kReduceScatter = F(NcclFunc::kReduceScatter), kAllReduce = F(NcclFunc::kAllReduce);

int Log2i(long long n) {
  if (n <= 0) return -1;
  int r = 0;
  while (n >>= 1) ++r;
  return r;
}

int CompCapIndex(int cc) { return cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0; }

struct Speeds {
  const float* v;
  int n;
};
Speeds SpeedArray(int cc, bool inter) {
  if (cc >= 100) return inter ? Speeds{kSm100SpeedInter, 18} : Speeds{kSm100SpeedIntra, 11};
  if (cc >= 90) return inter ? Speeds{kSm90SpeedInter, 17} : Speeds{kSm90SpeedIntra, 11};
  return inter ? Speeds{kSpeedInter, 19} : Speeds{kSpeedIntra, 13};
}

int FuncOf(CollOp op) {
  switch (op) {
    case CollOp::kBroadcast: return kBcast;
    case CollOp::kReduce: return kReduce;
    case CollOp::kAllGather: return kAllGather;
    case CollOp::kReduceScatter: return kReduceScatter;
    case CollOp::kAllReduce:
    case CollOp::kBarrier: return kAllReduce;  // Why: torch's barrier is an all-reduce of one element
    default: return -1;
  }
}

// NVLS reductions exist for these types only (ncclNvlsSupported); all-gather needs no reduction.
bool NvlsReduceSupported(DType t) {
  switch (t) {
    case DType::kI32: case DType::kU32: case DType::kI64: case DType::kU64:
    case DType::kF16: case DType::kBF16: case DType::kF32: case DType::kF64: return true;
    default: return false;
  }
}

bool IsFp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

// One NCCL_ALGO/NCCL_PROTO list against `names`, with NCCL 2.28's "func:list;func:list" prefixes.
bool ParseList(const std::string& str, const char* const* names, int nnames, bool* table /* [kNumFuncs][nnames] */,
               const char* var, std::string* error) {
  if (str.empty()) return true;
  size_t pos = 0;
  bool first = true;
  while (pos <= str.size()) {
    size_t end = str.find(';', pos);
    std::string full = str.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? str.size() + 1 : end + 1;
    if (full.empty()) continue;
    std::string prefix, list;
    size_t colon = full.find(':');
    if (colon == std::string::npos) {
      if (!first) {
        *error = std::string(var) + "=\"" + str + "\": every entry except the first must have a function prefix";
        return false;
      }
      list = full;
    } else {
      prefix = full.substr(0, colon);
      list = full.substr(colon + 1);
    }
    first = false;
    bool unset = false, set = true;
    if (!list.empty() && list[0] == '^') {
      unset = true;
      set = false;
      list.erase(0, 1);
    }
    bool found_prefix = false;
    for (int f = 0; f < kNumFuncs; ++f) {
      if (!prefix.empty() && strcasecmp(prefix.c_str(), kFuncNames[f]) != 0) continue;
      found_prefix = true;
      for (int e = 0; e < nnames; ++e) table[f * nnames + e] = unset;
      size_t p = 0;
      while (p <= list.size()) {
        size_t comma = list.find(',', p);
        std::string tok = list.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
        p = comma == std::string::npos ? list.size() + 1 : comma + 1;
        if (tok.empty()) continue;
        int e = 0;
        for (; e < nnames; ++e) {
          if (strcasecmp(tok.c_str(), names[e]) == 0) {
            table[f * nnames + e] = set;
            break;
          }
        }
        if (e == nnames) {
          std::string known;
          for (int k = 0; k < nnames; ++k) known += std::string(k ? ", " : "") + names[k];
          *error = std::string(var) + "=\"" + str + "\": unknown element \"" + tok + "\" (known: " + known + ")";
          return false;
        }
      }
    }
    if (!found_prefix) {
      *error = std::string(var) + "=\"" + str + "\": unknown function prefix \"" + prefix +
               "\" (known: Broadcast, Reduce, AllGather, ReduceScatter, AllReduce)";
      return false;
    }
  }
  return true;
}

}  // namespace

const char* ToString(NcclAlgo a) {
  int i = A(a);
  return i >= 0 && i < kNumAlgos ? kAlgoNames[i] : "invalid";
}
const char* ToString(NcclProto p) {
  int i = P(p);
  return i >= 0 && i < kNumProtos ? kProtoNames[i] : "invalid";
}
const char* ToString(NcclFunc f) {
  int i = F(f);
  return i >= 0 && i < kNumFuncs ? kFuncNames[i] : "invalid";
}

NcclEnable::NcclEnable() {
  for (auto& row : algo) std::fill(std::begin(row), std::end(row), true);
  for (auto& row : proto) std::fill(std::begin(row), std::end(row), true);
}

bool ParseNcclAlgoProto(const std::string& nccl_algo, const std::string& nccl_proto, NcclEnable* out,
                        std::string* error) {
  NcclEnable e;
  std::string err;
  if (!ParseList(nccl_algo, kAlgoNames, kNumAlgos, &e.algo[0][0], "NCCL_ALGO", &err) ||
      !ParseList(nccl_proto, kProtoNames, kNumProtos, &e.proto[0][0], "NCCL_PROTO", &err)) {
    if (error) *error = err;
    return false;
  }
  *out = e;
  return true;
}

CostModelOptions CostModelOptions::FromEnvironment() {
  CostModelOptions o;
  if (const char* a = std::getenv("NCCL_ALGO")) o.nccl_algo = a;
  if (const char* p = std::getenv("NCCL_PROTO")) o.nccl_proto = p;
  return o;
}

const char* CommCost::Label() const {
  switch (method) {
    case CostMethod::kNccl: {
      int a = A(algo), p = P(proto);
      return a >= 0 && a < kNumAlgos && p >= 0 && p < kNumProtos ? kLabels[a][p] : "invalid";
    }
    case CostMethod::kAlphaBeta: return "alpha-beta";
    case CostMethod::kP2P: return "p2p";
    case CostMethod::kRecorded: return "recorded";
    default: return "none";
  }
}

bool CostModel::Init(const Topology& topology, const CostModelOptions& options, std::string* error) {
  if (topology.gpus_per_node < 1) {
    if (error) *error = "topology " + topology.name + ": gpus_per_node must be at least 1";
    return false;
  }
  NcclEnable enable;
  if (!ParseNcclAlgoProto(options.nccl_algo, options.nccl_proto, &enable, error)) return false;
  topo_ = topology;
  enable_ = enable;
  kind_ = options.model != CostModelKind::kInvalid ? options.model : topology.model;
  amd_cpu_ = topology.cpu_vendor == "amd";
  return true;
}

CommShape CostModel::Shape(const int32_t* ranks, size_t nranks) const {
  CommShape s;
  s.nranks = static_cast<int>(std::max<size_t>(nranks, 1));
  std::vector<int> nodes;
  nodes.reserve(nranks);
  for (size_t i = 0; i < nranks; ++i) nodes.push_back(topo_.NodeOf(ranks[i]));
  std::sort(nodes.begin(), nodes.end());
  int distinct = 0, run = 0, most = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == 0 || nodes[i] != nodes[i - 1]) {
      ++distinct;
      run = 0;
    }
    most = std::max(most, ++run);
  }
  s.nnodes = std::max(distinct, 1);
  s.local_ranks = std::max(most, 1);
  return s;
}

int CostModel::NicsUsable(int local_ranks) const noexcept {
  // Why: on a rail-optimized node each GPU has nics_per_node / gpus_per_node NICs of its own; a communicator
  // with k GPUs on the node reaches k times that many (NCCL picks the closest NICs first).
  int nics = topo_.nics_per_node;
  int g = std::max(topo_.gpus_per_node, 1);
  int usable = (local_ranks * nics + g - 1) / g;
  return std::clamp(usable, 1, std::max(nics, 1));
}

// Emulates ncclTopoCompute for the ring pattern (tree uses the same channels): pass 1 tries speeds from the
// top down and keeps the best nChannels x speed; channels are duplicated as ncclTopoDupChannels does; pass 2
// raises the speed while the channel count holds. What a channel may use: every GPU of the node sends and
// receives `speed` over its NVLink (or PCIe) budget; every node's traffic leaves through one NIC.
NcclGraph CostModel::SearchRing(const CommShape& sh) const noexcept {
  const bool inter = sh.nnodes > 1;
  const int k = sh.local_ranks;
  const Speeds sp = SpeedArray(topo_.compute_capability, inter);
  const double local_bw = topo_.intra_nvlink ? topo_.nvlink_bw_GBps : topo_.pci_bw_GBps;
  const int nics = NicsUsable(k);
  const double nic_bw = topo_.nic_bw_GBps;
  auto cap = [&](double s) {
    int n = kMaxSearchChannels;
    if (k > 1) n = std::min(n, static_cast<int>(std::floor(local_bw / s + 1e-9)));
    if (inter) n = std::min(n, nics * static_cast<int>(std::floor(nic_bw / s + 1e-9)));
    return std::max(n, 0);
  };
  double max_bw = inter ? (k > 1 ? std::min(nic_bw, local_bw) : nic_bw) : local_bw;
  double total_bw = local_bw;
  int idx = 0;
  while (idx < sp.n - 1 && sp.v[idx] > max_bw + 1e-9) ++idx;
  int best_n = 0;
  double best_s = 0;
  for (;;) {
    double s = sp.v[idx];
    int n = cap(s);
    if (n >= 1 && n * s > best_n * best_s) {
      best_n = n;
      best_s = s;
    }
    if (best_n > 0 && best_n * best_s >= total_bw) break;
    if (idx + 1 < sp.n && (best_n == 0 || sp.v[idx + 1] / best_s > .49)) {
      ++idx;
      continue;
    }
    break;
  }
  NcclGraph g;
  if (best_n == 0) {  // NCCL's "falling back to simple order"
    g.channels = 1;
    g.bw_intra = g.bw_inter = 0.1f;
    return g;
  }
  // ncclTopoDupChannels.
  if (best_s >= 25.0 && !(topo_.compute_capability > 80 && best_s < 50.0 && best_n > 4)) {
    int dup = std::min(best_n * 2, kMaxSearchChannels);
    best_s /= (dup + best_n - 1) / best_n;
    best_n = dup;
  }
  // Pass 2: raise the speed while the channels still fit.
  idx = 0;
  while (idx < sp.n - 1 && sp.v[idx] > best_s + 1e-9) ++idx;
  while (idx > 0) {
    double s = sp.v[idx - 1];
    int n = cap(s);
    if (n < best_n || s > max_bw + 1e-9) break;
    best_n = n;
    best_s = s;
    --idx;
  }
  g.channels = best_n;
  g.bw_intra = g.bw_inter = static_cast<float>(best_s);
  return g;
}

// Emulates the NVLS search: one channel per head GPU (intra-node: every GPU of the comm; inter-node: one per
// NIC). A channel's head moves twice the speed through the NVSwitch, every other GPU once, so a GPU carries
// (heads + 1) x speed. Pass 2 raises bwInter while it stays below twice bwIntra.
NcclGraph CostModel::SearchNvls(const CommShape& sh) const noexcept {
  NcclGraph g;
  const int k = sh.local_ranks;
  if (!topo_.nvls || !topo_.nvswitch || topo_.compute_capability < 90 || k < 2) return g;
  const bool inter = sh.nnodes > 1;
  const Speeds sp = SpeedArray(topo_.compute_capability, inter);
  const double local_bw = topo_.nvlink_bw_GBps;
  int heads = std::min(kMaxNvlsArity, k);
  if (inter) heads = std::min(heads, NicsUsable(k));
  double max_bw = inter ? std::min(topo_.nic_bw_GBps, local_bw) : local_bw;
  int idx = 0;
  while (idx < sp.n - 1 && (sp.v[idx] > max_bw + 1e-9 ||
                            (!inter && sp.v[idx] * heads > local_bw * heads / std::max(heads - 1, 1) + 1e-9))) {
    ++idx;
  }
  while (idx < sp.n && (k + 1) * sp.v[idx] > local_bw + 1e-9) ++idx;
  if (idx >= sp.n) return g;
  g.channels = heads;
  g.bw_intra = g.bw_inter = sp.v[idx];
  while (idx > 0 && g.bw_inter < g.bw_intra * 2 && (!inter || sp.v[idx - 1] <= topo_.nic_bw_GBps + 1e-9)) {
    g.bw_inter = sp.v[--idx];
  }
  return g;
}

CommTuning CostModel::Tune(const CommShape& shape) const noexcept { return TuneWith(shape, enable_); }

CommTuning CostModel::TuneWith(const CommShape& shape, const NcclEnable& enable) const noexcept {
  CommTuning t;
  t.shape = shape;
  for (int f = 0; f < kNumFuncs; ++f) {
    for (int a = 0; a < kNumAlgos; ++a) {
      for (int p = 0; p < kNumProtos; ++p) t.latency_us[f][a][p] = t.bandwidth_GBps[f][a][p] = 0.0f;
    }
  }
  const int nRanks = shape.nranks;
  const int nNodes = std::max(shape.nnodes, 1);
  if (nRanks <= 1) return t;
  const int cc = topo_.compute_capability;
  t.ring = SearchRing(shape);
  t.nvls = SearchNvls(shape);
  // comm->nChannels: rings are duplicated when connected (connectRings); Hopper doubles again across nodes when
  // a search channel is fast (connect.cc).
  t.comm_channels = std::min(kMaxChannels, t.ring.channels * 2);
  if (cc >= 90 && nNodes > 1 && t.ring.bw_intra > 45.0f && t.comm_channels < 16) t.comm_channels *= 2;

  const NcclGraph* graphs[kNumAlgos] = {&t.ring, &t.ring, &t.ring, &t.ring, &t.nvls, &t.nvls, &t.ring};
  const int ccIdx = CompCapIndex(cc);
  const int index2 = nNodes <= 2 ? nNodes - 1 : 2;
  const int index1 = nNodes == 1 ? ccIdx : (amd_cpu_ ? 1 : 0);
  const double llMaxBw = kLlMaxBw[index1][index2];
  const double perChMaxTreeBw = kPerChMaxTreeBw[ccIdx][index2];
  const double perChMaxRingLL128Bw = kPerChMaxRingLL128Bw[ccIdx][index2];
  const double perChMaxTreeLL128Bw = kPerChMaxTreeLL128Bw[ccIdx][index2];
  const double perChMaxNvlsTreeBw = kPerChMaxNvlsTreeBw[ccIdx][index2];
  const float ppn = static_cast<float>(nRanks) / nNodes;
  // One GPU per node has no intra-node path (PATH_LOC), which NCCL's tuner files under PCI.
  const int intraHw = (topo_.intra_nvlink && shape.local_ranks > 1) ? kHwNvlink : kHwPci;
  const int hw = nNodes == 1 ? intraHw : kHwNet;
  const bool patEnable = cc >= 60 && nNodes == nRanks;
  const float netOverheadBase = amd_cpu_ ? 2.0f : 1.0f;
  const float latencyInter = static_cast<float>(topo_.net_latency_us);
  const bool collnet = topo_.collnet;

  for (int coll = 0; coll < kNumFuncs; ++coll) {
    const int nsteps = coll == kAllReduce ? 2 * (nRanks - 1)
                       : (coll == kReduceScatter || coll == kAllGather) ? nRanks - 1 : nRanks;
    for (int a = 0; a < kNumAlgos; ++a) {
      if ((coll == kBcast || coll == kReduce) && a != kRing) continue;
      if ((coll == kReduceScatter || coll == kAllGather) && a != kPat && a != kRing && a != kNvls && a != kCnd) continue;
      if (coll == kAllReduce && a == kPat) continue;
      const NcclGraph& g = *graphs[a];
      for (int p = 0; p < kNumProtos; ++p) {
        if ((a == kNvls || a == kNvlsTree) && p != kSimple) continue;
        if ((coll == kReduceScatter || coll == kAllGather) && a == kPat && (p != kSimple || !patEnable)) continue;
        const bool isCollnet = a == kCnd || a == kCnc;
        float bw = (nNodes <= 2 || isCollnet) ? g.bw_intra : g.bw_inter;
        if (a == kNvls || a == kNvlsTree) {
          if (g.channels < 2) continue;
          float intraBw = g.bw_intra * kNvlsEfficiency[ccIdx] * (g.channels - 1) / g.channels;
          if (coll == kAllReduce) {
            intraBw *= 2.0f;
          } else {
            intraBw *= (ppn - 1) / ppn;
          }
          float interBw = g.bw_inter * ((nNodes <= 2 && a == kNvlsTree) ? 2 : 1);
          bw = std::min({intraBw, interBw,
                         a == kNvlsTree ? static_cast<float>(perChMaxNvlsTreeBw) : std::numeric_limits<float>::max()});
        }
        float busBw = g.channels * bw;

        if (a == kRing && p == kLL) busBw = std::min(llMaxBw, busBw * .5);
        if (a == kRing && p == kLL128) busBw = std::min(busBw * 0.92, g.channels * perChMaxRingLL128Bw);
        if (a == kTree && coll == kAllReduce) busBw = std::min(busBw * .92, g.channels * perChMaxTreeBw);
        if (a == kTree && p == kLL) busBw = std::min(busBw * 1.0 / 3.8, llMaxBw);
        if (a == kTree && p == kLL128) {
          busBw = std::min(busBw * (nNodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), g.channels * perChMaxTreeLL128Bw);
        }
        if (a == kPat) busBw *= .75;
        if (isCollnet && p != kSimple) busBw = 0;
        if (a == kCnd && p == kSimple) {
          if (coll == kAllGather || coll == kReduceScatter) {
            busBw = ppn * std::min(g.bw_intra, g.bw_inter * 0.9f);
          } else {
            float factor = ppn / (1.0f * g.channels);
            factor -= (factor - 1) / 2;
            busBw /= factor;
            if (cc >= 90) busBw *= .85;
          }
        }
        // NVLS/CollNetDirect all-gather and reduce-scatter across nodes need the CollNet plugin, with at most one
        // GPU per head.
        if ((a == kNvls || a == kCnd) && p == kSimple && (coll == kAllGather || coll == kReduceScatter) && nNodes > 1) {
          if (!collnet || shape.local_ranks > g.channels) busBw = 0;
        }
        if (!(a != kRing && (coll == kAllGather || coll == kReduceScatter))) {
          float ratio = (a == kRing || a == kNvls || a == kNvlsTree) ? (1.0f * nRanks) / nsteps : .5f;
          busBw *= ratio;
        }
        t.bandwidth_GBps[coll][a][p] = busBw;

        float lat = kBaseLat[a][p];
        float intraLat = kHwLat[intraHw][a][p];
        float interLat = (ppn == 1 ? kHwLat[kHwNet][kTree][p] : kHwLat[kHwNet][a][p]) + latencyInter;
        if (p == kSimple) interLat += latencyInter;  // flush
        if (a == kRing) {
          float hwl = kHwLat[hw][a][p];
          if (coll == kReduce || coll == kBcast) {
            lat += hwl;  // Why: NVSwitch and rail systems find identical channels (graph->sameChannels)
          } else {
            float netOverhead = 0.0f;
            if (nNodes > 1) {
              netOverhead = netOverheadBase;
              if (p == kSimple) netOverhead *= 3;
            }
            intraLat = std::max(intraLat, netOverhead);
            int nInterSteps = nNodes == 1 ? 0 : coll == kAllReduce ? 2 * (nNodes - 1) : nNodes - 1;
            lat += (nsteps - nInterSteps) * intraLat + nInterSteps * interLat;
          }
        } else if (a == kTree) {
          if (coll == kAllReduce) lat += 2 * ((nRanks / nNodes - 1) * intraLat + Log2i(nNodes) * interLat);
        } else if (a == kCnd) {
          lat += 2 * (std::min(1, nRanks / nNodes - 1) * intraLat + (nRanks / nNodes - 1) * 0.4f) + interLat;
        } else if (a == kCnc) {
          lat += 2 * (nRanks / nNodes - 1) * intraLat + interLat;
        } else if (a == kNvls) {
          lat = intraLat;
          if (nNodes > 1) lat += interLat;
        } else if (a == kNvlsTree) {
          lat += intraLat + 2 * Log2i(nNodes) * interLat;
        } else if (a == kPat) {
          if (coll == kAllGather || coll == kReduceScatter) lat += Log2i(nNodes) * (interLat / 3.5f) + nRanks * 2.8f;
        }
        t.latency_us[coll][a][p] = lat;
      }
    }
  }

  // Enablement (tuning.cc after the tables; enqueue.cc updateCollCostTable).
  const bool ll128Ok = topo_.intra_nvlink || shape.local_ranks == 1;  // typeIntra <= PATH_NVB
  for (int c = 0; c < kNumFuncs; ++c) {
    for (int a = 0; a < kNumAlgos; ++a) {
      bool on = enable.algo[c][a];
      if (nNodes == 1 && a == kNvlsTree) on = false;
      if (!collnet && (a == kCnd || a == kCnc || (a == kNvls && nNodes > 1))) on = false;
      if (!topo_.nvswitch && a == kCnd) on = false;
      if ((a == kCnd || a == kCnc) && shape.local_ranks > kMaxDirectArity + 1) on = false;
      if ((a == kNvls || a == kNvlsTree) && c != kAllReduce && shape.local_ranks > kMaxNvlsArity) on = false;
      for (int p = 0; p < kNumProtos; ++p) {
        bool pon = enable.proto[c][p];
        if (p == kLL128 && !ll128Ok) pon = pon && false;
        if (!on || !pon) t.bandwidth_GBps[c][a][p] = 0;
      }
    }
  }
  return t;
}

double CostModel::NcclTime(const CommTuning& t, NcclFunc func, NcclAlgo algo, NcclProto proto, uint64_t bytes,
                           DType dtype) const noexcept {
  int c = F(func), a = A(algo), p = P(proto);
  if (c < 0 || c >= kNumFuncs || a < 0 || a >= kNumAlgos || p < 0 || p >= kNumProtos) return -1.0;
  float bw = t.bandwidth_GBps[c][a][p];
  float lat = t.latency_us[c][a][p];
  if (bw == 0) return -1.0;
  // NVLS needs a reduction the switch supports (all-gather moves data only).
  if ((a == kNvls || a == kNvlsTree) && c != kAllGather && !NvlsReduceSupported(dtype)) return -1.0;
  int logSize = Log2i(static_cast<long long>(bytes >> 6));
  if (a == kTree && c == kAllReduce && logSize >= 0 && logSize < 23) bw *= kTreeCorrection[p][logSize];
  if (a == kRing && p == kSimple && t.shape.nnodes > 1 && c == kAllReduce &&
      bytes / static_cast<uint64_t>(std::max(1, t.comm_channels * t.shape.nranks)) >= 64) {
    lat *= topo_.compute_capability < 80 ? 1.9f : 1.4f;  // plateau effect of ring
  }
  double time = lat + static_cast<double>(bytes) / (1000.0 * bw);
  // FP8 rings deeper than 8 lose precision: NCCL relegates them behind every other choice.
  if (IsFp8(dtype) && a == kRing && t.shape.nranks > 8) time *= 1024.0;
  return time;
}

CommCost CostModel::Collective(const CommTuning& tuning, CollOp op, uint64_t bytes, DType dtype) const noexcept {
  CommCost cost;
  const CommShape& sh = tuning.shape;
  if (sh.nranks <= 1) {
    cost.method = kind_ == CostModelKind::kAlphaBeta ? CostMethod::kAlphaBeta : CostMethod::kNccl;
    return cost;
  }
  if (kind_ == CostModelKind::kAlphaBeta) return AlphaBeta(sh, op, bytes);
  if (op == CollOp::kAllToAll) return AllToAll(sh, bytes);
  int func = FuncOf(op);
  if (func < 0) return cost;
  double best = std::numeric_limits<double>::infinity();
  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) {
      double t = NcclTime(tuning, static_cast<NcclFunc>(func), static_cast<NcclAlgo>(a), static_cast<NcclProto>(p),
                          bytes, dtype);
      if (t >= 0.0 && t < best) {  // first minimum in NCCL's (algorithm, protocol) order wins ties
        best = t;
        cost.algo = static_cast<NcclAlgo>(a);
        cost.proto = static_cast<NcclProto>(p);
      }
    }
  }
  cost.method = CostMethod::kNccl;
  if (std::isinf(best)) {
    // NCCL would fail the call ("no algorithm/protocol available"); assume the default Ring/Simple.
    cost.fallback = true;
    cost.algo = NcclAlgo::kRing;
    cost.proto = NcclProto::kSimple;
    static const NcclEnable kAll;
    CommTuning t2 = TuneWith(sh, kAll);
    best = std::max(0.0, NcclTime(t2, static_cast<NcclFunc>(func), NcclAlgo::kRing, NcclProto::kSimple, bytes,
                                  DType::kBF16));
  }
  // Calibrated per-call term of one-node communicators (prism-run calibrate); the choice above is unchanged by it.
  if (sh.nnodes == 1) best = std::max(0.0, best + topo_.nccl_intra_latency_offset_us);
  cost.time_us = best;
  return cost;
}

// Plain alpha-beta ring model: a ring step costs alpha, the bytes cross the slowest link class once each.
CommCost CostModel::AlphaBeta(const CommShape& sh, CollOp op, uint64_t bytes) const noexcept {
  CommCost cost;
  cost.method = CostMethod::kAlphaBeta;
  const LinkParams& l = sh.nnodes > 1 ? topo_.ab_inter : topo_.ab_intra;
  const double n = sh.nranks;
  const double s_us = static_cast<double>(bytes) / (l.bandwidth_GBps * 1e3);  // bytes / (GB/s) in us
  switch (op) {
    case CollOp::kAllReduce:
    case CollOp::kBarrier: cost.time_us = 2 * (n - 1) * l.latency_us + 2 * (n - 1) / n * s_us; break;
    case CollOp::kAllGather:
    case CollOp::kReduceScatter:
    case CollOp::kAllToAll: cost.time_us = (n - 1) * l.latency_us + (n - 1) / n * s_us; break;
    case CollOp::kBroadcast:
    case CollOp::kReduce: cost.time_us = (n - 1) * l.latency_us + s_us; break;
    default: cost.time_us = 0; break;
  }
  return cost;
}

// All-to-all is grouped send/receive in NCCL: each rank sends S/n to every peer. Peers on the node go over the
// intra-node p2p link, the rest through the rank's share of the NICs; both proceed at once.
CommCost CostModel::AllToAll(const CommShape& sh, uint64_t bytes) const noexcept {
  CommCost cost;
  cost.method = CostMethod::kP2P;
  const double n = sh.nranks;
  const double k = std::min(sh.local_ranks, sh.nranks);
  const double per_peer = static_cast<double>(bytes) / n;
  double intra_us = (k - 1) * per_peer / (topo_.p2p_intra.bandwidth_GBps * 1e3);
  double inter_us = (n - k) * per_peer / (topo_.p2p_inter.bandwidth_GBps * 1e3);
  double lat = sh.nnodes > 1 ? topo_.p2p_inter.latency_us : topo_.p2p_intra.latency_us;
  cost.time_us = lat + std::max(intra_us, inter_us);
  return cost;
}

CommCost CostModel::SendRecv(uint64_t bytes, int32_t src_rank, int32_t dst_rank) const noexcept {
  CommCost cost;
  cost.method = kind_ == CostModelKind::kAlphaBeta ? CostMethod::kAlphaBeta : CostMethod::kP2P;
  if (src_rank == dst_rank) return cost;
  bool same_node = topo_.NodeOf(src_rank) == topo_.NodeOf(dst_rank);
  const LinkParams& l = kind_ == CostModelKind::kAlphaBeta ? (same_node ? topo_.ab_intra : topo_.ab_inter)
                                                           : (same_node ? topo_.p2p_intra : topo_.p2p_inter);
  cost.time_us = l.latency_us + static_cast<double>(bytes) / (l.bandwidth_GBps * 1e3);
  return cost;
}

uint64_t CostModel::SendBufferBytes(const CommShape& shape) const noexcept {
  constexpr uint64_t kNcclSteps = 8;                  // NCCL_STEPS (src/include/device.h)
  constexpr uint64_t kNetChunk = 1u << 17;            // NCCL_P2P_NET_CHUNKSIZE default
  constexpr uint64_t kNvlChunk = 1u << 19;            // NCCL_P2P_NVL_CHUNKSIZE default
  constexpr uint64_t kPciChunk = 1u << 17;            // NCCL_P2P_PCI_CHUNKSIZE default
  const uint64_t chunk = shape.nnodes > 1 ? kNetChunk : topo_.intra_nvlink ? kNvlChunk : kPciChunk;
  return kNcclSteps * chunk;
}

double BusBwFactor(CollOp op, int nranks) {
  double n = std::max(nranks, 1);
  switch (op) {
    case CollOp::kAllReduce: return 2 * (n - 1) / n;
    case CollOp::kAllGather:
    case CollOp::kReduceScatter:
    case CollOp::kAllToAll: return (n - 1) / n;
    default: return 1.0;
  }
}

}  // namespace prism::replay
