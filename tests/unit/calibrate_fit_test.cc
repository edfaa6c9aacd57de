// The calibration fit (src/calibrate/fit.h) on measurements synthesized from known topologies: it recovers the
// parameters it fits, keeps a base that already matches, flags what it cannot fit, writes a topology every
// --topology option loads, and rejects malformed measurement files. Also the topology keys calibration adds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "calibrate/fit.h"
#include "calibrate/measurements.h"
#include "calibrate/synthetic.h"
#include "replay/cost_model.h"
#include "replay/topology.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace prism::calibrate;
using prism::replay::CommShape;
using prism::replay::CostModel;
using prism::replay::LoadTopology;
using prism::replay::Topology;
using prism::trace::CollOp;
using prism::trace::DType;

Topology Preset(const std::string& name) {
  Topology t;
  std::string err;
  EXPECT_TRUE(LoadTopology(name, &t, &err)) << err;
  return t;
}

// A cluster unlike the preset: slower NVLink, a per-call overhead, slower p2p.
Topology Truth() {
  Topology t = Preset("h200-8x400g");
  t.name = "truth";
  t.nvlink_bw_GBps = 300.0;
  t.nccl_intra_latency_offset_us = 4.0;
  t.p2p_intra = {9.0, 150.0};
  return t;
}

double ModelTime(const Topology& topo, CollOp op, int n, uint64_t bytes, bool nvls) {
  Topology t = topo;
  t.nvls = t.nvls && nvls;
  CostModel m;
  std::string err;
  EXPECT_TRUE(m.Init(t, {}, &err)) << err;
  CommShape s;
  s.nranks = s.local_ranks = n;
  return m.Collective(m.Tune(s), op, bytes, DType::kF32).time_us;
}

TEST(CalibrateFit, RecoversTheNcclModelsParametersFromNoisyMeasurements) {
  Topology truth = Truth();
  SyntheticSpec spec;
  spec.noise_pct = 3.0;
  MeasurementSet set = Synthesize(truth, spec);
  ASSERT_GT(set.results.size(), 150u);
  FitOptions fo;
  fo.base = "h200-8x400g";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  EXPECT_TRUE(r.fitted_nccl && r.fitted_p2p && r.fitted_ab);
  const Topology& c = r.calibrated;
  EXPECT_NEAR(c.nccl_intra_latency_offset_us, 4.0, 0.5);
  // The model is piecewise constant in the link bandwidth (channels x speed): what must match is what it predicts.
  for (int n : {2, 4, 8}) {
    for (CollOp op : {CollOp::kAllReduce, CollOp::kAllGather, CollOp::kReduceScatter, CollOp::kBroadcast}) {
      for (uint64_t b : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{64} << 20, uint64_t{256} << 20}) {
        double want = ModelTime(truth, op, n, b, false), got = ModelTime(c, op, n, b, false);
        EXPECT_NEAR(got / want, 1.0, 0.03) << prism::trace::ToString(op) << " n=" << n << " " << b << " B";
      }
    }
  }
  EXPECT_NEAR(c.p2p_intra.latency_us, 9.0, 0.5);
  EXPECT_NEAR(c.p2p_intra.bandwidth_GBps / 150.0, 1.0, 0.03);
  ErrorStats before = Stats(r.points, Column::kNcclBefore), after = Stats(r.points, Column::kNcclAfter);
  EXPECT_GT(before.rms_pct, 10.0);
  EXPECT_LT(after.rms_pct, 3.0);  // the noise is +-3 %
  EXPECT_LT(after.max_abs_pct, 6.0);
  EXPECT_EQ(r.calibration["poorly_fitted"].size(), 0u) << r.calibration["poorly_fitted"].dump();
  // Shown by `ctest -R CalibrateFit -V` and quoted in docs/calibrate.md (synthetic data).
  std::printf("synthetic fit: NVLink %.1f -> %.1f GB/s (truth 300), offset %.2f us (truth 4), p2p.intra %.2f us "
              "%.1f GB/s (truth 9 us 150 GB/s); NCCL model rms error %.1f%% -> %.1f%% over %d points\n",
              r.intra_bw_before, r.intra_bw_after, c.nccl_intra_latency_offset_us, c.p2p_intra.latency_us,
              c.p2p_intra.bandwidth_GBps, before.rms_pct, after.rms_pct, after.points);
}

