#include "analysis/fill_samples.h"

#include <gtest/gtest.h>

namespace prism::analysis {
namespace {

using trace::NodeKind;

// One class, two streams: compute, all-reduce, compute on the first; a compute on the second.
trace::Trace OneClass(double a, double b, double c, uint32_t classes = 1) {
  trace::Trace t;
  t.world_size = 1;
  for (uint32_t k = 0; k < classes; ++k) {
    trace::RoleClass rc;
    rc.comm_slots = {"tp"};
    trace::Stream s0, s1;
    trace::Node n;
    n.id = 0, n.kind = NodeKind::kCompute, n.dur_us = a;
    s0.nodes.push_back(n);
    n = {};
    n.id = 1, n.kind = NodeKind::kColl, n.comm_slot = 0, n.dur_us = 7;
    s0.nodes.push_back(n);
    n = {};
    n.id = 2, n.kind = NodeKind::kCompute, n.dur_us = b;
    s0.nodes.push_back(n);
    n = {};
    n.id = 3, n.kind = NodeKind::kCompute, n.dur_us = c;
    s1.nodes.push_back(n);
    rc.streams = {s0, s1};
    t.classes.push_back(rc);
  }
  return t;
}

// OneClass over three iterations: stream 0's compute in iteration 0 (the set-up), its all-reduce, its compute in
// iteration 1; stream 1's compute in iteration 2.
trace::Trace WithIters(double a, double b, double c) {
  trace::Trace t = OneClass(a, b, c);
  t.classes[0].streams[0].nodes[2].iter = 1;
  t.classes[0].streams[1].nodes[0].iter = 2;
  return t;
}

double Dur(const trace::Trace& t, uint32_t cls, size_t stream, size_t node) {
  return t.classes[cls].streams[stream].nodes[node].dur_us;
}

// Each compute node is the median over the class's slices, of two their mean (docs/fill.md): a slice slowed by a
// busy host (on the GPU, 1.2-1.7x a quiet run's compute; here 400 against 100-140) stays out once there are three.
TEST(FillSamples, EachComputeNodeIsTheMedianOfTheClassesSlices) {
  FillSamples s;
  s.Add(OneClass(100, 200, 50), 0);
  trace::Trace t = OneClass(999, 999, 999);
  EXPECT_EQ(s.Apply(&t), 1u);
  EXPECT_EQ(Dur(t, 0, 0, 0), 100);  // one sample: itself
  EXPECT_EQ(Dur(t, 0, 0, 1), 7);    // communication nodes keep theirs
  s.Add(OneClass(140, 180, 70), 0);
  EXPECT_EQ(s.Count(0), 2u);
  s.Apply(&t);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 0), 120);  // two: the mean of both
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 2), 190);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 1, 0), 60);
  s.Add(OneClass(400, 210, 55), 0);  // a slow slice (a busy host)
  s.Apply(&t);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 0), 140);  // three: the middle one, not 213.3
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 2), 200);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 1, 0), 55);
}

TEST(FillSamples, AClassOfAnotherShapeStartsItsNodesOverAndOtherClassesStayAsTheyAre) {
  FillSamples s;
  s.Add(OneClass(100, 200, 50, 2), 0);
  s.Add(OneClass(300, 400, 90, 2), 0);
  trace::Trace other = OneClass(1, 2, 3, 2);
  other.classes[0].streams[1].nodes.push_back(other.classes[0].streams[1].nodes[0]);
  other.classes[0].streams[1].nodes.back().id = 4;
  s.Add(other, 0);  // another shape: a new per-node history of one sample; the levels of all three stay
  EXPECT_EQ(s.Count(0), 3u);
  EXPECT_EQ(s.Count(1), 0u);
  trace::Trace t = other;
  t.classes[0].streams[0].nodes[0].dur_us = 55;
  t.classes[1].streams[0].nodes[0].dur_us = 66;
  EXPECT_EQ(s.Apply(&t), 1u);
  // From the one sample of this shape, scaled to the median level: 350 us (of 350, 790 and 9) over its own 9 us.
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 0), 1 * 350.0 / 9.0);
  EXPECT_EQ(Dur(t, 1, 0, 0), 66);  // class 1 has no sample: unchanged
  trace::Trace old_shape = OneClass(5, 6, 7, 2);
  EXPECT_EQ(s.Apply(&old_shape), 0u);  // the held shape differs: nothing applied
  EXPECT_EQ(Dur(old_shape, 0, 0, 0), 5);
  s.Add(old_shape, 7);  // no such class: ignored
  EXPECT_EQ(s.Count(7), 0u);
}

// Per iteration: the compute of each iteration summed over the class's streams, then the median over the iterations
// after the first (the set-up), per sample.
TEST(FillSamples, PerIterationIsTheMedianOfTheIterationsAfterTheFirst) {
  FillSamples s;
  EXPECT_TRUE(s.PerIterationS(0).empty());
  s.Add(WithIters(5000, 2000, 4000), 0);  // iterations 1 and 2: 2 and 4 ms, median 3 ms; the set-up's 5 ms is out
  s.Add(WithIters(9000, 3000, 3000), 0);
  const std::vector<double> v = s.PerIterationS(0);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_DOUBLE_EQ(v[0], 3e-3);
  EXPECT_DOUBLE_EQ(v[1], 3e-3);
  EXPECT_TRUE(s.PerIterationS(7).empty());  // a class it never saw
}

// A slice whose class has another shape (here one more compute node: a gap that opened) starts the per-node samples
// over, but its level joins the earlier ones: the nodes are scaled to the median level of every slice.
TEST(FillSamples, AnotherShapeKeepsTheLevelOfEveryEarlierSlice) {
  auto wider = [&](double a, double b, double c, double d) {
    trace::Trace t = WithIters(a, b, c);
    trace::Node n;
    n.id = 4, n.kind = NodeKind::kCompute, n.dur_us = d, n.iter = 2;
    t.classes[0].streams[1].nodes.push_back(n);
    return t;
  };
  FillSamples s;
  s.Add(WithIters(5000, 2000, 4000), 0);  // level 3 ms
  s.Add(WithIters(9000, 3000, 3000), 0);  // level 3 ms
  s.Add(wider(5000, 6000, 3000, 3000), 0);  // another shape, level 6 ms (a slow slice)
  EXPECT_EQ(s.Count(0), 3u);
  EXPECT_EQ(s.PerIterationS(0), (std::vector<double>{3e-3, 3e-3, 6e-3}));
  EXPECT_DOUBLE_EQ(s.SpreadPct(0), 100.0);
  trace::Trace t = wider(1, 1, 1, 1);
  EXPECT_EQ(s.Apply(&t), 1u);
  // Its own nodes at half: the median level (3 ms) over its own (6 ms).
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 0), 2500);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 0, 2), 3000);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 1, 0), 1500);
  EXPECT_DOUBLE_EQ(Dur(t, 0, 1, 1), 1500);
  EXPECT_EQ(Dur(t, 0, 0, 1), 7);  // communication keeps its own
  trace::Trace old = WithIters(1, 1, 1);  // the earlier shape is no longer what the samples describe
  EXPECT_EQ(s.Apply(&old), 0u);
}

}  // namespace
}  // namespace prism::analysis
