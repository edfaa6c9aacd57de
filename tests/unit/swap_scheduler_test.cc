// The context-switching scheduler (coordinator/swap/swap_scheduler.h): its rules one by one, then simulated jobs
// (ranks doing collectives in lockstep on one or two GPUs) that must finish without ever holding more than the cap on
// a GPU or more than the budget in host RAM; and ParseBytes (common/sizes.h), which reads its caps.
#include "coordinator/swap/swap_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "common/sizes.h"

namespace prism::coord {
namespace {

constexpr uint64_t kF = 1ull << 30;  // one rank's footprint
constexpr uint64_t kSec = 1000000000ull;

SwapConfig Config(uint64_t cap, uint64_t host = 0) {
  SwapConfig c;
  c.enabled = true;
  c.gpu_cap_bytes = cap;
  c.host_cap_bytes = host;
  c.context_bytes = 0;
  c.stall_s = 10;
  return c;
}

// Admits the next rank and says hello with pid 1000 + rank and footprint kF.
void StartNext(SwapScheduler& s, int want_rank, uint64_t now = 0) {
  auto a = s.Next(now);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, SwapAction::kAdmit);
  EXPECT_EQ(a->rank, want_rank);
  EXPECT_TRUE(s.Admitted(want_rank));
  s.Started(want_rank, 1000 + want_rank, "g", now);
  s.Memory(want_rank, kF);
}

TEST(SwapScheduler, StartsRanksOfUnknownSizeOneAtATimeThenByFootprint) {
  SwapScheduler s(Config(2 * kF));
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(s.Admitted(r));
  auto a = s.Next(0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kAdmit);
  EXPECT_EQ(a->rank, 0);
  // Rank 0 has not said how big it is: rank 1 waits.
  EXPECT_FALSE(s.Next(0));
  EXPECT_EQ(s.Starting(), std::vector<int>{0});
  s.Started(0, 1000, "g", 0);
  EXPECT_TRUE(s.Starting().empty());
  EXPECT_FALSE(s.Next(0));
  s.Memory(0, kF);
  StartNext(s, 1);
  // The GPU holds 2F of 2F: ranks 2 and 3 wait while 0 and 1 run.
  EXPECT_FALSE(s.Next(kSec));
  EXPECT_FALSE(s.Admitted(2));
  EXPECT_EQ(s.GpuUsed("g"), 2 * kF);
}

TEST(SwapScheduler, SwapsOutOnlyWhenEveryResidentRankIsBlockedAndPicksOneNobodyWaitsFor) {
  SwapScheduler s(Config(2 * kF));
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  s.SetWaits(0, {1, 2, 3});
  EXPECT_FALSE(s.Next(kSec)) << "rank 1 still runs: nothing is swapped out";
  s.SetWaits(1, {2, 3});
  auto a = s.Next(kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kSwapOut);
  EXPECT_EQ(a->rank, 0) << "rank 1 is waited for by rank 0; rank 0 by nobody";
  EXPECT_EQ(a->pid, 1000);
  EXPECT_EQ(a->bytes, kF);
  EXPECT_FALSE(s.Next(kSec)) << "one checkpoint call at a time";
  s.Finished(*a, true, 0.5, kSec);
  EXPECT_EQ(s.phase(0), SwapPhase::kOut);
  EXPECT_EQ(s.HostUsed(), kF);
  EXPECT_EQ(s.GpuUsed("g"), kF);
  // Ranks 2 and 3 are waited for by both blocked ranks: one of them starts now.
  auto b = s.Next(kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kAdmit);
  EXPECT_EQ(b->rank, 2);
  SwapStats st = s.Stats();
  EXPECT_EQ(st.swaps_out, 1u);
  EXPECT_EQ(st.bytes_out, kF);
  EXPECT_DOUBLE_EQ(st.seconds_out, 0.5);
}

TEST(SwapScheduler, ResumesARankWhoseExchangeCompletedBeforeANewOne) {
  SwapScheduler s(Config(2 * kF));
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  s.SetWaits(0, {2});
  s.SetWaits(1, {2});
  auto out0 = s.Next(kSec);
  ASSERT_TRUE(out0 && out0->kind == SwapAction::kSwapOut);
  s.Finished(*out0, true, 0.1, kSec);
  StartNext(s, 2, kSec);
  // Rank 2 answered rank out0's exchange: that rank is ready, rank 3 has not started. Everyone on the GPU blocks.
  const int out_rank = out0->rank, other = 1 - out_rank;
  s.SetWaits(out_rank, {});
  s.SetWaits(other, {3});
  s.SetWaits(2, {3});
  // Rank 3 is needed by two blocked ranks: it goes first, making room by swapping one of them out.
  auto a = s.Next(2 * kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kSwapOut);
  s.Finished(*a, true, 0.1, 2 * kSec);
  auto b = s.Next(2 * kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kAdmit);
  EXPECT_EQ(b->rank, 3);
  s.Started(3, 1003, "g", 2 * kSec);
  s.Memory(3, kF);
  // Rank 3 completes the collective: every blocked rank is ready; rank 3 blocks next. The ready swapped-out rank
  // that waited longest comes back first.
  s.SetWaits(other, {});
  s.SetWaits(2, {});
  s.SetWaits(3, {out_rank});
  s.SetWaits(a->rank, {});
  EXPECT_EQ(a->rank, 2) << "of two blocked ranks nobody waits for, the higher one goes";
  EXPECT_FALSE(s.Next(3 * kSec)) << "a resident rank runs: nothing moves although rank 3 waits for a swapped-out one";
}

// A rank that waits for the incoming one is not its victim (docs/collect.md "No deadlock"). The case, from the GPU
// case swap_big (tests/gpu/swap_suite.sh): rank 0, the largest, blocked in a tensor-parallel collective with rank 1,
// which is out; rank 2 blocked on a rank not started. Swapping out rank 0 to bring rank 1 back (the largest rank
// nobody waits for) would leave rank 1 blocked on rank 0 at once: rank 2 goes instead.
TEST(SwapScheduler, ARankThatWaitsForTheIncomingOneIsNotItsVictim) {
  SwapScheduler s(Config(27 * kF / 10));
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  s.Memory(0, 12 * kF / 10);
  StartNext(s, 1);
  s.Memory(1, 15 * kF / 10);
  s.SetWaits(0, {2});
  s.SetWaits(1, {2});
  auto out1 = s.Next(kSec);
  ASSERT_TRUE(out1 && out1->kind == SwapAction::kSwapOut);
  ASSERT_EQ(out1->rank, 1) << "the largest of two blocked ranks nobody waits for";
  s.Finished(*out1, true, 0.1, kSec);
  StartNext(s, 2, kSec);
  // Rank 2 completes the exchange; rank 0 goes on to one with rank 1, rank 2 to one with rank 3 (not started).
  s.SetWaits(1, {});
  s.SetWaits(0, {1});
  s.SetWaits(2, {3});
  auto a = s.Next(2 * kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kSwapOut);
  EXPECT_EQ(a->rank, 2) << "rank 0 waits for rank 1, the rank coming back: it stays";
  s.Finished(*a, true, 0.1, 2 * kSec);
  auto b = s.Next(2 * kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kSwapIn);
  EXPECT_EQ(b->rank, 1);
}

TEST(SwapScheduler, NeverSwapsOutARankThatIsNotBlocked) {
  SwapScheduler s(Config(kF));
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  // Rank 0 runs (not blocked, active): rank 1 waits, whatever the time.
  for (uint64_t t = 0; t < 5; ++t) {
    s.Activity(0, t * kSec);
    EXPECT_FALSE(s.Next(t * kSec));
  }
  EXPECT_EQ(s.phase(0), SwapPhase::kResident);
}

TEST(SwapScheduler, HostBudgetStopsSwapOutsAndSaysWhy) {
  SwapScheduler s(Config(2 * kF, kF));
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  s.SetWaits(0, {2, 3});
  s.SetWaits(1, {2, 3});
  auto a = s.Next(kSec);
  ASSERT_TRUE(a && a->kind == SwapAction::kSwapOut);
  s.Finished(*a, true, 0.1, kSec);
  StartNext(s, 2, kSec);
  s.SetWaits(2, {3});
  // The GPU is full and blocked, rank 3 waits, but host RAM holds kF of kF: no second swap out, no start over the
  // cap; the scheduler waits and says why.
  EXPECT_FALSE(s.Next(2 * kSec));
  auto notes = s.TakeNotices();
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes[0].find("host budget"), std::string::npos) << notes[0];
  EXPECT_LE(s.HostUsed(), kF);
  EXPECT_LE(s.GpuUsed("g"), 2 * kF);
}

