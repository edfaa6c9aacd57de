// The compute durations a fill has measured for each class, one sample per slice that ran a rank of the class, and
// their per-node median (launcher/fill.h; docs/fill.md "Rounds and noise").
//
// Why: the graph builder takes the waits on virtual peers out of a slice's compute (the release stamps), so every
// slice of a class measures the same compute again, with the run-to-run noise of the machine (~5 % per iteration on
// a launch-bound model); the last slice alone keeps that noise and the rounds never settle within --tolerance. The
// median over the slices of a class keeps a slow outlier (a busy host) out as well.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "prism/trace.h"

namespace prism::analysis {

class FillSamples {
 public:
  // Adds class `cls` of `t` as a new sample. A class whose streams differ in shape from the earlier samples (other
  // streams, other node counts, kinds or ids) starts over from this one. Out-of-range classes are ignored.
  void Add(const trace::Trace& t, uint32_t cls);
  // Adds class `src` of `t` as a sample of class `dst` (a symmetric position timed by src's slice; the caller has
  // checked that the two have the same operations in the same order). Same rules as Add for dst's shape.
  void AddFrom(const trace::Trace& t, uint32_t src, uint32_t dst);
  // Sets every compute node's dur_us in `t` to the median of that node's samples (an even count: the mean of the two
  // middle ones), for every class with a sample of the same shape; other nodes and classes stay as they are.
  // Returns the number of classes changed.
  size_t Apply(trace::Trace* t) const;
  // The samples held for class `cls` (0 when none).
  size_t Count(uint32_t cls) const;
  // How much the class's compute moved between its samples: (largest - smallest) / median of each sample's summed
  // compute, in percent; 0 with fewer than two samples. The fill's tolerance cannot be met below it.
  double SpreadPct(uint32_t cls) const;
  size_t Classes() const { return classes_.size(); }

 private:
  struct ClassSamples {
    std::vector<std::vector<uint32_t>> shape;   // per stream: node ids
    std::vector<std::vector<double>> samples;   // per sample: compute dur_us in stream order (all streams)
  };
  std::vector<ClassSamples> classes_;
};

}  // namespace prism::analysis