TEST(CalibrateFit, RecoversTheAlphaBetaParameters) {
  Topology truth = Preset("alpha-beta-simple");
  truth.ab_intra = {3.0, 80.0};
  SyntheticSpec spec;
  spec.noise_pct = 1.0;
  spec.seed = 7;
  MeasurementSet set = Synthesize(truth, spec);
  FitOptions fo;
  fo.base = "h100-8x400g";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  EXPECT_NEAR(r.calibrated.ab_intra.latency_us, 3.0, 0.1);
  EXPECT_NEAR(r.calibrated.ab_intra.bandwidth_GBps / 80.0, 1.0, 0.02);
  EXPECT_LT(Stats(r.points, Column::kAbAfter).max_abs_pct, 2.5);
  EXPECT_GT(Stats(r.points, Column::kAbBefore).rms_pct, 50.0);
}

TEST(CalibrateFit, KeepsABaseThatAlreadyMatches) {
  Topology base = Preset("h200-8x400g");
  MeasurementSet set = Synthesize(base, SyntheticSpec{});
  FitOptions fo;  // base from the GPU name below
  set.gpu_name = "NVIDIA H200";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  EXPECT_EQ(r.base_spec, "h200-8x400g");
  EXPECT_DOUBLE_EQ(r.calibrated.nvlink_bw_GBps, base.nvlink_bw_GBps);
  EXPECT_NEAR(r.calibrated.nccl_intra_latency_offset_us, 0.0, 0.02);
  EXPECT_NEAR(r.calibrated.p2p_intra.latency_us, base.p2p_intra.latency_us, 0.01);
  EXPECT_NEAR(r.calibrated.p2p_intra.bandwidth_GBps, base.p2p_intra.bandwidth_GBps, 0.1);
  EXPECT_LT(Stats(r.points, Column::kNcclAfter).max_abs_pct, 0.5);
  EXPECT_EQ(r.calibrated.name, "h200-8x400g-calibrated");
  EXPECT_EQ(r.calibrated.gpu, "NVIDIA H200");
}

TEST(CalibrateFit, FlagsSizesTheModelCannotFit) {
  MeasurementSet set = Synthesize(Preset("h200-8x400g"), SyntheticSpec{});
  for (Measurement& m : set.results) {
    if (m.op == MeasuredOp::kAllReduce && m.nranks == 2 && m.bytes <= 32) m.time_us *= 4;  // a latency the model lacks
  }
  FitOptions fo;
  fo.base = "h200-8x400g";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  bool noted = false;
  for (const std::string& n : r.notes) noted = noted || n.find("not fitted well by the NCCL model: allreduce n=2") == 0;
  EXPECT_TRUE(noted);
  ASSERT_GE(r.calibration["poorly_fitted"].size(), 1u);
  EXPECT_EQ(r.calibration["poorly_fitted"][0]["op"], "allreduce");
  std::stringstream out;
  PrintFit(r, out);
  EXPECT_NE(out.str().find("not fitted well"), std::string::npos) << out.str();
}

TEST(CalibrateFit, NvlsOffWhileMeasuringTurnsItOffUnlessKept) {
  MeasurementSet set = Synthesize(Preset("h200-8x400g"), SyntheticSpec{});
  ASSERT_FALSE(set.NvlsAllowed());
  FitOptions fo;
  fo.base = "h200-8x400g";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  EXPECT_FALSE(r.calibrated.nvls);
  EXPECT_EQ(r.calibration["fitted"]["nccl.nvls"]["after"], false);
  fo.keep_nvls = true;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  EXPECT_TRUE(r.calibrated.nvls);
  // Measured with NVLS allowed: nothing to turn off.
  SyntheticSpec with;
  with.nvls_allowed = true;
  fo.keep_nvls = false;
  ASSERT_TRUE(Fit(Synthesize(Preset("h200-8x400g"), with), fo, &r, &err)) << err;
  EXPECT_TRUE(r.calibrated.nvls);
  EXPECT_LT(Stats(r.points, Column::kNcclAfter).max_abs_pct, 0.5);
}