TEST(SwapScheduler, AStalledGpuWhoseRanksWaitOutsideAnExchangeTakesTheNextRankOverTheCap) {
  SwapConfig c = Config(kF);
  c.stall_s = 5;
  SwapScheduler s(c);
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  // Rank 0 waits on the store for rank 1 (no exchange): silent. Before stall_s nothing; after, rank 1 starts.
  EXPECT_FALSE(s.Next(4 * kSec));
  auto a = s.Next(6 * kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kAdmit);
  EXPECT_EQ(a->rank, 1);
  auto notes = s.TakeNotices();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("over the cap"), std::string::npos) << notes[0];
}

TEST(SwapScheduler, ARankBlockedInTheStoreStallsItsGpuAtOnceButIsNotSwappedOut) {
  SwapConfig c = Config(2 * kF);
  c.stall_s = 30;
  SwapScheduler s(c);
  for (int r = 0; r < 3; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  // Both wait in a store barrier (the coordinator saw their WAITs): the GPU is stalled now, not after 30 s of
  // silence; neither may be swapped out (their streams may hold gated work), so rank 2 starts over the cap.
  EXPECT_FALSE(s.Next(1 * kSec));
  s.SetStoreWait(0, true);
  EXPECT_FALSE(s.Next(1 * kSec));  // rank 1 still runs
  s.SetStoreWait(1, true);
  auto a = s.Next(1 * kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kAdmit);
  EXPECT_EQ(a->rank, 2);
  auto notes = s.TakeNotices();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("over the cap"), std::string::npos) << notes[0];
  // Once one of them blocks in an exchange as well, that one is what a stalled GPU over its cap sheds.
  s.Started(2, 1002, "g", 1 * kSec);
  s.Memory(2, kF);
  s.SetStoreWait(0, false);
  s.SetStoreWait(1, false);
  s.SetWaits(0, {2});
  auto b = s.Next(2 * kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kSwapOut);
  EXPECT_EQ(b->rank, 0);
}

TEST(SwapScheduler, FailedSwapOutLeavesTheRankOnTheGpu) {
  SwapScheduler s(Config(kF));
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  s.SetWaits(0, {1});
  auto a = s.Next(kSec);
  ASSERT_TRUE(a && a->kind == SwapAction::kSwapOut);
  s.Finished(*a, false, 0.01, kSec);
  EXPECT_EQ(s.phase(0), SwapPhase::kResident);
  EXPECT_EQ(s.HostUsed(), 0u);
  EXPECT_EQ(s.Stats().failures, 1u);
  // Not picked again in the same wait (a lock that timed out would time out again): nothing on the GPU can be
  // swapped out, so rank 1, which rank 0 waits for, starts over the cap rather than deadlock.
  auto b = s.Next(2 * kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kAdmit);
  EXPECT_EQ(b->rank, 1);
  auto notes = s.TakeNotices();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("can be swapped out (they wait outside an exchange"), std::string::npos) << notes[0];
  s.Started(1, 1001, "g", 2 * kSec);
  s.Memory(1, kF);
  // Once rank 0 waits on something else it may be picked again: 2F on a 1F GPU, rank 0 the only one blocked.
  s.SetWaits(0, {1, 5});
  auto c = s.Next(3 * kSec);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, SwapAction::kSwapOut);
  EXPECT_EQ(c->rank, 0);
}

TEST(SwapScheduler, ARankThatLeavesWhileBeingSwappedInStillCountsTheSwap) {
  SwapScheduler s(Config(kF));
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  s.SetWaits(0, {1});
  auto out = s.Next(kSec);
  ASSERT_TRUE(out && out->kind == SwapAction::kSwapOut);
  s.Finished(*out, true, 0.5, kSec);
  StartNext(s, 1, kSec);
  s.SetWaits(0, {});
  s.Done(1);
  auto in = s.Next(2 * kSec);
  ASSERT_TRUE(in && in->kind == SwapAction::kSwapIn);
  s.Done(0);  // restored, unlocked, finished and gone before the worker filed the result
  s.Finished(*in, true, 0.25, 2 * kSec);
  SwapStats st = s.Stats();
  EXPECT_EQ(st.swaps_in, 1u);
  EXPECT_EQ(st.bytes_in, kF);
  EXPECT_DOUBLE_EQ(st.seconds_in, 0.25);
  EXPECT_EQ(st.finished, 2);
  EXPECT_FALSE(s.busy());
}

TEST(SwapScheduler, GrowthOverTheCapIsUndoneWhenARankBlocks) {
  SwapScheduler s(Config(2 * kF));
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  s.Memory(1, 2 * kF);  // rank 1 grew: 3F on a 2F GPU
  EXPECT_FALSE(s.Next(kSec)) << "nobody is blocked yet";
  s.SetWaits(0, {1});
  auto a = s.Next(kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kSwapOut);
  EXPECT_EQ(a->rank, 0);
}

