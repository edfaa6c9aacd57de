#include <gtest/gtest.h>

#include "launcher/fill.h"

namespace prism::launcher {
namespace {

trace::Trace WithSlots(std::vector<std::vector<std::string>> per_class) {
  trace::Trace t;
  for (auto& slots : per_class) {
    trace::RoleClass rc;
    rc.comm_slots = std::move(slots);
    t.classes.push_back(std::move(rc));
  }
  return t;
}

TEST(FillLockstep, AutoTakesTheSlotsWithinTheRanksOwnStage) {
  const trace::Trace t = WithSlots({{"tp", "pp", "dp", "world", "mp", "embd", "tp#2"},
                                    {"dp-cp", "ep", "tp-ep", "tp-dp-cp", "comm-0123abcd", "group7", "tp"}});
  // Groups across stages (pp, mp, embd, the world, torch's own communicators) and expert-parallel ones keep holding.
  EXPECT_EQ(LockstepSlots("auto", t), "tp,dp,dp-cp,tp-dp-cp");
}

TEST(FillLockstep, NoneAndAnExplicitListAreTakenAsGiven) {
  const trace::Trace t = WithSlots({{"tp", "dp"}});
  EXPECT_EQ(LockstepSlots("none", t), "");
  EXPECT_EQ(LockstepSlots("tp", t), "tp");
  EXPECT_EQ(LockstepSlots("tp,pp", t), "tp,pp");
}

TEST(FillLockstep, AGraphWithoutStageLocalSlotsHasNone) {
  EXPECT_EQ(LockstepSlots("auto", WithSlots({{"pp", "world"}, {}})), "");
  EXPECT_EQ(LockstepSlots("auto", trace::Trace{}), "");
}

// Two classes of two iterations (a compute and an all-reduce each); class 0 has a sample.
trace::Trace TwoIterations() {
  trace::Trace t = WithSlots({{"dp"}, {"dp"}});
  for (auto& cls : t.classes) {
    trace::Stream st;
    for (uint32_t it = 0; it < 2; ++it) {
      trace::Node c;
      c.id = 2 * it, c.kind = trace::NodeKind::kCompute, c.dur_us = 1000.0 * (it + 1), c.iter = it;
      trace::Node a;
      a.id = 2 * it + 1, a.kind = trace::NodeKind::kColl, a.comm_slot = 0, a.dur_us = 50, a.iter = it;
      st.nodes.push_back(c);
      st.nodes.push_back(a);
    }
    cls.streams.push_back(st);
  }
  return t;
}

TEST(FillSetUp, TheCollectsSetUpIsLeftOutOfClassesWithoutASample) {
  trace::Trace t = TwoIterations();
  analysis::FillSamples samples;
  samples.Add(t, 0);
  EXPECT_EQ(ClearUnsampledSetUp(&t, samples), 1u);
  const auto& sampled = t.classes[0].streams[0].nodes;
  const auto& other = t.classes[1].streams[0].nodes;
  EXPECT_EQ(sampled[0].dur_us, 1000);  // a class with its own slice keeps what it measured
  EXPECT_EQ(other[0].dur_us, 0);       // iteration 0's compute: the collect's start-up
  EXPECT_EQ(other[1].dur_us, 50);      // communication stays
  EXPECT_EQ(other[2].dur_us, 2000);    // later iterations stay
  EXPECT_EQ(ClearUnsampledSetUp(&t, samples), 0u);  // nothing left to clear
}

TEST(FillSetUp, AGraphWithoutIterationMarksKeepsEverything) {
  trace::Trace t = TwoIterations();
  for (auto& cls : t.classes)
    for (auto& n : cls.streams[0].nodes) n.iter = 0;  // one iteration: no set-up to tell apart
  EXPECT_EQ(ClearUnsampledSetUp(&t, analysis::FillSamples{}), 0u);
  EXPECT_EQ(t.classes[1].streams[0].nodes[0].dur_us, 1000);
}

}  // namespace
}  // namespace prism::launcher
