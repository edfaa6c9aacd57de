// The launcher's side of kernel records (src/analysis/kernel_report.h) on synthetic kernel and event files: parsing,
// the clock alignment (sync lines, then libprism's stamp kernels against their stamps), CUDA graph launches and
// NVTX in trace.json, kernel names, and the per-kernel comparison of `prism-run report kernels`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "analysis/kernel_report.h"
#include "analysis/run_report.h"
#include "prism/limits.h"

namespace {

namespace fs = std::filesystem;
namespace pl = prism::analysis;
using nlohmann::json;

fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("prism-kreport-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Writes rank<R>.kernels.jsonl and rank<R>.events.jsonl as libprism would.
struct SynthRank {
  std::ofstream k, e;
  SynthRank(const fs::path& dir, int rank)
      : k(dir / ("rank" + std::to_string(rank) + ".kernels.jsonl")),
        e(dir / ("rank" + std::to_string(rank) + ".events.jsonl")) {
    k << R"({"type":"kernels","v":1,"rank":)" << rank
      << R"(,"pid":1,"status":"on","why":"","cupti":"/fake/libcupti.so.13","cupti_version":130001,"kinds":["kernel","memcpy","memset"]})"
      << "\n";
    e << R"({"type":"hello","v":1,"rank":)" << rank << R"(,"world_size":8,"local_rank":0,"pid":1,"host":"h","gpu":0})"
      << "\n";
  }
  void Sync(int64_t host, int64_t cmh, int64_t gmh, bool known) {
    k << R"({"type":"sync","host_ns":)" << host << R"(,"cupti_minus_host_ns":)" << cmh << R"(,"err_ns":50,"gpu_minus_host_ns":)"
      << gmh << R"(,"gpu":)" << (known ? "true" : "false") << "}\n";
  }
  void Name(int id, const std::string& n) { k << json{{"type", "name"}, {"id", id}, {"name", n}}.dump() << "\n"; }
  void Kernel(int64_t s, int64_t en, int stream, int name, int graph = 0, int64_t node = 0, int corr = 1) {
    k << R"({"type":"k","s":)" << s << R"(,"e":)" << en << R"(,"dev":0,"ctx":1,"st":)" << stream << R"(,"n":)" << name
      << R"(,"c":)" << corr << R"(,"grid":[4,1,1],"block":[128,1,1])";
    if (graph) k << R"(,"g":)" << graph << R"(,"gn":)" << node;
    k << "}\n";
  }
  void Memcpy(int64_t s, int64_t en, int stream, int64_t bytes, int kind) {
    k << R"({"type":"m","s":)" << s << R"(,"e":)" << en << R"(,"dev":0,"ctx":1,"st":)" << stream << R"(,"c":3,"b":)"
      << bytes << R"(,"kind":)" << kind << "}\n";
  }
  void End() { k << R"({"type":"end","records":1,"dropped":0,"buffers":1,"incomplete":0})" << "\n"; }
  void Iter(int i, int64_t t, const char* clock = "gpu") {
    e << R"({"type":"iter","iteration":)" << i << R"(,"t_ns":)" << t << R"(,"dur_ns":0,"peak_bytes":1,"torch_max_allocated":0,"clock":")"
      << clock << "\"}\n";
  }
  void Op(int64_t arrival) {
    e << R"({"type":"op","comm_id":1,"seq":0,"op":"allreduce","dtype":"f32","bytes":4,"peer":-1,"arrival_ns":)" << arrival
      << R"(,"release_ns":)" << arrival + 5000 << R"(,"model_dur_ns":5000,"wait_on_rank":-1})" << "\n";
  }
};

TEST(KernelFile, ParsesEveryLineTypeAndSkipsBadOnes) {
  pl::KernelFile f;
  pl::ParseKernelLine(R"({"type":"kernels","v":1,"rank":5,"pid":9,"status":"off","why":"no CUPTI","kinds":[]})", &f);
  pl::ParseKernelLine(R"({"type":"name","id":2,"name":"gemm"})", &f);
  pl::ParseKernelLine(R"({"type":"k","s":100,"e":250,"dev":0,"ctx":1,"st":7,"n":2,"c":4,"grid":[1,2,3],"block":[4,5,6],"g":3,"gn":9})", &f);
  pl::ParseKernelLine(R"({"type":"ms","s":300,"e":310,"dev":0,"ctx":1,"st":7,"c":5,"b":64})", &f);
  pl::ParseKernelLine(R"({"type":"nvtx","t":400,"id":1,"f":2,"tid":77,"n":2})", &f);
  pl::ParseKernelLine(R"({"type":"sync","host_ns":1000,"cupti_minus_host_ns":-5,"gpu_minus_host_ns":7,"gpu":true})", &f);
  pl::ParseKernelLine(R"({"type":"k","s":500,"e":400})", &f);  // ends before it starts
  pl::ParseKernelLine("not json", &f);
  pl::ParseKernelLine(R"({"type":"from_the_future","x":1})", &f);
  pl::ParseKernelLine(R"({"type":"end","records":3,"dropped":2})", &f);
  EXPECT_TRUE(f.has_header);
  EXPECT_EQ(f.rank, 5);
  EXPECT_EQ(f.status, "off");
  EXPECT_EQ(f.why, "no CUPTI");
  ASSERT_EQ(f.names.size(), 3u);
  EXPECT_EQ(f.names[2], "gemm");
  ASSERT_EQ(f.records.size(), 2u);
  EXPECT_EQ(f.records[0].grid[2], 3);
  EXPECT_EQ(f.records[0].block[0], 4);
  EXPECT_EQ(f.records[0].graph, 3u);
  EXPECT_EQ(f.records[0].graph_node, 9u);
  EXPECT_EQ(f.records[1].kind, pl::KernelKind::kMemset);
  EXPECT_EQ(f.records[1].bytes, 64u);
  ASSERT_EQ(f.markers.size(), 1u);
  EXPECT_EQ(f.markers[0].thread, 77u);
  ASSERT_EQ(f.syncs.size(), 1u);
  EXPECT_TRUE(f.syncs[0].gpu_known);
  EXPECT_EQ(f.malformed, 2);
  EXPECT_TRUE(f.ended);
  EXPECT_EQ(f.dropped, 2);
}

TEST(KernelFile, PartialLastLineIsLeftForLater) {
  fs::path d = FreshDir("partial");
  {
    std::ofstream o(d / "rank0.kernels.jsonl");
    o << R"({"type":"name","id":0,"name":"a"})" << "\n" << R"({"type":"k","s":1,"e":2,"n":0})" << "\n"
      << R"({"type":"k","s":3,"e")";
  }
  std::string error;
  auto f = pl::ReadKernelFile((d / "rank0.kernels.jsonl").string(), &error);
  ASSERT_TRUE(f) << error;
  EXPECT_EQ(f->records.size(), 1u);
  EXPECT_EQ(f->malformed, 0);
  EXPECT_FALSE(pl::ReadKernelFile((d / "nope.jsonl").string(), &error));
  fs::remove_all(d);
}

// Kernel and event files are refused above their caps (include/prism/limits.h) before a byte is read, by name.
TEST(KernelFile, FilesOverTheirCapsAreRefusedByName) {
  fs::path d = FreshDir("caps");
  const std::string big = (d / "rank0.kernels.jsonl").string();
  std::ofstream(big).close();
  fs::resize_file(big, prism::limits::kMaxKernelFileBytes + 1);  // sparse: nothing on disk
  std::string error;
  EXPECT_FALSE(pl::ReadKernelFile(big, &error));
  EXPECT_NE(error.find(big + ": 4294967297 bytes is larger than the 4294967296-byte (4 GiB) cap on kernel files"),
            std::string::npos) << error;
  EXPECT_FALSE(pl::LoadRankKernels(d.string(), 0, &error));
  EXPECT_NE(error.find(big + ": 4294967297 bytes"), std::string::npos) << error;
  // A good kernel file next to an event file over its cap.
  std::ofstream(d / "rank1.kernels.jsonl") << R"({"type":"kernels","v":1,"rank":1,"status":"on","kinds":[]})" << "\n";
  const std::string events = (d / "rank1.events.jsonl").string();
  std::ofstream(events).close();
  fs::resize_file(events, prism::limits::kMaxEventFileBytes + 1);
  EXPECT_FALSE(pl::LoadRankKernels(d.string(), 1, &error));
  EXPECT_NE(error.find(events + ": 4294967297 bytes is larger than the 4294967296-byte (4 GiB) cap on event files"),
            std::string::npos) << error;
  fs::remove_all(d);
}

// Numbers past int64 are clamped, never cast (a 1e308 cast to int64 is undefined behaviour, INT64_MIN on x86, and
// 2^64-1 read as -1: each made the record end before it starts), and a line nested too deep is malformed.
TEST(KernelFile, HostileNumbersAndNestingInALine) {
  pl::KernelFile f;
  pl::ParseKernelLine(R"({"type":"k","s":5,"e":1e308})", &f);
  pl::ParseKernelLine(R"({"type":"k","s":5,"e":18446744073709551615})", &f);
  pl::ParseKernelLine(R"({"type":"k","s":1,"e":2,"x":)" + std::string(100, '[') + std::string(100, ']') + "}", &f);
  ASSERT_EQ(f.records.size(), 2u);
  EXPECT_EQ(f.records[0].end_ns, INT64_MAX);
  EXPECT_EQ(f.records[1].end_ns, INT64_MAX);
  EXPECT_EQ(f.malformed, 1);
}

TEST(KernelClock, InterpolatesBothOffsets) {
  // CUPTI 5 ms ahead of the host, drifting +1 us per second; the GPU 2 ms behind, measured from t=1 s on only.
  std::vector<pl::KernelSync> s = {{1000000000, 5000000, 0, false},
                                   {2000000000, 5001000, -2000000, true},
                                   {3000000000, 5002000, -2004000, true}};
  pl::KernelClock c(s);
  EXPECT_TRUE(c.gpu_known());
  EXPECT_EQ(c.CuptiToHost(2000000000 + 5001000), 2000000000);
  EXPECT_EQ(c.CuptiToHost(2500000000 + 5001500), 2500000000);   // halfway: both offsets halfway
  EXPECT_EQ(c.CuptiToHost(500000000 + 5000000), 500000000);     // before the first point: clamped
  EXPECT_EQ(c.HostToGpu(2500000000), 2500000000 - 2002000);
  EXPECT_EQ(c.HostToGpu(1000000000), 1000000000 - 2000000);     // unmeasured point ignored, nearest used
  EXPECT_EQ(c.HostToGpu(9000000000), 9000000000 - 2004000);
  pl::KernelClock none({});
  EXPECT_FALSE(none.gpu_known());
  EXPECT_EQ(none.CuptiToGpu(123), 123);
}

TEST(StampFit, FindsTheOffsetAmongDenseIrregularStampsAndFollowsDrift) {
  // Stamp kernels every 5-50 us for 3 s (plus kernels that stamp nothing); the stamps read 37 us + 4 us/s later
  // than the kernels' (sync-converted) starts.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> gap(5000, 50000);
  std::vector<int64_t> starts, stamps;
  const int64_t t0 = 1700000000000000000;
  for (int64_t t = t0; t < t0 + 3000000000; t += gap(rng)) {
    starts.push_back(t);
    if (rng() % 4 == 0) continue;  // e.g. a stamp whose op event was not written
    stamps.push_back(t + 37000 + (t - t0) * 4 / 1000000 + 300);
  }
  pl::StampFit fit = pl::FitStamps(starts, stamps);
  ASSERT_TRUE(fit.applied);
  EXPECT_EQ(fit.stamps, static_cast<int>(stamps.size()));
  EXPECT_EQ(fit.matched, fit.stamps);
  EXPECT_GE(fit.knots.size(), 3u);
  EXPECT_NEAR(static_cast<double>(fit.Correction(t0 + 500000000)), 37300 + 2000, 800);
  EXPECT_NEAR(static_cast<double>(fit.Correction(t0 + 2500000000)), 37300 + 10000, 800);
  EXPECT_LT(fit.residual_median_ns, 1500);
}

TEST(StampFit, PeriodicStampsTakeTheOffsetNearestZero) {
  std::vector<int64_t> starts, stamps;
  for (int i = 0; i < 1000; ++i) {
    starts.push_back(1000000000 + i * 20000);
    stamps.push_back(1000000000 + i * 20000 + 3000);  // 3 us: any multiple of 20 us away would match as well
  }
  pl::StampFit fit = pl::FitStamps(starts, stamps);
  ASSERT_TRUE(fit.applied);
  EXPECT_NEAR(static_cast<double>(fit.Correction(1005000000)), 3000, 100);
}

TEST(StampFit, LargeOffsetIsFoundInTheWiderSearch) {
  // The sync lines 7.3 ms off (e.g. no GPU offset measured): nothing within 2 ms, found within 50 ms.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> gap(500000, 3000000);
  std::vector<int64_t> starts, stamps;
  for (int64_t t = 1000000000; t < 4000000000; t += gap(rng)) {
    starts.push_back(t);
    stamps.push_back(t + 7300000);
  }
  pl::StampFit fit = pl::FitStamps(starts, stamps);
  ASSERT_TRUE(fit.applied);
  EXPECT_EQ(fit.matched, fit.stamps);
  EXPECT_NEAR(static_cast<double>(fit.Correction(2000000000)), 7300000, 100);
}

TEST(StampFit, NothingToMatch) {
  EXPECT_FALSE(pl::FitStamps({}, {1, 2, 3}).applied);
  EXPECT_FALSE(pl::FitStamps({1, 2, 3}, {}).applied);
  pl::StampFit far = pl::FitStamps({1000000000}, {9000000000});
  EXPECT_FALSE(far.applied);
  EXPECT_EQ(far.Correction(5), 0);
}

// A rank on three clocks: the GPU clock of the events (G), the host (G - gmh) and CUPTI (host + cmh + a CUPTI-side
// error of 15 us that only the stamps reveal). After loading, kernels sit on G: stamp kernels start 300 ns before
// the stamp they wrote, the others where they were put.
TEST(RankKernels, AlignedOnTheEventClock) {
  fs::path d = FreshDir("align");
  const int64_t h0 = 1700000000000000000, cmh = 5000000, cupti_err = 15000;
  auto gmh = [&](int64_t host) { return -2000000 + (host - h0) * 2 / 1000000; };  // 2 us per second of drift
  {
    SynthRank s(d, 3);
    for (int i = 0; i <= 12; ++i) s.Sync(h0 + i * 1000000000ll, cmh, gmh(h0 + i * 1000000000ll), true);
    s.Name(0, "prism_stamp");
    s.Name(1, "void gemm<float>(float*)");
    s.Name(2, "prism_stamp_step");
    auto raw = [&](int64_t g) { return g - gmh(g) + cmh + cupti_err; };
    for (int i = 0; i < 10; ++i) {
      const int64_t g = h0 + i * 1000000000ll;  // one iteration a second
      s.Kernel(raw(g), raw(g) + 2000, 9, 0);              // the iteration stamp
      s.Iter(i, g + 300);
      s.Kernel(raw(g + 100000), raw(g + 150000), 7, 1);   // compute
      s.Kernel(raw(g + 500000), raw(g + 520000), 9, 2);   // an op's arrival stamp fused with its payload
      s.Op(g + 500300);
    }
    s.End();
  }
  std::string error;
  auto rk = pl::LoadRankKernels(d.string(), 3, &error);
  ASSERT_TRUE(rk) << error;
  EXPECT_TRUE(rk->warnings.empty()) << rk->warnings[0];
  EXPECT_TRUE(rk->fit.applied);
  EXPECT_EQ(rk->fit.stamps, 20);
  EXPECT_EQ(rk->fit.matched, 20);
  ASSERT_EQ(rk->iteration_t_ns.size(), 10u);
  EXPECT_EQ(rk->iteration_t_ns[4], h0 + 4000000300);
  ASSERT_EQ(rk->file.records.size(), 30u);
  for (int i = 0; i < 10; ++i) {
    const int64_t g = h0 + i * 1000000000ll;
    const pl::KernelRecord& gemm = rk->file.records[static_cast<size_t>(3 * i + 1)];
    EXPECT_EQ(rk->file.names[static_cast<size_t>(gemm.name)], "void gemm<float>(float*)");
    EXPECT_NEAR(static_cast<double>(gemm.start_ns), static_cast<double>(g + 100300), 200) << "iteration " << i;
    EXPECT_NEAR(static_cast<double>(gemm.end_ns - gemm.start_ns), 50000, 10);
  }
  json sum = pl::KernelTraceSummary(*rk);
  EXPECT_EQ(sum["kernels"], 30);
  EXPECT_TRUE(sum["clock"]["stamp_correction_applied"].get<bool>());
  EXPECT_NEAR(sum["clock"]["correction_us"][0].get<double>(), -14.7, 0.3);

  // Without stamps (a job libprism never stamped, or host-clock marks) the sync lines alone place the kernels:
  // the CUPTI-side error stays, and nothing claims otherwise.
  fs::path d2 = FreshDir("align-nostamps");
  {
    SynthRank s(d2, 0);
    s.Sync(h0, cmh, -2000000, true);
    s.Name(0, "gemm");
    s.Kernel(h0 + 2000000 + cmh, h0 + 2000000 + cmh + 1000, 7, 0);
    s.Iter(0, h0 + 1000000, "host");
    s.End();
  }
  auto rk2 = pl::LoadRankKernels(d2.string(), 0, &error);
  ASSERT_TRUE(rk2) << error;
  EXPECT_FALSE(rk2->fit.applied);
  EXPECT_EQ(rk2->file.records[0].start_ns, h0 + 2000000 - 2000000);
  EXPECT_EQ(rk2->iteration_t_ns[0], h0 + 1000000 - 2000000);  // a host-clock mark moved onto the GPU clock
  fs::remove_all(d);
  fs::remove_all(d2);
}

TEST(RankKernels, MissingFileAndWarnings) {
  fs::path d = FreshDir("missing");
  std::string error;
  EXPECT_FALSE(pl::LoadRankKernels(d.string(), 0, &error));
  EXPECT_NE(error.find("--kernels"), std::string::npos) << error;
  {
    std::ofstream o(d / "rank2.kernels.jsonl");
    o << R"({"type":"kernels","v":1,"rank":2,"status":"on","kinds":["kernel"]})" << "\n"
      << R"({"type":"name","id":0,"name":"x"})" << "\n" << R"({"type":"k","s":10,"e":20,"n":0})" << "\n";
  }
  EXPECT_EQ(pl::KernelRanksIn(d.string()), std::vector<int>{2});
  auto rk = pl::LoadRankKernels(d.string(), 2, &error);
  ASSERT_TRUE(rk) << error;
  std::string all;
  for (const std::string& w : rk->warnings) all += w + "\n";
  EXPECT_NE(all.find("no end line"), std::string::npos) << all;
  EXPECT_NE(all.find("no sync lines"), std::string::npos) << all;
  fs::remove_all(d);
}

TEST(KernelNames, Shortened) {
  EXPECT_EQ(pl::ShortKernelName("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                                "at::detail::Array<char*, 2> >(int, at::native::FillFunctor<float>, "
                                "at::detail::Array<char*, 2>)"),
            "vectorized_elementwise_kernel<FillFunctor>");
  EXPECT_EQ(pl::ShortKernelName("prism_stamp"), "prism_stamp");
  EXPECT_EQ(pl::ShortKernelName("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(pl::ShortKernelName("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_"
                                "align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)"),
            "Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>");
  EXPECT_EQ(pl::ShortKernelName("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, "
                                "float, 8, false, false>(c10::BFloat16*, c10::BFloat16 const*, int, int, int)"),
            "softmax_warp_forward<BFloat16>");
  EXPECT_EQ(pl::ShortKernelName(
                "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
                "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>"
                "(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
                "operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_"
                "nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
                "const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::"
                "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})"),
            "elementwise_kernel<gpu_kernel_impl_nocast>");
  EXPECT_EQ(pl::ShortKernelName("gemm_tiled(int, float*)"), "gemm_tiled");
  EXPECT_LE(pl::ShortKernelName(std::string(200, 'x')).size(), 80u);
}

pl::RankKernels Rank(int rank, const std::vector<std::string>& names) {
  pl::RankKernels rk;
  rk.rank = rank;
  rk.file.names = names;
  rk.file.status = "on";
  return rk;
}

pl::KernelRecord K(int name, int64_t s, int64_t dur, uint32_t stream = 7, uint32_t graph = 0, uint32_t corr = 1) {
  pl::KernelRecord r;
  r.name = name;
  r.start_ns = s;
  r.end_ns = s + dur;
  r.stream = stream;
  r.graph = graph;
  r.correlation = corr;
  return r;
}

TEST(KernelTraceJson, EventsPerStreamGraphLaunchesAndNvtx) {
  pl::RankKernels rk = Rank(3, {"void gemm<float>(float*)", "graph_kernel", "fwd"});
  rk.file.records.push_back(K(0, 1000000, 50000));
  rk.file.records.push_back(K(1, 2000000, 10000, 8, 4, 99));
  rk.file.records.push_back(K(1, 2015000, 10000, 8, 4, 99));
  pl::KernelRecord m;
  m.kind = pl::KernelKind::kMemcpy;
  m.start_ns = 3000000;
  m.end_ns = 3001000;
  m.stream = 7;
  m.bytes = 4096;
  m.copy_kind = 2;
  rk.file.records.push_back(m);
  rk.nvtx.push_back(pl::NvtxRange{900000, 1200000, 55, 2, -1});
  json events = json::array();
  EXPECT_EQ(pl::AppendKernelTraceEvents(rk, 3, 100, &events), 0u);
  ASSERT_EQ(events.size(), 6u);  // 4 records, 1 graph launch, 1 NVTX range
  EXPECT_EQ(events[0]["name"], "gemm");  // a plain type argument says little
  EXPECT_EQ(events[0]["tid"], "stream 7");
  EXPECT_EQ(events[0]["pid"], 3);
  EXPECT_DOUBLE_EQ(events[0]["ts"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(events[0]["dur"].get<double>(), 50.0);
  EXPECT_EQ(events[0]["args"]["name"], "void gemm<float>(float*)");
  EXPECT_EQ(events[1]["args"]["graph"], 4);
  EXPECT_EQ(events[3]["name"], "Memcpy DtoH");
  EXPECT_EQ(events[3]["args"]["bytes"], 4096);
  EXPECT_EQ(events[4]["name"], "graph 4");
  EXPECT_EQ(events[4]["tid"], "graphs");
  EXPECT_DOUBLE_EQ(events[4]["ts"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(events[4]["dur"].get<double>(), 25.0);
  EXPECT_EQ(events[4]["args"]["records"], 2);
  EXPECT_EQ(events[5]["name"], "fwd");
  EXPECT_EQ(events[5]["tid"], "nvtx 55");
  EXPECT_EQ(events[5]["ph"], "X");
  json capped = json::array();
  EXPECT_EQ(pl::AppendKernelTraceEvents(rk, 3, 2, &capped), 2u);
}

// A and B: 6 iteration marks 10 ms apart (5 complete iterations, the first skipped). Per iteration: gemm twice
// (at +1 ms and +5 ms), fill once at +2 ms, and one communication kernel. In B gemm is 10% longer, fill starts
// 100 us (1% of the iteration) later, and libprism's stamp replaces NCCL's kernel.
pl::RankKernels CompareSide(bool b) {
  pl::RankKernels rk = Rank(0, {"void gemm<float>(float*)", "fill", "ncclDevKernel_AllReduce", "prism_stamp"});
  const int64_t t0 = 1000000000, it = 10000000;
  for (int i = 0; i <= 5; ++i) {
    rk.iteration_index.push_back(i);
    rk.iteration_t_ns.push_back(t0 + i * it);
    if (i == 5) break;
    const int64_t w = t0 + i * it;
    const int64_t jitter = i % 2 ? 2000 : -2000;  // the run's own spread: +-2 us on 100 us
    const int64_t gemm = b ? 110000 : 100000;
    rk.file.records.push_back(K(0, w + 1000000, gemm + jitter));
    rk.file.records.push_back(K(1, w + (b ? 2100000 : 2000000), 10000));
    rk.file.records.push_back(K(0, w + 5000000, gemm + jitter));
    rk.file.records.push_back(K(b ? 3 : 2, w + 8000000, b ? 2000 : 500000, 9, b ? 0 : 6, 40 + static_cast<uint32_t>(i)));
  }
  return rk;
}

TEST(KernelCompare, DeviationAgainstNaturalVariance) {
  pl::KernelCompareOptions o;
  o.skip = 1;
  std::string error;
  auto c = pl::CompareKernels(CompareSide(false), CompareSide(true), o, &error);
  ASSERT_TRUE(c) << error;
  EXPECT_EQ((*c)["a"]["iterations"], 4);
  EXPECT_EQ((*c)["a"]["first_iteration"], 2);
  EXPECT_DOUBLE_EQ((*c)["a"]["iteration_us"].get<double>(), 10000.0);
  std::map<std::string, json> rows;
  for (const json& r : (*c)["rows"]) rows[r["name"].get<std::string>()] = r;
  ASSERT_EQ(rows.size(), 4u);
  const json& gemm = rows["void gemm<float>(float*)"];
  EXPECT_EQ(gemm["class"], "compute");
  EXPECT_EQ(gemm["short"], "gemm");
  EXPECT_DOUBLE_EQ(gemm["a"]["count"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(gemm["b"]["count"].get<double>(), 2.0);
  EXPECT_NEAR(gemm["a"]["dur_us"].get<double>(), 100.0, 2.1);
  EXPECT_NEAR(gemm["dur_dev_pct"].get<double>(), 10.0, 0.5);
  EXPECT_NEAR(gemm["a"]["dur_var_pct"].get<double>(), 2.0, 0.01);  // MAD 2 us of 100 us
  EXPECT_DOUBLE_EQ(gemm["a"]["off_us"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(gemm["off_dev_pct"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(gemm["a"]["time_us"].get<double>(), 200.0);
  const json& fill = rows["fill"];
  EXPECT_DOUBLE_EQ(fill["dur_dev_pct"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(fill["off_dev_pct"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(fill["b"]["off_us"].get<double>(), 2100.0);
  EXPECT_EQ(rows["ncclDevKernel_AllReduce"]["class"], "nccl");
  EXPECT_TRUE(rows["ncclDevKernel_AllReduce"]["b"].is_null());
  EXPECT_TRUE(rows["ncclDevKernel_AllReduce"]["graph"].get<bool>());
  EXPECT_EQ(rows["prism_stamp"]["class"], "prism");
  EXPECT_TRUE(rows["prism_stamp"]["a"].is_null());
  // Largest time per iteration first: NCCL's 500 us, then gemm.
  EXPECT_EQ((*c)["rows"][0]["name"], "ncclDevKernel_AllReduce");
  EXPECT_EQ((*c)["rows"][1]["name"], "void gemm<float>(float*)");
  const json& s = (*c)["summary"];
  EXPECT_EQ(s["instances"], 3);  // gemm #0, gemm #1, fill #0
  EXPECT_EQ(s["names_in_both"], 2);
  EXPECT_EQ(s["only_in_a"]["nccl"], 1);
  EXPECT_EQ(s["only_in_b"]["prism"], 1);
  EXPECT_DOUBLE_EQ(s["duration_deviation"]["median_pct"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(s["offset_deviation"]["p90_pct"].get<double>(), 0.8);  // 0, 0, 1%: the 90th percentile
  EXPECT_NEAR(s["duration_natural_variance_a"]["median_pct"].get<double>(), 2.0, 0.01);
  EXPECT_DOUBLE_EQ(s["iteration_time_deviation_pct"].get<double>(), 0.0);

  const std::string text = pl::KernelCompareText(*c, 3);
  EXPECT_NE(text.find("gemm "), std::string::npos) << text;
  EXPECT_NE(text.find("+10.0"), std::string::npos) << text;
  EXPECT_NE(text.find("ncclDevKernel_AllReduce [g]"), std::string::npos) << text;
  EXPECT_NE(text.find("(1 more kernels"), std::string::npos) << text;
  EXPECT_NE(text.find("duration deviation |B-A|/A         median 10.00%"), std::string::npos) << text;

  // A run against itself: no deviation, only its own spread.
  auto self = pl::CompareKernels(CompareSide(false), CompareSide(false), o, &error);
  ASSERT_TRUE(self);
  EXPECT_DOUBLE_EQ((*self)["summary"]["duration_deviation"]["p90_pct"].get<double>(), 0.0);
  EXPECT_NEAR((*self)["summary"]["duration_natural_variance_b"]["median_pct"].get<double>(), 2.0, 0.01);
}

TEST(KernelCompare, NeedsIterations) {
  pl::KernelCompareOptions o;
  std::string error;
  pl::RankKernels none = Rank(4, {"x"});
  none.file.records.push_back(K(0, 10, 10));
  EXPECT_FALSE(pl::CompareKernels(none, CompareSide(false), o, &error));
  EXPECT_NE(error.find("A rank 4: needs at least 2 iteration marks"), std::string::npos) << error;
  o.skip = 5;
  EXPECT_FALSE(pl::CompareKernels(CompareSide(false), CompareSide(false), o, &error));
  EXPECT_NE(error.find("try --skip 0"), std::string::npos) << error;
  pl::RankKernels empty = CompareSide(false);
  empty.file.records.clear();
  o.skip = 0;
  EXPECT_FALSE(pl::CompareKernels(CompareSide(false), empty, o, &error));
  EXPECT_NE(error.find("B rank 0: no kernel records"), std::string::npos) << error;
}

TEST(RunReportTrace, MergesKernelsNextToCollectives) {
  fs::path d = FreshDir("runreport");
  const int64_t h0 = 1700000000000000000;
  {
    SynthRank s(d, 3);
    s.Sync(h0, 0, 0, false);
    s.Name(0, "void gemm<float>(float*)");
    s.Kernel(h0 + 1000, h0 + 2000, 7, 0);
    s.Kernel(h0 + 3000, h0 + 4000, 8, 0, 2, 5, 33);
    s.End();
    s.Op(h0 + 5000);
  }
  pl::RunReport rep(d.string(), 8, {3});
  rep.Poll();
  json trace = rep.BuildTrace();
  int kernels = 0, ops = 0, graphs = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "kernel") ++kernels;
    if (e.value("cat", "") == "comm") ++ops;
    if (e.value("cat", "") == "graph") ++graphs;
  }
  EXPECT_EQ(kernels, 2);
  EXPECT_EQ(ops, 1);
  EXPECT_EQ(graphs, 1);
  ASSERT_TRUE(trace.contains("kernels"));
  EXPECT_EQ(trace["kernels"]["3"]["kernels"], 2);
  EXPECT_EQ(trace["kernels"]["3"]["in_graphs"], 1);
  fs::remove_all(d);
}

}  // namespace