// Allocation admission (RequestRoom, ipc.h kMemRoom): the GPU case `big` of s18b, where every rank grew at its first
// step past what the GPU held and one died out of memory with the others blocked in collectives.
TEST(SwapScheduler, ARoomRequestSwapsOutBlockedRanksUntilEnoughIsFreed) {
  SwapScheduler s(Config(4 * kF));
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  for (int r = 0; r < 4; ++r) StartNext(s, r);
  EXPECT_EQ(s.GpuUsed("g"), 4 * kF);
  s.SetWaits(0, {3});
  s.SetWaits(1, {3});
  // Rank 2 also waits in an exchange (another thread of its process), but its allocation waits for room: it is the
  // one the room is for, never a victim.
  s.SetWaits(2, {3});
  ASSERT_TRUE(s.RequestRoom(2, 7, 3 * kF / 2, kF, kSec));
  EXPECT_TRUE(s.WaitsForRoom(2));
  EXPECT_EQ(s.Footprint(2), 5 * kF / 2) << "what it holds plus what it asks for";
  EXPECT_TRUE(s.TakeRoomAnswers(kSec).empty());
  auto a = s.Next(kSec);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kSwapOut);
  EXPECT_EQ(a->rank, 1) << "blocked, nobody waits for it, the highest of equals";
  EXPECT_NE(a->why.find("rank 2 waits for room"), std::string::npos) << a->why;
  s.Finished(*a, true, 0.5, kSec);
  EXPECT_TRUE(s.TakeRoomAnswers(kSec).empty()) << "F freed of 1.5F";
  auto b = s.Next(kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kSwapOut);
  EXPECT_EQ(b->rank, 0);
  s.Finished(*b, true, 0.5, kSec);
  auto answers = s.TakeRoomAnswers(kSec);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].rank, 2);
  EXPECT_EQ(answers[0].id, 7u);
  EXPECT_TRUE(answers[0].ok);
  EXPECT_FALSE(s.WaitsForRoom(2));
  EXPECT_TRUE(s.TakeRoomAnswers(kSec).empty()) << "answered once";
  EXPECT_EQ(s.Stats().rooms_granted, 1u);
  EXPECT_EQ(s.phase(2), SwapPhase::kResident);
  EXPECT_EQ(s.GpuUsed("g"), 7 * kF / 2) << "rank 2's grown footprint and rank 3";
}

TEST(SwapScheduler, NothingStartsOrComesBackOnAGpuWhileARankWaitsForRoom) {
  SwapScheduler s(Config(10 * kF));
  for (int r = 0; r < 3; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  // Rank 2 would fit by the count (2F of 10F), but the GPU just ran out of memory: the room is rank 1's.
  ASSERT_TRUE(s.RequestRoom(1, 1, kF, kF, kSec));
  EXPECT_FALSE(s.Next(2 * kSec));
  EXPECT_FALSE(s.Admitted(2));
  // Rank 0 blocks (it waits for rank 2, which is not started): it is swapped out for rank 1, and only once rank 1
  // had its answer may rank 2 start.
  s.SetWaits(0, {2});
  auto a = s.Next(3 * kSec);
  ASSERT_TRUE(a && a->kind == SwapAction::kSwapOut && a->rank == 0);
  s.Finished(*a, true, 0.5, 3 * kSec);
  auto answers = s.TakeRoomAnswers(3 * kSec);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].ok);
  auto b = s.Next(3 * kSec);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->kind, SwapAction::kAdmit);
  EXPECT_EQ(b->rank, 2);
}

TEST(SwapScheduler, ARoomRequestIsRefusedWhenNothingCanBeSwappedOut) {
  SwapConfig cfg = Config(5 * kF);  // rank 0 grows to 2F below, the next ones are estimated at that
  cfg.room_wait_s = 5;
  SwapScheduler s(cfg);
  for (int r = 0; r < 3; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  // Alone on its GPU: nothing could ever be freed for it, no at once.
  ASSERT_TRUE(s.RequestRoom(0, 1, kF, kF, kSec));
  auto alone = s.TakeRoomAnswers(kSec);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_FALSE(alone[0].ok);
  EXPECT_NE(alone[0].why.find("alone on GPU g"), std::string::npos) << alone[0].why;

  StartNext(s, 1, kSec);
  StartNext(s, 2, kSec);
  // Ranks 0 and 1 work (not blocked): rank 2 waits, then gets no after room_wait_s; nothing is swapped out.
  ASSERT_TRUE(s.RequestRoom(2, 2, kF, kF, 10 * kSec));
  EXPECT_FALSE(s.Next(11 * kSec));
  EXPECT_TRUE(s.TakeRoomAnswers(14 * kSec).empty());
  auto late = s.TakeRoomAnswers(15 * kSec);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_FALSE(late[0].ok);
  EXPECT_EQ(late[0].id, 2u);
  EXPECT_NE(late[0].why.find("within 5 s"), std::string::npos) << late[0].why;
  EXPECT_EQ(s.Stats().rooms_refused, 2u);
  EXPECT_EQ(s.Stats().swaps_out, 0u);
  // A rank unknown to the scheduler is refused by the caller (RequestRoom says so).
  EXPECT_FALSE(s.RequestRoom(9, 3, kF, 0, 15 * kSec));
}

// The GPU case swap_big at a size that did not fit, in small (docs/results/collect.md): the ranks grow past what the
// GPU cap and the host budget hold together; the refusal says the job does not fit, not only that nothing could be
// swapped out.
TEST(SwapScheduler, ARefusalSaysWhenTheRanksNeedMoreThanTheGpuAndTheHostBudgetHold) {
  SwapConfig cfg = Config(2 * kF, kF);
  cfg.room_wait_s = 5;
  SwapScheduler s(cfg);
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  StartNext(s, 1);
  // Both hold F and ask for 2F more: 6F against 2F + F.
  ASSERT_TRUE(s.RequestRoom(0, 1, 2 * kF, kF, kSec));
  ASSERT_TRUE(s.RequestRoom(1, 2, 2 * kF, kF, kSec));
  auto late = s.TakeRoomAnswers(7 * kSec);
  ASSERT_EQ(late.size(), 2u);
  for (const RoomAnswer& a : late) {
    EXPECT_FALSE(a.ok);
    EXPECT_NE(a.why.find("the job does not fit this way"), std::string::npos) << a.why;
    EXPECT_NE(a.why.find("6.0 GiB together"), std::string::npos) << a.why;
  }
  // Within what the GPU and the host hold, a refusal says nothing of the kind.
  SwapScheduler fits(Config(2 * kF, 4 * kF));
  for (int r = 0; r < 2; ++r) fits.AddRank(r, "g");
  StartNext(fits, 0);
  StartNext(fits, 1);
  ASSERT_TRUE(fits.RequestRoom(0, 1, kF / 2, kF, kSec));
  auto no = fits.TakeRoomAnswers(62 * kSec);
  ASSERT_EQ(no.size(), 1u);
  EXPECT_FALSE(no[0].ok);
  EXPECT_EQ(no[0].why.find("does not fit"), std::string::npos) << no[0].why;
}

TEST(SwapScheduler, ARoomRequestWaitsForASwapOutInFlightAndForARankThatEnds) {
  SwapConfig cfg = Config(3 * kF);
  cfg.room_wait_s = 5;
  SwapScheduler s(cfg);
  for (int r = 0; r < 3; ++r) s.AddRank(r, "g");
  for (int r = 0; r < 3; ++r) StartNext(s, r);
  s.SetWaits(0, {5});
  ASSERT_TRUE(s.RequestRoom(2, 1, kF, kF, kSec));
  auto a = s.Next(kSec);
  ASSERT_TRUE(a && a->kind == SwapAction::kSwapOut && a->rank == 0);
  // The checkpoint takes longer than the room wait: no refusal while it runs.
  EXPECT_TRUE(s.TakeRoomAnswers(30 * kSec).empty());
  s.Finished(*a, false, 10, 30 * kSec);  // the lock timed out: nothing freed, and its wait is long over
  auto no = s.TakeRoomAnswers(30 * kSec);
  ASSERT_EQ(no.size(), 1u);
  EXPECT_FALSE(no[0].ok);
  // A rank that ends while it waits is not answered; one that ends on the GPU frees room for another's request.
  ASSERT_TRUE(s.RequestRoom(2, 3, kF, kF, 30 * kSec));
  s.Done(2);
  EXPECT_FALSE(s.WaitsForRoom(2));
  EXPECT_TRUE(s.TakeRoomAnswers(30 * kSec).empty());
  ASSERT_TRUE(s.RequestRoom(1, 2, kF / 2, kF, 31 * kSec));
  s.Done(0);
  auto answers = s.TakeRoomAnswers(31 * kSec);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].ok) << answers[0].why;
}

