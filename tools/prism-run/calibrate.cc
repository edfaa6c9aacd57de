// prism-run calibrate: measure intra-node NCCL collectives on this machine's GPUs (or read a measurement file) and
// fit a topology to them (src/calibrate/calibrate.h does the work; docs/calibrate.md).
#include <iostream>
#include <memory>
#include <sstream>

#include "calibrate/calibrate.h"
#include "subcommands.h"

namespace prism::cli {
namespace {

// "allreduce,sendrecv" -> ops; false + message on an unknown name.
bool ParseOps(const std::string& text, std::vector<calibrate::MeasuredOp>* out, std::string* error) {
  std::stringstream ss(text);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    calibrate::MeasuredOp op = calibrate::ParseMeasuredOp(tok);
    if (op == calibrate::MeasuredOp::kInvalid) {
      *error = "--ops: unknown op \"" + tok + "\" (known: allreduce, allgather, reducescatter, broadcast, alltoall, "
               "sendrecv)";
      return false;
    }
    out->push_back(op);
  }
  return true;
}

}  // namespace

void AddCalibrate(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand(
      "calibrate",
      "measure NCCL collectives between this machine's GPUs and fit the cost model's intra-node parameters, or fit a "
      "measurement file (--from, no GPU needed); writes a topology file for --topology");
  auto o = std::make_shared<calibrate::CalibrateOptions>();
  auto min_bytes = std::make_shared<std::string>("8");
  auto max_bytes = std::make_shared<std::string>("256M");
  auto ops = std::make_shared<std::string>();
  sub->add_option("--from", o->from, "fit this measurement file instead of measuring (no GPU needed)");
  sub->add_option("--out", o->out, "calibrated topology to write")->capture_default_str();
  sub->add_option("--measurements-out", o->measurements_out,
                  "where the measurements go (default: OUT with .json replaced by .measurements.json)");
  sub->add_option("--base", o->fit.base,
                  "topology to start from: preset name or file (default: the preset for the measured GPU, e.g. "
                  "h200-8x400g)");
  sub->add_option("--name", o->fit.name, "name of the calibrated topology (default: <base>-calibrated)");
  sub->add_flag("--keep-nvls", o->fit.keep_nvls,
                "keep the base's nccl.nvls even when NVLS was off while measuring (it is then not calibrated)");
  sub->add_option("--poor-fit-pct", o->fit.poor_fit_pct,
                  "report points the calibrated model misses by more than this many percent")
      ->capture_default_str()
      ->check(Positive());
  sub->add_option("--gpus", o->measure.gpus, "GPUs to measure on, devices 0..N-1 (default: every visible GPU)")
      ->check(CLI::Range(2, 1 << 16));
  sub->add_option("--min-bytes", *min_bytes, "smallest message (S as nccl-tests counts it)")->capture_default_str();
  sub->add_option("--max-bytes", *max_bytes, "largest message")->capture_default_str();
  sub->add_option("--step", o->measure.step, "size multiplier between messages")->capture_default_str()->check(
      CLI::Range(2, 1024));
  sub->add_option("--ops", *ops,
                  "what to measure, comma-separated (default all: allreduce,allgather,reducescatter,broadcast,"
                  "alltoall,sendrecv)");
  sub->add_option("--comm-sizes", o->measure.comm_sizes,
                  "communicator sizes for collectives (default: 2, 4, 8, ... and the GPU count)")
      ->delimiter(',');
  sub->add_flag("--all-pairs", o->measure.all_pairs,
                "send/receive between every ordered pair of GPUs (default: GPU 0 to each other GPU)");
  sub->add_option("--warmup", o->measure.warmup, "warm-up calls per point (also used to size the timed run)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  sub->add_option("--target-ms", o->measure.target_ms, "timed duration per point, in ms")
      ->capture_default_str()
      ->check(Positive());
  sub->add_option("--max-iters", o->measure.max_iters, "most timed calls per point")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--timeout", o->measure.timeout_s, "seconds one point may take before calibrate gives up")
      ->capture_default_str()
      ->check(Positive());
  sub->add_option("--nccl", o->measure.nccl_path,
                  "NCCL library to load (default: the nvidia.nccl package of $PRISM_PYTHON, $PYTHON or python3 "
                  "(PyTorch's), then libnccl.so.2)");
  sub->add_flag("--quiet", [o](int64_t) { o->per_point = false; }, "print the fit's summary, not every point");
  sub->callback([rc, o, min_bytes, max_bytes, ops] {
    std::string error;
    if (!calibrate::ParseByteSize(*min_bytes, &o->measure.min_bytes, &error) ||
        !calibrate::ParseByteSize(*max_bytes, &o->measure.max_bytes, &error) ||
        !ParseOps(*ops, &o->measure.ops, &error)) {
      std::cerr << "prism-run calibrate: " << error << "\n";
      *rc = kExitBadInput;
      return;
    }
    if (o->measure.min_bytes > o->measure.max_bytes) {
      std::cerr << "prism-run calibrate: --min-bytes is larger than --max-bytes\n";
      *rc = kExitBadInput;
      return;
    }
    o->fit.prism_version = PRISM_VERSION;
    *rc = calibrate::RunCalibrate(*o, std::cout, std::cerr);
  });
}

}  // namespace prism::cli
