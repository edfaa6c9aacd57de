#include "analysis/fill_samples.h"

#include <algorithm>

namespace prism::analysis {
namespace {

std::vector<std::vector<uint32_t>> ShapeOf(const trace::RoleClass& rc) {
  std::vector<std::vector<uint32_t>> shape;
  shape.reserve(rc.streams.size());
  for (const auto& st : rc.streams) {
    std::vector<uint32_t> ids;
    ids.reserve(st.nodes.size());
    // Why the kind in the id's high bit: a compute node and a comm node with the same id are not the same shape.
    for (const auto& n : st.nodes) ids.push_back(n.id ^ (n.kind == trace::NodeKind::kCompute ? 0x80000000u : 0u));
    shape.push_back(std::move(ids));
  }
  return shape;
}

// One field of every compute node of the class, in stream then node order.
template <typename T>
std::vector<T> OfComputeNodes(const trace::RoleClass& rc, T trace::Node::*field) {
  std::vector<T> v;
  for (const auto& st : rc.streams)
    for (const auto& n : st.nodes)
      if (n.kind == trace::NodeKind::kCompute) v.push_back(n.*field);
  return v;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Compute per iteration, in seconds: the median over the iterations after the first (the set-up) of the compute
// summed per iteration; a one-iteration class: that iteration.
double PerIteration(const std::vector<double>& dur_us, const std::vector<uint32_t>& iters) {
  uint32_t last = 0;
  for (uint32_t i : iters) last = std::max(last, i);
  std::vector<double> per(last + 1, 0.0);
  for (size_t k = 0; k < dur_us.size() && k < iters.size(); ++k) per[iters[k]] += dur_us[k] > 0 ? dur_us[k] : 0;
  return 1e-6 * Median(per.size() > 1 ? std::vector<double>(per.begin() + 1, per.end()) : per);
}

}  // namespace

void FillSamples::AddSample(ClassSamples* cs, const trace::RoleClass& rc) {
  auto shape = ShapeOf(rc);
  if (shape != cs->shape) {
    cs->shape = std::move(shape);
    cs->iters = OfComputeNodes(rc, &trace::Node::iter);
    cs->samples.clear();
  }
  cs->samples.push_back(OfComputeNodes(rc, &trace::Node::dur_us));
  cs->levels.push_back(PerIteration(cs->samples.back(), cs->iters));
}

void FillSamples::Add(const trace::Trace& t, uint32_t cls) {
  if (cls >= t.classes.size()) return;
  if (classes_.size() < t.classes.size()) classes_.resize(t.classes.size());
  AddSample(&classes_[cls], t.classes[cls]);
}

void FillSamples::AddFrom(const trace::Trace& t, uint32_t src, uint32_t dst) {
  if (src >= t.classes.size() || dst >= t.classes.size()) return;
  if (classes_.size() < t.classes.size()) classes_.resize(t.classes.size());
  if (ShapeOf(t.classes[src]) != ShapeOf(t.classes[dst])) return;
  AddSample(&classes_[dst], t.classes[src]);
}

double FillSamples::SpreadPct(uint32_t cls) const {
  if (cls >= classes_.size() || classes_[cls].levels.size() < 2) return 0;
  const std::vector<double>& v = classes_[cls].levels;
  const double median = Median(v);
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return median > 0 ? 100.0 * (*hi - *lo) / median : 0;
}

std::vector<double> FillSamples::PerIterationS(uint32_t cls) const {
  return cls < classes_.size() ? classes_[cls].levels : std::vector<double>{};
}

size_t FillSamples::Count(uint32_t cls) const { return cls < classes_.size() ? classes_[cls].levels.size() : 0; }

size_t FillSamples::Apply(trace::Trace* t) const {
  size_t changed = 0;
  for (uint32_t c = 0; c < t->classes.size() && c < classes_.size(); ++c) {
    const ClassSamples& cs = classes_[c];
    if (cs.samples.empty() || ShapeOf(t->classes[c]) != cs.shape) continue;
    std::vector<double> med;
    std::vector<double> v(cs.samples.size());
    for (size_t k = 0; k < cs.samples.front().size(); ++k) {
      for (size_t s = 0; s < cs.samples.size(); ++s) v[s] = cs.samples[s][k];
      med.push_back(Median(v));
    }
    // Samples of an earlier shape: this shape's nodes at the level of all of them (the header says why).
    double scale = 1.0;
    if (cs.levels.size() > cs.samples.size()) {
      const double level = PerIteration(med, cs.iters);
      if (level > 0) scale = Median(cs.levels) / level;
    }
    size_t k = 0;
    for (auto& st : t->classes[c].streams)
      for (auto& n : st.nodes)
        if (n.kind == trace::NodeKind::kCompute) n.dur_us = med[k++] * scale;
    ++changed;
  }
  return changed;
}

}  // namespace prism::analysis