// Footprints from the driver's per-process GPU memory (Measured) instead of the tracked peak + the assumed context.
// The GPU case swap_big of s19c: 8 Megatron ranks on one H200 (cap 132.8 GiB) grew to ~20 GiB each; one was out, and
// at the first optimizer step the 7 resident ranks' allocations (Adam's state) failed at the same moment. Every rank
// waited for room and none was blocked in an exchange, so nothing was swapped out: after room_wait_s all 7 were
// refused and torch died out of memory. Now libprism synchronises the device before asking (idle), and one idle
// asker (not the oldest, the largest) is swapped out for the others; it comes back later and is granted then.
TEST(SwapScheduler, WhenEveryResidentRankWaitsForRoomAnIdleAskerIsSwappedOutForTheOthers) {
  constexpr uint64_t kGiB = 1ull << 30, kMiB = 1ull << 20;
  SwapConfig cfg = Config(static_cast<uint64_t>(132.8 * kGiB));
  cfg.room_wait_s = 60;
  cfg.stall_s = 1000;  // the ranks that run on are not silent (the test sends no activity)
  SwapScheduler s(cfg);
  for (int r = 0; r < 8; ++r) s.AddRank(r, "g");
  for (int r = 0; r < 8; ++r) StartNext(s, r);
  // They grew: rank 1 to 24 GiB, rank 5 to 23 GiB, the others to 20 GiB (8 ranks: 167 GiB).
  auto size = [&](int r) { return r == 1 ? 24 * kGiB : r == 5 ? 23 * kGiB : 20 * kGiB; };
  for (int r = 0; r < 8; ++r) s.Memory(r, size(r));
  // Rank 0 blocks: over the cap, it is swapped out; then its exchange completes while it is out.
  s.SetWaits(0, {1});
  auto first = s.Next(kSec);
  ASSERT_TRUE(first && first->kind == SwapAction::kSwapOut && first->rank == 0);
  s.Finished(*first, true, 10, 2 * kSec);
  s.SetWaits(0, {});
  EXPECT_FALSE(s.Next(3 * kSec)) << "rank 0 does not fit, and nobody is blocked";

  // The first optimizer step: the 7 resident ranks ask for 128 MiB at the same moment, each with its GPU idle.
  const uint64_t t = 10 * kSec;
  for (int r = 1; r < 8; ++r) ASSERT_TRUE(s.RequestRoom(r, 100 + r, 128 * kMiB, size(r), t, /*idle=*/true));
  EXPECT_TRUE(s.TakeRoomAnswers(t).empty());
  auto a = s.Next(t);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SwapAction::kSwapOut);
  EXPECT_EQ(a->rank, 5) << "the largest asker that is not the oldest (rank 1, served first)";
  EXPECT_EQ(a->bytes, 23 * kGiB + 128 * kMiB) << "its footprint holds its own request";
  EXPECT_NE(a->why.find("rank 1 waits for room"), std::string::npos) << a->why;
  EXPECT_NE(a->why.find("its GPU idle"), std::string::npos) << a->why;
  EXPECT_FALSE(s.Next(t)) << "one checkpoint at a time";
  EXPECT_TRUE(s.TakeRoomAnswers(t + 70 * kSec).empty()) << "a swap out in flight defers every no";
  s.Finished(*a, true, 12, t + 12 * kSec);

  // Its 23 GiB are credited to the other askers, oldest first; never to rank 5 itself.
  auto answers = s.TakeRoomAnswers(t + 12 * kSec);
  ASSERT_EQ(answers.size(), 6u);
  for (const RoomAnswer& ans : answers) {
    EXPECT_NE(ans.rank, 5);
    EXPECT_TRUE(ans.ok) << ans.rank << ": " << ans.why;
    EXPECT_EQ(ans.id, static_cast<uint64_t>(100 + ans.rank));
  }
  EXPECT_TRUE(s.WaitsForRoom(5)) << "its request stays pending while it is out";
  EXPECT_EQ(s.phase(5), SwapPhase::kOut);
  EXPECT_TRUE(s.TakeRoomAnswers(t + 200 * kSec).empty()) << "never refused while it is out";
  EXPECT_EQ(s.Stats().room_swaps_out, 1u);

  // The others run on; rank 5 (and rank 0) do not fit yet (6 ranks hold ~125 GiB). Then every resident rank blocks
  // in an exchange that needs rank 5: a blocked rank makes room, and rank 5 comes back and is granted.
  EXPECT_FALSE(s.Next(t + 13 * kSec));
  for (int r : {1, 2, 3, 4, 6, 7}) s.SetWaits(r, {5});
  auto b = s.Next(t + 20 * kSec);
  ASSERT_TRUE(b && b->kind == SwapAction::kSwapOut);
  EXPECT_NE(b->rank, 5);
  s.Finished(*b, true, 10, t + 30 * kSec);
  auto c = s.Next(t + 30 * kSec);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, SwapAction::kSwapIn);
  EXPECT_EQ(c->rank, 5);
  EXPECT_EQ(c->bytes, 23 * kGiB + 128 * kMiB) << "what it held plus its request";
  EXPECT_LE(s.GpuUsed("g"), cfg.gpu_cap_bytes);
  EXPECT_TRUE(s.TakeRoomAnswers(t + 31 * kSec).empty()) << "granted once it is back, not while it swaps in";
  s.Finished(*c, true, 4, t + 34 * kSec);
  auto back = s.TakeRoomAnswers(t + 34 * kSec);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].rank, 5);
  EXPECT_EQ(back[0].id, 105u);
  EXPECT_TRUE(back[0].ok);
  EXPECT_NE(back[0].why.find("restored on GPU g with room for 128.0 MiB"), std::string::npos) << back[0].why;
  EXPECT_FALSE(s.WaitsForRoom(5));
  EXPECT_EQ(s.Stats().rooms_granted, 7u);
  EXPECT_EQ(s.Stats().rooms_refused, 0u);
}

