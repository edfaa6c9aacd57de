#include "calibrate/synthetic.h"

#include <algorithm>
#include <random>

#include "calibrate/measure.h"
#include "replay/cost_model.h"

namespace prism::calibrate {

MeasurementSet Synthesize(const replay::Topology& truth, const SyntheticSpec& spec) {
  MeasurementSet s;
  s.created = UtcNow();
  s.host = "synthetic";
  s.gpu_name = spec.gpu_name;
  s.compute_capability = spec.compute_capability;
  s.gpu_count = spec.gpus;
  s.nccl_version = "2.28.9";
  s.nccl_library = "synthetic (topology " + truth.name + ")";
  if (!spec.nvls_allowed) s.nccl_env["NCCL_NVLS_ENABLE"] = "0";

  replay::Topology t = truth;
  t.rank_node.clear();
  t.nvls = t.nvls && spec.nvls_allowed;
  replay::CostModel model;
  std::string err;
  replay::CostModelOptions o;
  if (!model.Init(t, o, &err)) return s;
  std::mt19937 rng(spec.seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto noisy = [&](double us) { return us * (1.0 + u(rng) * spec.noise_pct / 100.0); };
  auto wanted = [&](MeasuredOp op) {
    return spec.ops.empty() || std::find(spec.ops.begin(), spec.ops.end(), op) != spec.ops.end();
  };
  const std::vector<uint64_t> sizes = SizeLadder(spec.min_bytes, spec.max_bytes, spec.step);
  for (int n : spec.comm_sizes) {
    replay::CommShape shape;
    shape.nranks = shape.local_ranks = n;
    shape.nnodes = 1;
    replay::CommTuning tuning = model.Tune(shape);
    for (MeasuredOp op : {MeasuredOp::kAllReduce, MeasuredOp::kAllGather, MeasuredOp::kReduceScatter,
                          MeasuredOp::kBroadcast, MeasuredOp::kAllToAll}) {
      if (!wanted(op)) continue;
      uint64_t last = 0;
      for (uint64_t b0 : sizes) {
        uint64_t b = RoundBytes(op, b0, n, 4);
        if (b == last) continue;
        last = b;
        Measurement m;
        m.op = op;
        m.nranks = n;
        m.bytes = b;
        m.iterations = 100;
        m.time_us = noisy(model.Collective(tuning, CollOpOf(op), b, trace::DType::kF32).time_us);
        FillBandwidth(&m);
        s.results.push_back(m);
      }
    }
  }
  if (wanted(MeasuredOp::kSendRecv)) {
    for (int dst = 1; dst < spec.gpus; ++dst) {
      uint64_t last = 0;
      for (uint64_t b0 : sizes) {
        uint64_t b = RoundBytes(MeasuredOp::kSendRecv, b0, 2, 4);
        if (b == last) continue;
        last = b;
        Measurement m;
        m.op = MeasuredOp::kSendRecv;
        m.nranks = 2;
        m.src = 0;
        m.dst = dst;
        m.bytes = b;
        m.iterations = 100;
        m.time_us = noisy(model.SendRecv(b, 0, 1).time_us);
        FillBandwidth(&m);
        s.results.push_back(m);
      }
    }
  }
  return s;
}

}  // namespace prism::calibrate