TEST(CalibrateFit, OnlySendRecvKeepsTheNcclKeysAndSaysSo) {
  SyntheticSpec spec;
  spec.ops = {MeasuredOp::kSendRecv};
  spec.gpus = 2;
  MeasurementSet set = Synthesize(Truth(), spec);
  FitOptions fo;
  fo.base = "h200-8x400g";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  EXPECT_FALSE(r.fitted_nccl);
  EXPECT_TRUE(r.fitted_p2p);
  EXPECT_DOUBLE_EQ(r.calibrated.nvlink_bw_GBps, Preset("h200-8x400g").nvlink_bw_GBps);
  EXPECT_NEAR(r.calibrated.p2p_intra.bandwidth_GBps, 150.0, 0.2);
  bool noted = false;
  for (const std::string& n : r.notes) noted = noted || n.find("no NCCL collective was measured") == 0;
  EXPECT_TRUE(noted);
}

TEST(CalibrateFit, RefusesABaseWithFewerGpusPerNodeThanMeasured) {
  MeasurementSet set = Synthesize(Preset("h200-8x400g"), SyntheticSpec{});
  FitOptions fo;
  fo.base = R"({"name": "small", "node": {"gpus": 4}})";
  FitResult r;
  std::string err;
  EXPECT_FALSE(Fit(set, fo, &r, &err));
  EXPECT_NE(err.find("4 GPU(s) per node"), std::string::npos) << err;
  fo.base = "no-such-preset";
  EXPECT_FALSE(Fit(set, fo, &r, &err));
  EXPECT_NE(err.find("--base"), std::string::npos) << err;
  set.gpu_name = "Some Future GPU";
  set.compute_capability = 120;
  fo.base = "";
  EXPECT_FALSE(Fit(set, fo, &r, &err));
  EXPECT_NE(err.find("pass --base"), std::string::npos) << err;
}