TEST(SwapScheduler, AnAskerWithoutIdleIsNeverSwappedOutAndABlockedRankGoesBeforeAnIdleAsker) {
  SwapConfig cfg = Config(4 * kF);
  cfg.room_wait_s = 5;
  SwapScheduler s(cfg);
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  for (int r = 0; r < 4; ++r) StartNext(s, r);
  // Ranks 0-2 ask without idle (an older libprism, or a synchronisation that failed): as before, nobody can go.
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(s.RequestRoom(r, r + 1, kF / 4, kF, kSec));
  EXPECT_FALSE(s.Next(2 * kSec));
  // Rank 3 asks with idle: it is the only one that may go, for rank 0 (the oldest).
  ASSERT_TRUE(s.RequestRoom(3, 9, kF / 4, kF, 2 * kSec, true));
  // Rank 2 also waits in an exchange (another thread of its process): waiting for room, it is no blocked victim.
  s.SetWaits(2, {7});
  auto a = s.Next(3 * kSec);
  ASSERT_TRUE(a && a->kind == SwapAction::kSwapOut);
  EXPECT_EQ(a->rank, 3);
  s.Finished(*a, true, 1, 4 * kSec);
  // 1.25F freed: ranks 0, 1, 2 (0.25F each) granted in order; rank 3 waits out.
  auto answers = s.TakeRoomAnswers(4 * kSec);
  ASSERT_EQ(answers.size(), 3u);
  for (const RoomAnswer& ans : answers) EXPECT_TRUE(ans.ok) << ans.why;

  // A blocked rank goes before an idle asker.
  SwapScheduler t(cfg);
  for (int r = 0; r < 3; ++r) t.AddRank(r, "g");
  for (int r = 0; r < 3; ++r) StartNext(t, r);
  ASSERT_TRUE(t.RequestRoom(0, 1, kF / 2, kF, kSec, true));
  ASSERT_TRUE(t.RequestRoom(1, 2, kF / 2, 2 * kF, kSec, true));  // the larger asker
  t.SetWaits(2, {5});
  auto b = t.Next(kSec);
  ASSERT_TRUE(b && b->kind == SwapAction::kSwapOut);
  EXPECT_EQ(b->rank, 2) << "blocked in an exchange";
  EXPECT_EQ(b->why.find("its GPU idle"), std::string::npos) << b->why;
  t.Finished(*b, true, 1, 2 * kSec);
  EXPECT_EQ(t.Stats().room_swaps_out, 0u);
  auto got = t.TakeRoomAnswers(2 * kSec);
  EXPECT_EQ(got.size(), 2u) << "F freed: both requests of 0.5F";

  // Without idle, nobody: after room_wait_s, no.
  SwapScheduler u(cfg);
  for (int r = 0; r < 2; ++r) u.AddRank(r, "g");
  for (int r = 0; r < 2; ++r) StartNext(u, r);
  ASSERT_TRUE(u.RequestRoom(0, 1, kF, kF, kSec));
  ASSERT_TRUE(u.RequestRoom(1, 1, kF, kF, kSec));
  EXPECT_FALSE(u.Next(2 * kSec));
  auto no = u.TakeRoomAnswers(6 * kSec);
  ASSERT_EQ(no.size(), 2u);
  EXPECT_FALSE(no[0].ok);
  EXPECT_FALSE(no[1].ok);
  EXPECT_EQ(u.Stats().swaps_out, 0u);
}

// Two ranks whose retries keep failing (the GPU holds less than the scheduler counts) must not swap each other out
// for ever: a rank restored for room is not swapped out for room again before it blocks in an exchange.
TEST(SwapScheduler, TwoAskersDoNotSwapEachOtherOutForEver) {
  SwapConfig cfg = Config(4 * kF);
  cfg.room_wait_s = 5;
  SwapScheduler s(cfg);
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  for (int r = 0; r < 2; ++r) StartNext(s, r);
  uint64_t now = kSec;
  auto run = [&](SwapAction::Kind kind, int rank) {
    auto a = s.Next(now);
    ASSERT_TRUE(a) << "expected " << SwapActionName(kind) << " rank " << rank;
    EXPECT_EQ(a->kind, kind);
    EXPECT_EQ(a->rank, rank);
    now += kSec;
    s.Finished(*a, true, 1, now);
  };
  // Round 1: rank 0 is the oldest asker: rank 1 goes out for it, and comes back (it fits) with its room.
  ASSERT_TRUE(s.RequestRoom(0, 1, kF / 2, kF, now, true));
  ASSERT_TRUE(s.RequestRoom(1, 1, kF / 2, kF, now + 1, true));
  run(SwapAction::kSwapOut, 1);
  auto r1 = s.TakeRoomAnswers(now);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].rank, 0);
  run(SwapAction::kSwapIn, 1);
  auto r1b = s.TakeRoomAnswers(now);
  ASSERT_EQ(r1b.size(), 1u);
  EXPECT_EQ(r1b[0].rank, 1);
  EXPECT_TRUE(r1b[0].ok);
  // Round 2: both retries failed; rank 1 asks first now: rank 0 goes out for it, and comes back.
  now += kSec;
  ASSERT_TRUE(s.RequestRoom(1, 2, kF / 2, 3 * kF / 2, now, true));
  ASSERT_TRUE(s.RequestRoom(0, 2, kF / 2, 3 * kF / 2, now + 1, true));
  run(SwapAction::kSwapOut, 0);
  ASSERT_EQ(s.TakeRoomAnswers(now).size(), 1u);
  run(SwapAction::kSwapIn, 0);
  ASSERT_EQ(s.TakeRoomAnswers(now).size(), 1u);
  // Round 3: both were restored for room and neither has blocked since: nobody goes, both get no in time.
  now += kSec;
  ASSERT_TRUE(s.RequestRoom(0, 3, kF / 2, 2 * kF, now, true));
  ASSERT_TRUE(s.RequestRoom(1, 3, kF / 2, 2 * kF, now + 1, true));
  EXPECT_FALSE(s.Next(now + kSec));
  auto no = s.TakeRoomAnswers(now + 6 * kSec);
  ASSERT_EQ(no.size(), 2u);
  EXPECT_FALSE(no[0].ok);
  EXPECT_FALSE(no[1].ok);
  EXPECT_EQ(s.Stats().swaps_out, 2u);
  EXPECT_EQ(s.Stats().swaps_in, 2u);
  // Once rank 1 blocked in an exchange (it moved on), it may be swapped out for room again.
  s.SetWaits(1, {0});
  s.SetWaits(1, {});
  now += 10 * kSec;
  ASSERT_TRUE(s.RequestRoom(0, 4, kF / 2, 2 * kF, now, true));
  ASSERT_TRUE(s.RequestRoom(1, 4, kF / 2, 2 * kF, now + 1, true));
  run(SwapAction::kSwapOut, 1);
}

