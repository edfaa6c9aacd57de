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

std::vector<double> ComputeDurations(const trace::RoleClass& rc) {
  std::vector<double> d;
  for (const auto& st : rc.streams)
    for (const auto& n : st.nodes)
      if (n.kind == trace::NodeKind::kCompute) d.push_back(n.dur_us);
  return d;
}

}  // namespace

void FillSamples::Add(const trace::Trace& t, uint32_t cls) {
  if (cls >= t.classes.size()) return;
  if (classes_.size() < t.classes.size()) classes_.resize(t.classes.size());
  ClassSamples& cs = classes_[cls];
  auto shape = ShapeOf(t.classes[cls]);
  if (shape != cs.shape) {
    cs.shape = std::move(shape);
    cs.samples.clear();
  }
  cs.samples.push_back(ComputeDurations(t.classes[cls]));
}

void FillSamples::AddFrom(const trace::Trace& t, uint32_t src, uint32_t dst) {
  if (src >= t.classes.size() || dst >= t.classes.size()) return;
  if (classes_.size() < t.classes.size()) classes_.resize(t.classes.size());
  ClassSamples& cs = classes_[dst];
  auto shape = ShapeOf(t.classes[src]);
  if (shape != ShapeOf(t.classes[dst])) return;
  if (shape != cs.shape) {
    cs.shape = std::move(shape);
    cs.samples.clear();
  }
  cs.samples.push_back(ComputeDurations(t.classes[src]));
}

double FillSamples::SpreadPct(uint32_t cls) const {
  if (cls >= classes_.size() || classes_[cls].samples.size() < 2) return 0;
  std::vector<double> totals;
  for (const auto& s : classes_[cls].samples) {
    double t = 0;
    for (double d : s) t += d > 0 ? d : 0;
    totals.push_back(t);
  }
  std::sort(totals.begin(), totals.end());
  const size_t m = totals.size() / 2;
  const double median = totals.size() % 2 ? totals[m] : 0.5 * (totals[m - 1] + totals[m]);
  return median > 0 ? 100.0 * (totals.back() - totals.front()) / median : 0;
}

size_t FillSamples::Count(uint32_t cls) const { return cls < classes_.size() ? classes_[cls].samples.size() : 0; }

size_t FillSamples::Apply(trace::Trace* t) const {
  size_t changed = 0;
  for (uint32_t c = 0; c < t->classes.size() && c < classes_.size(); ++c) {
    const ClassSamples& cs = classes_[c];
    if (cs.samples.empty() || ShapeOf(t->classes[c]) != cs.shape) continue;
    size_t k = 0;
    std::vector<double> v(cs.samples.size());
    for (auto& st : t->classes[c].streams)
      for (auto& n : st.nodes) {
        if (n.kind != trace::NodeKind::kCompute) continue;
        for (size_t s = 0; s < cs.samples.size(); ++s) v[s] = cs.samples[s][k];
        std::sort(v.begin(), v.end());
        const size_t m = v.size() / 2;
        n.dur_us = v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
        ++k;
      }
    ++changed;
  }
  return changed;
}

}  // namespace prism::analysis
