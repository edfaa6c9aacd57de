// Measurement sets computed from a topology's own cost model (no GPU): for tests of the fit and for trying
// `prism-run calibrate --from` without a GPU. Labelled as synthetic in the file (host "synthetic").
#pragma once

#include <cstdint>
#include <vector>

#include "calibrate/measurements.h"
#include "replay/topology.h"

namespace prism::calibrate {

struct SyntheticSpec {
  std::string gpu_name = "synthetic";
  int compute_capability = 90;
  int gpus = 8;
  std::vector<int> comm_sizes = {2, 4, 8};
  std::vector<MeasuredOp> ops;     // empty = every op
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 256ull << 20;
  int step = 4;
  double noise_pct = 0.0;          // each time x (1 + u x noise / 100), u uniform in [-1, 1]
  uint32_t seed = 1;
  bool nvls_allowed = false;       // false: as measured with NCCL_NVLS_ENABLE=0
};

// Every (op, communicator size, message size) of `spec`, timed by `truth`'s model (its "model" key), with send/
// receive from GPU 0 to each other GPU. Sizes are rounded like the measurer rounds them.
MeasurementSet Synthesize(const replay::Topology& truth, const SyntheticSpec& spec);

}  // namespace prism::calibrate