TEST(SwapScheduler, MeasuredFootprintsFitThreeRanksWhereTrackedPeakPlusContextFitTwo) {
  constexpr uint64_t kMiB = 1ull << 20;
  for (bool measure : {false, true}) {
    SwapConfig cfg = Config(1760 * kMiB);
    cfg.context_bytes = 512 * kMiB;
    SwapScheduler s(cfg);
    for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
    int started = 0;
    while (auto a = s.Next(kSec)) {
      ASSERT_EQ(a->kind, SwapAction::kAdmit);
      s.Started(a->rank, 1000 + a->rank, "g", kSec);
      s.Memory(a->rank, 100 * kMiB);
      if (measure) s.Measured(a->rank, 580 * kMiB);
      ++started;
    }
    if (measure) {
      EXPECT_EQ(started, 3);
      EXPECT_EQ(s.Footprint(0), 580 * kMiB);
      EXPECT_EQ(s.GpuUsed("g"), 3 * 580 * kMiB);
      EXPECT_EQ(s.GpuHeld("g"), 3 * 580 * kMiB);
      EXPECT_EQ(s.Stats().measured, 3);
      EXPECT_TRUE(s.IsMeasured(2));
    } else {
      EXPECT_EQ(started, 2);
      EXPECT_EQ(s.Footprint(0), 612 * kMiB);
      EXPECT_EQ(s.Stats().measured, 0);
    }
    EXPECT_EQ(s.Stats().unstarted, 4 - started);
  }
}

TEST(SwapScheduler, AMeasuredFootprintFollowsTheTrackedPeakAndKeepsItsLargestMeasurement) {
  constexpr uint64_t kMiB = 1ull << 20;
  SwapConfig cfg = Config(100 * kF);
  cfg.context_bytes = 512 * kMiB;
  SwapScheduler s(cfg);
  s.AddRank(0, "g");
  ASSERT_TRUE(s.Next(0));
  s.Started(0, 1000, "g", 0);
  s.Measured(0, 300 * kMiB);
  EXPECT_FALSE(s.IsMeasured(0)) << "before its first sample the tracked bytes inside the measurement are unknown";
  s.Memory(0, 100 * kMiB);
  s.Measured(0, 500 * kMiB);  // 400 MiB beyond the tracked peak
  EXPECT_EQ(s.Footprint(0), 500 * kMiB);
  s.Measured(0, 450 * kMiB);  // torch freed some of its cache: the footprint stays
  EXPECT_EQ(s.Footprint(0), 500 * kMiB);
  s.Memory(0, 1100 * kMiB);  // the first step's growth, before the next measurement
  EXPECT_EQ(s.Footprint(0), 1500 * kMiB);
  s.Measured(0, 1600 * kMiB);
  EXPECT_EQ(s.Footprint(0), 1600 * kMiB);
  // A measurement below the tracked peak (e.g. the driver's number excludes something): the peak still counts.
  SwapScheduler t(cfg);
  t.AddRank(0, "g");
  ASSERT_TRUE(t.Next(0));
  t.Started(0, 1000, "g", 0);
  t.Memory(0, 800 * kMiB);
  t.Measured(0, 700 * kMiB);
  EXPECT_EQ(t.Footprint(0), 800 * kMiB);
}

TEST(SwapScheduler, OnlyAResidentRankIsMeasured) {
  SwapScheduler s(Config(kF));
  for (int r = 0; r < 2; ++r) s.AddRank(r, "g");
  StartNext(s, 0);
  s.SetWaits(0, {1});
  auto out = s.Next(kSec);  // stalled: rank 0 makes room for rank 1
  ASSERT_TRUE(out);
  ASSERT_EQ(out->kind, SwapAction::kSwapOut);
  s.Measured(0, kF / 4);  // a checkpoint in progress: part of its memory is gone already
  EXPECT_FALSE(s.IsMeasured(0));
  s.Finished(*out, true, 0.1, kSec);
  s.Measured(0, 1);  // swapped out
  EXPECT_FALSE(s.IsMeasured(0));
  EXPECT_EQ(s.Footprint(0), kF);
}

TEST(SwapScheduler, RankMemIsTheFootprintOfARankThatReportedNothingEvenBelowTheContext) {
  constexpr uint64_t kMiB = 1ull << 20;
  SwapConfig cfg = Config(1000 * kMiB);
  cfg.context_bytes = 512 * kMiB;
  cfg.rank_estimate_bytes = 300 * kMiB;
  SwapScheduler s(cfg);
  for (int r = 0; r < 4; ++r) s.AddRank(r, "g");
  int admitted = 0;
  while (auto a = s.Next(0)) {
    ASSERT_EQ(a->kind, SwapAction::kAdmit);
    EXPECT_EQ(a->bytes, 300 * kMiB);
    ++admitted;
  }
  EXPECT_EQ(admitted, 3) << "3 x 300 MiB fit in 1000 MiB; with --rank-mem they start without waiting for samples";
  s.Started(0, 1000, "g", 0);
  s.Memory(0, 100 * kMiB);
  EXPECT_EQ(s.Footprint(0), 612 * kMiB) << "once it reported, its own size counts";
  EXPECT_EQ(s.Footprint(1), 300 * kMiB);
}

TEST(SwapScheduler, ParseBytes) {
  uint64_t b = 0;
  EXPECT_TRUE(ParseBytes("80G", &b));
  EXPECT_EQ(b, 80ull << 30);
  EXPECT_TRUE(ParseBytes("512MiB", &b));
  EXPECT_EQ(b, 512ull << 20);
  EXPECT_TRUE(ParseBytes("1.5T", &b));
  EXPECT_EQ(b, 3ull << 39);
  EXPECT_TRUE(ParseBytes("123", &b));
  EXPECT_EQ(b, 123u);
  EXPECT_FALSE(ParseBytes("", &b));
  EXPECT_FALSE(ParseBytes("12X", &b));
  EXPECT_FALSE(ParseBytes("-1G", &b));
  EXPECT_FALSE(ParseBytes("G", &b));
}

// A simulated job: every rank runs `rounds` rounds; each round it takes part, in order, in every group it belongs to
// (a collective: it blocks until every member posted). The scheduler's actions are applied at once. Checks after
// every step that no GPU holds more than its cap and host RAM no more than its budget, and that the job finishes.
struct SimResult {
  bool finished = false;
  std::string state;  // where each rank stood at the end (for failure messages)
  SwapStats stats;
  uint64_t max_gpu = 0, max_host = 0;
};

