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

}  // namespace
}  // namespace prism::launcher
