// The compute durations a fill has measured for each class, one sample per slice that ran a rank of the class, and
// their per-node median (launcher/fill.h; docs/fill.md "Rounds and noise").
//
// Why: the graph builder takes the waits on virtual peers out of a slice's compute (the release stamps), so every
// slice of a class measures the same compute again, with the run-to-run noise of the machine (~5 % per iteration on
// a launch-bound model); the last slice alone keeps that noise and the rounds never settle within --tolerance. The
// median over the slices of a class keeps a slow outlier (a busy host) out as well.
//
// A slice whose class comes out with another shape (a gap that closed or opened: another node count) cannot be
// pooled node by node with the earlier ones; its nodes start the class's per-node samples over, but its level (the
// compute per iteration) stays pooled with every earlier slice's: the class's nodes are then scaled so that their
// compute per iteration is the median of all its slices'. Why: on the H200 the medium GPT's classes changed shape in
// most slices, so the per-node median never held more than one sample and a slice's host speed (+-15 % from one
// process to the next on an idle machine) went straight into the graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "prism/trace.h"

namespace prism::analysis {

class FillSamples {
 public:
  // Adds class `cls` of `t` as a new sample. A class whose streams differ in shape from the earlier samples (other
  // streams, other node counts, kinds or ids) starts its per-node samples over from this one; its level (compute per
  // iteration) joins the earlier levels. Out-of-range classes are ignored.
  void Add(const trace::Trace& t, uint32_t cls);
  // Adds class `src` of `t` as a sample of class `dst` (a symmetric position timed by src's slice; the caller has
  // checked that the two have the same operations in the same order). Same rules as Add for dst's shape.
  void AddFrom(const trace::Trace& t, uint32_t src, uint32_t dst);
  // Sets every compute node's dur_us in `t` to the median of that node's samples (an even count: the mean of the two
  // middle ones), for every class with a sample of the same shape; when the class also has samples of an earlier
  // shape, its compute nodes are then scaled so that their compute per iteration is the median of every sample's.
  // Other nodes and classes stay as they are. Returns the number of classes changed.
  size_t Apply(trace::Trace* t) const;
  // The slices that sampled class `cls`, of any shape (0 when none).
  size_t Count(uint32_t cls) const;
  // How much the class's compute moved between its samples: (largest - smallest) / median of each sample's summed
  // compute, in percent; 0 with fewer than two samples. The fill's tolerance cannot be met below it.
  double SpreadPct(uint32_t cls) const;
  // Each sample's compute per iteration, in seconds, oldest first: the median over the sample's iterations (from
  // the second one: the first holds the job's set-up) of the compute summed per iteration. The fill prints it per
  // slice, so that a user sees how much a class's compute moves between runs.
  std::vector<double> PerIterationS(uint32_t cls) const;
  size_t Classes() const { return classes_.size(); }

 private:
  struct ClassSamples {
    std::vector<std::vector<uint32_t>> shape;   // per stream: node ids
    std::vector<uint32_t> iters;                 // per compute node, in stream order: its iteration
    std::vector<std::vector<double>> samples;   // per sample of this shape: compute dur_us in stream order
    std::vector<double> levels;                  // per sample of any shape, oldest first: compute per iteration (s)
  };
  void AddSample(ClassSamples* cs, const trace::RoleClass& rc);
  std::vector<ClassSamples> classes_;
};

}  // namespace prism::analysis