// sizes: each rank's tracked peak (kF when absent); measured: its process's GPU memory as NVML would say (none when
// absent), given once the rank reported its size.
SimResult Simulate(SwapConfig cfg, const std::map<int, std::string>& rank_gpu,
                   const std::vector<std::vector<int>>& groups, int rounds, const std::map<int, uint64_t>& sizes,
                   const std::map<int, uint64_t>& measured = {}) {
  SwapScheduler s(cfg);
  std::set<std::string> gpus;
  for (const auto& [r, g] : rank_gpu) {
    s.AddRank(r, g);
    gpus.insert(g);
  }
  std::map<int, size_t> pos;                 // next op index (round * groups + group) per rank
  std::map<size_t, std::set<int>> posted;   // op index -> members that posted
  std::map<int, bool> started;
  auto ops_of = [&](int r) {
    std::vector<size_t> v;
    for (int k = 0; k < rounds; ++k)
      for (size_t g = 0; g < groups.size(); ++g)
        if (std::count(groups[g].begin(), groups[g].end(), r)) v.push_back(static_cast<size_t>(k) * groups.size() + g);
    return v;
  };
  std::map<int, std::vector<size_t>> plan;
  for (const auto& [r, g] : rank_gpu) plan[r] = ops_of(r);
  SimResult res;
  uint64_t now = 0;
  int idle = 0;
  for (int step = 0; step < 100000 && idle < 50; ++step) {
    now += kSec / 100;
    bool progress = false;
    // Running ranks (on the GPU, started, not blocked) post their next op.
    for (const auto& [r, g] : rank_gpu) {
      if (!started[r] || s.phase(r) != SwapPhase::kResident) continue;
      if (pos[r] >= plan[r].size()) {
        s.Done(r);
        progress = true;
        continue;
      }
      size_t op = plan[r][pos[r]];
      if (posted[op].count(r)) continue;  // blocked
      posted[op].insert(r);
      s.Activity(r, now);
      progress = true;
    }
    // Complete collectives whose members all posted; recompute waits.
    for (auto& [op, who] : posted) {
      const auto& members = groups[op % groups.size()];
      if (who.size() == members.size()) {
        for (int m : members) ++pos[m];
        who.clear();
        progress = true;
      }
    }
    for (const auto& [r, g] : rank_gpu) {
      std::vector<int> wf;
      if (pos[r] < plan[r].size()) {
        size_t op = plan[r][pos[r]];
        if (posted[op].count(r)) {
          for (int m : groups[op % groups.size()])
            if (!posted[op].count(m)) wf.push_back(m);
        }
      }
      s.SetWaits(r, wf);
    }
    while (auto a = s.Next(now)) {
      progress = true;
      if (a->kind == SwapAction::kAdmit) {
        started[a->rank] = true;
        s.Started(a->rank, 1000 + a->rank, rank_gpu.at(a->rank), now);
        s.Memory(a->rank, sizes.count(a->rank) ? sizes.at(a->rank) : kF);
        if (measured.count(a->rank)) s.Measured(a->rank, measured.at(a->rank));
      } else {
        s.Finished(*a, true, 0.01, now);
      }
      for (const std::string& g : gpus) res.max_gpu = std::max(res.max_gpu, s.GpuUsed(g));
      res.max_host = std::max(res.max_host, s.HostUsed());
    }
    for (const std::string& g : gpus) res.max_gpu = std::max(res.max_gpu, s.GpuUsed(g));
    res.max_host = std::max(res.max_host, s.HostUsed());
    idle = progress ? 0 : idle + 1;
    res.stats = s.Stats();
    if (res.stats.finished == static_cast<int>(rank_gpu.size())) {
      res.finished = true;
      break;
    }
  }
  for (const auto& [r, g] : rank_gpu) {
    res.state += "rank " + std::to_string(r) + " " + SwapPhaseName(s.phase(r)) + " op " + std::to_string(pos[r]) +
                 "/" + std::to_string(plan[r].size()) + " fp " + std::to_string(s.Footprint(r) >> 30) + "G; ";
  }
  for (const std::string& g : gpus) res.state += "gpu " + g + " " + std::to_string(s.GpuUsed(g) >> 30) + "G; ";
  res.state += "host " + std::to_string(s.HostUsed() >> 30) + "G";
  for (const std::string& n : s.TakeNotices()) res.state += "\n" + n;
  return res;
}

TEST(SwapSimulation, FourRanksOfFootprintFOnACapOf2FFinishThroughSwaps) {
  std::map<int, std::string> rg = {{0, "g"}, {1, "g"}, {2, "g"}, {3, "g"}};
  // Megatron-like: tensor-parallel pairs, then pipeline pairs, then the whole replica.
  std::vector<std::vector<int>> groups = {{0, 1}, {2, 3}, {0, 2}, {1, 3}, {0, 1, 2, 3}};
  SimResult r = Simulate(Config(2 * kF), rg, groups, 5, {});
  EXPECT_TRUE(r.finished) << "finished " << r.stats.finished << " of 4: " << r.state;
  EXPECT_LE(r.max_gpu, 2 * kF);
  EXPECT_GT(r.stats.swaps_out, 0u);
  EXPECT_EQ(r.stats.swaps_out, r.stats.swaps_in + static_cast<uint64_t>(r.stats.out));
  EXPECT_EQ(r.stats.failures, 0u);
}

TEST(SwapSimulation, EverythingFitsMeansNoSwap) {
  std::map<int, std::string> rg = {{0, "g"}, {1, "g"}, {2, "g"}, {3, "g"}};
  SimResult r = Simulate(Config(4 * kF), rg, {{0, 1, 2, 3}}, 5, {});
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.stats.swaps_out, 0u);
  EXPECT_EQ(r.max_gpu, 4 * kF);
}

TEST(SwapSimulation, EightRanksOnTwoGpusWithAHostBudgetAndUnevenSizes) {
  std::map<int, std::string> rg;
  for (int r = 0; r < 8; ++r) rg[r] = r < 4 ? "a" : "b";
  std::map<int, uint64_t> sizes = {{0, 2 * kF}, {5, 2 * kF}};
  std::vector<std::vector<int>> groups = {{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7},
                                          {0, 1, 2, 3, 4, 5, 6, 7}};
  SimResult r = Simulate(Config(3 * kF, 6 * kF), rg, groups, 4, sizes);
  EXPECT_TRUE(r.finished) << "finished " << r.stats.finished << " of 8: " << r.state;
  EXPECT_LE(r.max_gpu, 3 * kF);
  EXPECT_LE(r.max_host, 6 * kF);
  EXPECT_GT(r.stats.swaps_out, 0u);
}

