// replay_cost_table: prints the communication cost model for a topology, the way NCCL_DEBUG_SUBSYS=TUNING prints
// NCCL's own tables, plus the choice and bus bandwidth at a range of sizes. docs/cost-model.md quotes its output;
// compare it with a real NCCL log to calibrate a topology file.
//
//   replay_cost_table [--topology NAME|FILE] [--model nccl|alpha-beta] [--nccl-algo X] [--nccl-proto Y]
//                     [--shape RANKS:NODES ...]
// Without --shape: 8 ranks on 1 node, 16 on 2, 64 on 64 (one per node), 1024 on 128.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "replay/cost_model.h"

namespace {

using namespace prism::replay;
using prism::trace::CollOp;
using prism::trace::DType;

std::string Size(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%lluG", static_cast<unsigned long long>(b >> 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%lluM", static_cast<unsigned long long>(b >> 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%lluK", static_cast<unsigned long long>(b >> 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(b));
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string topo_name = "h100-8x400g";
  CostModelOptions mo;
  std::vector<std::pair<int, int>> shapes;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--topology") {
      topo_name = v;
    } else if (k == "--model") {
      mo.model = v == "alpha-beta" ? CostModelKind::kAlphaBeta : CostModelKind::kNccl;
    } else if (k == "--nccl-algo") {
      mo.nccl_algo = v;
    } else if (k == "--nccl-proto") {
      mo.nccl_proto = v;
    } else if (k == "--shape") {
      int r = 0, n = 0;
      if (std::sscanf(v.c_str(), "%d:%d", &r, &n) != 2 || r < 1 || n < 1 || n > r) {
        std::fprintf(stderr, "replay_cost_table: --shape wants RANKS:NODES (got %s)\n", v.c_str());
        return 2;
      }
      shapes.emplace_back(r, n);
    } else {
      std::fprintf(stderr, "replay_cost_table: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (shapes.empty()) shapes = {{8, 1}, {16, 2}, {64, 64}, {1024, 128}};
  Topology topo;
  std::string err;
  CostModel m;
  if (!LoadTopology(topo_name, &topo, &err) || !m.Init(topo, mo, &err)) {
    std::fprintf(stderr, "replay_cost_table: %s\n", err.c_str());
    return 2;
  }
  std::printf("topology %s, %s model\n", topo.name.c_str(),
              m.kind() == CostModelKind::kAlphaBeta ? "alpha-beta" : "NCCL 2.28.9");
  const CollOp ops[] = {CollOp::kAllReduce, CollOp::kAllGather, CollOp::kReduceScatter, CollOp::kBroadcast,
                        CollOp::kAllToAll};
  const uint64_t sizes[] = {1ull << 10, 64ull << 10, 1ull << 20, 16ull << 20, 256ull << 20, 1ull << 30, 4ull << 30};
  for (auto [nranks, nnodes] : shapes) {
    CommShape sh{nranks, nnodes, (nranks + nnodes - 1) / nnodes};
    CommTuning t = m.Tune(sh);
    std::printf("\n== %d ranks on %d node%s (%d per node)\n", nranks, nnodes, nnodes == 1 ? "" : "s", sh.local_ranks);
    if (m.kind() == CostModelKind::kNccl) {
      std::printf("channel search: ring/tree %d x %.1f GB/s (intra) / %.1f (inter), nvls %d x %.1f / %.1f; "
                  "comm channels %d\n",
                  t.ring.channels, t.ring.bw_intra, t.ring.bw_inter, t.nvls.channels, t.nvls.bw_intra,
                  t.nvls.bw_inter, t.comm_channels);
      std::printf("latency (us) / algorithm bandwidth (GB/s), enabled entries only:\n");
      for (int f = 0; f < kNumFuncs; ++f) {
        std::printf("  %-13s", ToString(static_cast<NcclFunc>(f)));
        for (int a = 0; a < kNumAlgos; ++a) {
          for (int p = 0; p < kNumProtos; ++p) {
            if (t.bandwidth_GBps[f][a][p] <= 0) continue;
            std::printf(" %s/%s %.1f/%.1f", ToString(static_cast<NcclAlgo>(a)), ToString(static_cast<NcclProto>(p)),
                        t.latency_us[f][a][p], t.bandwidth_GBps[f][a][p]);
          }
        }
        std::printf("\n");
      }
    }
    std::printf("  %-14s", "size");
    for (uint64_t b : sizes) std::printf(" %22s", Size(b).c_str());
    std::printf("\n");
    for (CollOp op : ops) {
      std::printf("  %-14s", std::string(prism::trace::ToString(op)).c_str());
      for (uint64_t b : sizes) {
        CommCost c = m.Collective(t, op, b, DType::kBF16);
        double busbw = b / c.time_us / 1e3 * BusBwFactor(op, nranks);
        char cell[64];
        std::snprintf(cell, sizeof cell, "%s %.0fGB/s", c.Label(), busbw);
        std::printf(" %22s", cell);
      }
      std::printf("\n");
    }
  }
  return 0;
}