TEST(CalibrateFit, WritesATopologyThatLoadsWithItsMetadata) {
  MeasurementSet set = Synthesize(Truth(), SyntheticSpec{});
  set.gpu_name = "NVIDIA H200";
  FitOptions fo;
  fo.base = "h200-8x400g";
  fo.measurements_file = "/tmp/meas.json";
  fo.prism_version = "9.9.9";
  FitResult r;
  std::string err;
  ASSERT_TRUE(Fit(set, fo, &r, &err)) << err;
  fs::path p = fs::path(testing::TempDir()) / ("calib_topo_" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(WriteTopologyFile(p.string(), r.calibrated, &err)) << err;
  Topology back;
  ASSERT_TRUE(LoadTopology(p.string(), &back, &err)) << err;
  fs::remove(p);
  EXPECT_DOUBLE_EQ(back.nvlink_bw_GBps, r.calibrated.nvlink_bw_GBps);
  EXPECT_DOUBLE_EQ(back.nccl_intra_latency_offset_us, r.calibrated.nccl_intra_latency_offset_us);
  EXPECT_DOUBLE_EQ(back.p2p_intra.bandwidth_GBps, r.calibrated.p2p_intra.bandwidth_GBps);
  EXPECT_DOUBLE_EQ(back.ab_intra.latency_us, r.calibrated.ab_intra.latency_us);
  EXPECT_EQ(back.nvls, r.calibrated.nvls);
  EXPECT_EQ(back.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(back.nic_bw_GBps, 50.0);  // inter-node keys stay the base's
  ASSERT_TRUE(back.calibration.is_object());
  EXPECT_EQ(back.calibration["gpu"], "NVIDIA H200");
  EXPECT_EQ(back.calibration["nccl_version"], "2.28.9");
  EXPECT_EQ(back.calibration["measurements_file"], "/tmp/meas.json");
  EXPECT_EQ(back.calibration["base_topology"], "h200-8x400g");
  EXPECT_EQ(back.calibration["prism_version"], "9.9.9");
  EXPECT_TRUE(back.calibration.contains("created"));
  EXPECT_TRUE(back.calibration["error"]["all"]["nccl_after"].contains("rms_pct"));
  EXPECT_NE(back.description.find("Calibrated by prism-run calibrate"), std::string::npos);
}

TEST(CalibrateFit, BasePresetForTheMeasuredGpu) {
  EXPECT_EQ(BasePresetFor("NVIDIA H200", 90), "h200-8x400g");
  EXPECT_EQ(BasePresetFor("NVIDIA H100 80GB HBM3", 90), "h100-8x400g");
  EXPECT_EQ(BasePresetFor("NVIDIA A100-SXM4-80GB", 80), "a100-8x200g");
  EXPECT_EQ(BasePresetFor("Unknown Hopper", 90), "h100-8x400g");
  EXPECT_EQ(BasePresetFor("Unknown", 75), "");
}

// ---- The topology keys calibration adds (src/replay/topology.cc, cost_model.cc).

TEST(CalibrateTopology, LatencyOffsetAndCalibrationKeys) {
  Topology t;
  std::string err;
  ASSERT_TRUE(LoadTopology(R"({"nccl": {"intra_latency_offset_us": -1.5}, "calibration": {"gpu": "x"}})", &t, &err))
      << err;
  EXPECT_DOUBLE_EQ(t.nccl_intra_latency_offset_us, -1.5);
  EXPECT_EQ(t.calibration["gpu"], "x");
  json j = prism::replay::TopologyToJson(t);
  EXPECT_EQ(j["nccl"]["intra_latency_offset_us"], -1.5);
  EXPECT_EQ(j["calibration"]["gpu"], "x");
  // Presets write neither key.
  json p = prism::replay::TopologyToJson(Preset("h100-8x400g"));
  EXPECT_FALSE(p["nccl"].contains("intra_latency_offset_us"));
  EXPECT_FALSE(p.contains("calibration"));
  EXPECT_FALSE(LoadTopology(R"({"nccl": {"intra_latency_offset_us": "3"}})", &t, &err));
  EXPECT_NE(err.find("intra_latency_offset_us"), std::string::npos) << err;
  EXPECT_FALSE(LoadTopology(R"({"nccl": {"intra_latency_offset_us": -5000}})", &t, &err));
  EXPECT_NE(err.find("out of range"), std::string::npos) << err;
  EXPECT_FALSE(LoadTopology(R"({"calibration": [1]})", &t, &err));
  EXPECT_NE(err.find("calibration"), std::string::npos) << err;
}

TEST(CalibrateTopology, OffsetAppliesToOneNodeCollectivesOnly) {
  Topology base = Preset("h100-8x400g");
  Topology off = base;
  off.nccl_intra_latency_offset_us = 5.0;
  CostModel a, b;
  std::string err;
  ASSERT_TRUE(a.Init(base, {}, &err) && b.Init(off, {}, &err)) << err;
  CommShape one{8, 1, 8}, two{16, 2, 8};
  auto t = [](const CostModel& m, CommShape s, CollOp op) {
    return m.Collective(m.Tune(s), op, 1 << 20, DType::kBF16).time_us;
  };
  EXPECT_NEAR(t(b, one, CollOp::kAllReduce) - t(a, one, CollOp::kAllReduce), 5.0, 1e-9);
  EXPECT_NEAR(t(b, one, CollOp::kAllGather) - t(a, one, CollOp::kAllGather), 5.0, 1e-9);
  EXPECT_DOUBLE_EQ(t(b, two, CollOp::kAllReduce), t(a, two, CollOp::kAllReduce));
  EXPECT_DOUBLE_EQ(b.SendRecv(1 << 20, 0, 1).time_us, a.SendRecv(1 << 20, 0, 1).time_us);
  EXPECT_DOUBLE_EQ(t(b, one, CollOp::kAllToAll), t(a, one, CollOp::kAllToAll));  // p2p, not NCCL's tuner
  EXPECT_EQ(b.Collective(b.Tune(one), CollOp::kAllReduce, 1 << 20, DType::kBF16).algo,
            a.Collective(a.Tune(one), CollOp::kAllReduce, 1 << 20, DType::kBF16).algo);
}

// ---- Measurement files.

json GoodFile() {
  return json::parse(R"({
    "format": "prism-calibrate-measurements", "version": 1, "created": "2026-11-29T20:00:00Z", "host": "h",
    "gpu": {"name": "NVIDIA H200", "compute_capability": 90, "count": 2},
    "nccl": {"version": "2.28.9", "library": "/x/libnccl.so.2", "env": {"NCCL_NVLS_ENABLE": "0"}},
    "cuda_driver_version": 13000, "dtype": "f32",
    "results": [
      {"op": "allreduce", "nranks": 2, "bytes": 1048576, "iterations": 100, "time_us": 10.5},
      {"op": "sendrecv", "nranks": 2, "src": 0, "dst": 1, "bytes": 8, "iterations": 100, "time_us": 7.0}
    ]})");
}

TEST(CalibrateMeasurements, ReadsAndRoundTrips) {
  MeasurementSet s;
  std::string err;
  ASSERT_TRUE(MeasurementsFromJson(GoodFile(), &s, &err)) << err;
  ASSERT_EQ(s.results.size(), 2u);
  EXPECT_EQ(s.gpu_count, 2);
  EXPECT_FALSE(s.NvlsAllowed());
  EXPECT_EQ(s.results[0].op, MeasuredOp::kAllReduce);
  EXPECT_NEAR(s.results[0].algbw_GBps, 1048576 / 10.5e3, 1e-9);
  EXPECT_NEAR(s.results[0].busbw_GBps, s.results[0].algbw_GBps * 1.0, 1e-9);  // 2(n-1)/n = 1 for n = 2
  EXPECT_EQ(s.results[1].dst, 1);
  MeasurementSet back;
  ASSERT_TRUE(MeasurementsFromJson(MeasurementsToJson(s), &back, &err)) << err;
  EXPECT_EQ(MeasurementsToJson(back), MeasurementsToJson(s));
}

TEST(CalibrateMeasurements, RejectsMalformedFilesNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"not an object", [](json& j) { j = json::array(); }, "must be a JSON object"},
      {"format", [](json& j) { j["format"] = "nccl-tests"; }, "measurements.format"},
      {"version", [](json& j) { j["version"] = 2; }, "measurements.version"},
      {"no gpu", [](json& j) { j.erase("gpu"); }, "missing \"gpu\""},
      {"one gpu", [](json& j) { j["gpu"]["count"] = 1; }, "measurements.gpu.count"},
      {"no nccl version", [](json& j) { j["nccl"].erase("version"); }, "missing \"version\""},
      {"env not strings", [](json& j) { j["nccl"]["env"]["NCCL_ALGO"] = 3; }, "nccl.env.NCCL_ALGO"},
      {"dtype", [](json& j) { j["dtype"] = "f128"; }, "measurements.dtype"},
      {"no results", [](json& j) { j["results"] = json::array(); }, "nothing was measured"},
      {"results not array", [](json& j) { j["results"] = 3; }, "must be an array"},
      {"unknown op", [](json& j) { j["results"][0]["op"] = "allreduce_perf"; }, "results[0].op"},
      {"nranks above count", [](json& j) { j["results"][0]["nranks"] = 4; }, "results[0].nranks"},
      {"negative time", [](json& j) { j["results"][0]["time_us"] = -1.0; }, "results[0].time_us"},
      {"zero time", [](json& j) { j["results"][0]["time_us"] = 0; }, "must be positive"},
      {"string time", [](json& j) { j["results"][0]["time_us"] = "10"; }, "must be a number"},
      {"zero bytes", [](json& j) { j["results"][0]["bytes"] = 0; }, "results[0].bytes"},
      {"fraction bytes", [](json& j) { j["results"][0]["bytes"] = 1.5; }, "must be an integer"},
      {"no iterations", [](json& j) { j["results"][0].erase("iterations"); }, "missing \"iterations\""},
      {"same src dst", [](json& j) { j["results"][1]["dst"] = 0; }, "results[1]: src and dst"},
      {"p2p nranks", [](json& j) { j["results"][1]["nranks"] = 3; }, "results[1].nranks"},
      {"p2p no src", [](json& j) { j["results"][1].erase("src"); }, "missing \"src\""},
  };
  for (const Case& c : cases) {
    json j = GoodFile();
    c.edit(j);
    MeasurementSet s;
    std::string err;
    EXPECT_FALSE(MeasurementsFromJson(j, &s, &err)) << c.what;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": " << err;
  }
}

TEST(CalibrateMeasurements, LoadNamesTheFile) {
  fs::path p = fs::path(testing::TempDir()) / ("calib_bad_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << "{ not json";
  MeasurementSet s;
  std::string err;
  EXPECT_FALSE(LoadMeasurements(p.string(), &s, &err));
  EXPECT_NE(err.find(p.string() + ": not valid JSON"), std::string::npos) << err;
  fs::remove(p);
  EXPECT_FALSE(LoadMeasurements(p.string(), &s, &err));
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
}

TEST(CalibrateMeasurements, NcclVersionString) {
  EXPECT_EQ(NcclVersionString(22809), "2.28.9");
  EXPECT_EQ(NcclVersionString(21903), "2.19.3");
  EXPECT_EQ(NcclVersionString(2804), "2.8.4");
  EXPECT_EQ(NcclVersionString(0), "unknown");
}

}  // namespace