// The GPU run of s18a (swap_w64_capped): four Megatron ranks of ~100 MiB tracked on a cap of 1760 MiB. Counted as
// tracked peak + 512 MiB each (612 MiB) two fit; measured per process at 580 MiB three do, and the same job needs
// half the swaps.
TEST(SwapSimulation, MeasuredFootprintsHoldThreeOfFourRanksWithFewerSwaps) {
  constexpr uint64_t kMiB = 1ull << 20;
  std::map<int, std::string> rg = {{0, "g"}, {1, "g"}, {2, "g"}, {3, "g"}};
  std::vector<std::vector<int>> groups = {{0, 1}, {2, 3}, {0, 2}, {1, 3}, {0, 1, 2, 3}};
  SwapConfig cfg = Config(1760 * kMiB);
  cfg.context_bytes = 512 * kMiB;
  std::map<int, uint64_t> tracked, measured;
  for (int r = 0; r < 4; ++r) {
    tracked[r] = 100 * kMiB;
    measured[r] = 580 * kMiB;
  }
  SimResult assumed = Simulate(cfg, rg, groups, 10, tracked);
  SimResult real = Simulate(cfg, rg, groups, 10, tracked, measured);
  ASSERT_TRUE(assumed.finished) << assumed.state;
  ASSERT_TRUE(real.finished) << real.state;
  EXPECT_LE(assumed.max_gpu, 2 * 612 * kMiB);
  EXPECT_EQ(real.max_gpu, 3 * 580 * kMiB);
  EXPECT_EQ(real.stats.measured, 4);
  EXPECT_EQ(assumed.stats.measured, 0);
  EXPECT_GT(real.stats.swaps_out, 0u);
  // In this lockstep job: 2 swaps out per round instead of 4.
  EXPECT_LE(2 * real.stats.swaps_out, assumed.stats.swaps_out)
      << "swaps out: measured " << real.stats.swaps_out << ", assumed " << assumed.stats.swaps_out;
}

TEST(SwapSimulation, OneRankPerGpuAtATime) {
  std::map<int, std::string> rg = {{0, "g"}, {1, "g"}, {2, "g"}};
  SimResult r = Simulate(Config(kF), rg, {{0, 1}, {1, 2}, {0, 1, 2}}, 3, {});
  EXPECT_TRUE(r.finished) << "finished " << r.stats.finished << " of 3: " << r.state;
  EXPECT_LE(r.max_gpu, kF);
}

}  // namespace
}  // namespace prism::coord

namespace prism::coord {
namespace {

// Many shapes: random groups (2 to all ranks) over 4-6 ranks of 1-2 F on one GPU, every cap from the largest rank
// up, with no host budget and with a budget of all the ranks: every job finishes and no GPU ever holds more than its
// cap.
TEST(SwapSimulation, RandomJobsFinishWithinTheCap) {
  uint32_t seed = 12345;
  auto rnd = [&](uint32_t n) {
    seed = seed * 1664525u + 1013904223u;
    return (seed >> 8) % n;
  };
  int jobs = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 4 + static_cast<int>(rnd(3));
    std::map<int, std::string> rg;
    std::map<int, uint64_t> sizes;
    uint64_t total = 0, biggest = 0;
    for (int r = 0; r < n; ++r) {
      rg[r] = "g";
      sizes[r] = (1 + rnd(2)) * kF;
      total += sizes[r];
      biggest = std::max(biggest, sizes[r]);
    }
    std::vector<std::vector<int>> groups;
    const int ngroups = 2 + static_cast<int>(rnd(4));
    for (int g = 0; g < ngroups; ++g) {
      std::vector<int> members;
      for (int r = 0; r < n; ++r)
        if (rnd(2)) members.push_back(r);
      if (members.size() < 2) members = {0, n - 1};
      groups.push_back(members);
    }
    for (uint64_t cap = biggest; cap <= total; cap += kF) {
      for (uint64_t host : {uint64_t{0}, total}) {
        for (bool estimate : {true, false}) {
          SwapConfig cfg = Config(cap, host);
          // With --rank-mem at the largest rank the cap always holds; learning sizes, a rank started on the
          // estimate of a smaller one may overshoot by the difference (1 F here) until one blocks.
          if (estimate) cfg.rank_estimate_bytes = biggest;
          SimResult r = Simulate(cfg, rg, groups, 3, sizes);
          ++jobs;
          EXPECT_TRUE(r.finished) << "trial " << trial << " cap " << (cap >> 30) << "F host " << (host >> 30)
                                  << "F: " << r.state;
          EXPECT_LE(r.max_gpu, estimate ? cap : cap + kF) << "trial " << trial << " estimate " << estimate;
          if (host) {
            EXPECT_LE(r.max_host, host) << "trial " << trial;
          }
        }
      }
    }
  }
  EXPECT_GT(jobs, 100);
}

}  // namespace
}  // namespace prism::coord

namespace prism::coord {
namespace {

// The shape of the GPU case swap_big (pp 4 x tp 2, tests/gpu/swap_suite.sh): eight ranks in tensor-parallel pairs
// (0,1) (2,3) (4,5) (6,7), each pair doing several pair collectives per stage, the stages linked by pipeline pairs,
// then a collective of the whole replica; five fit. Pair collectives must cost no swaps (docs/collect.md "No
// deadlock": without the victim rule a pair's ranks were swapped for each other, one swap per pair collective, ~17 s
// each on the GPU; the lockstep simulation here does not reach that state,
// ARankThatWaitsForTheIncomingOneIsNotItsVictim does).
std::vector<std::vector<int>> PipelinePairs(int pair_ops) {
  std::vector<std::vector<int>> g;
  for (int s = 0; s < 4; ++s) {
    for (int k = 0; k < pair_ops; ++k) g.push_back({2 * s, 2 * s + 1});
    if (s < 3) {
      g.push_back({2 * s, 2 * s + 2});
      g.push_back({2 * s + 1, 2 * s + 3});
    }
  }
  g.push_back({0, 1, 2, 3, 4, 5, 6, 7});
  return g;
}

TEST(SwapSimulation, TensorParallelPairsAreNotSwappedForEachOther) {
  std::map<int, std::string> rg;
  for (int r = 0; r < 8; ++r) rg[r] = "g";
  // The GPU run's footprints in GiB (stage 0 the largest) against its cap of 132.8 GiB: five fit.
  std::map<int, uint64_t> sizes = {{0, 25 * kF}, {1, 25 * kF}, {2, 23 * kF}, {3, 23 * kF},
                                   {4, 21 * kF}, {5, 21 * kF}, {6, 19 * kF}, {7, 19 * kF}};
  const int rounds = 4;
  SimResult few = Simulate(Config(118 * kF), rg, PipelinePairs(1), rounds, sizes);
  SimResult many = Simulate(Config(118 * kF), rg, PipelinePairs(14), rounds, sizes);
  ASSERT_TRUE(few.finished) << few.state;
  ASSERT_TRUE(many.finished) << many.state;
  EXPECT_LE(many.max_gpu, 118 * kF);
  // Fourteen pair collectives per stage instead of one cost no more swaps: the pairs stay together.
  EXPECT_LE(many.stats.swaps_out, few.stats.swaps_out)
      << "swaps out with 14 pair collectives per stage " << many.stats.swaps_out << ", with 1 " << few.stats.swaps_out;
}

}  // namespace
}  // namespace prism::coord
