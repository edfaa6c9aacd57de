// Virtual ranks in the store: for each key family, a real rank reading a key that only a virtual rank would write
// gets an answer at once, and a key a real rank will write is waited for as torch would.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "common/ipc_io.h"
#include "coordinator/store/store_client.h"
#include "coordinator/store/store_server.h"
#include "coordinator/store/virtual_ranks.h"

namespace prism::coord {
namespace {

using store::StoreClient;

std::string GroupJson(const std::string& name, const std::vector<int>& ranks, const std::string& desc = "") {
  std::string s = "{\"v\":1,\"name\":\"" + name + "\",\"desc\":\"" + desc + "\",\"ranks\":[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "],\"size\":" + std::to_string(ranks.size()) + "}";
}

class VirtualStoreTest : public ::testing::Test {
 protected:
  void Start(int world, std::vector<int> real, const world::GroupMembership* membership = nullptr) {
    VirtualRanksOptions o;
    o.world_size = world;
    o.real_ranks = std::move(real);
    o.membership = membership;
    vr_ = std::make_unique<VirtualRanks>(o);
    store::StoreServerOptions so;
    so.stand_in = vr_.get();
    std::string error;
    ASSERT_TRUE(server_.Start(so, &error)) << error;
  }
  void TearDown() override { server_.Stop(); }

  std::unique_ptr<StoreClient> Connect() {
    auto c = std::make_unique<StoreClient>();
    EXPECT_TRUE(c->Connect("127.0.0.1", server_.port())) << c->error();
    return c;
  }

  // torch's get(): WAIT then GET. Empty string when the wait timed out.
  static std::string TorchGet(StoreClient& c, const std::string& key, int timeout_ms = 2000) {
    bool timed_out = false;
    EXPECT_TRUE(c.Wait({key}, timeout_ms, &timed_out)) << c.error();
    if (timed_out) return "";
    std::string v;
    EXPECT_TRUE(c.Get(key, &v));
    return v;
  }

  std::unique_ptr<VirtualRanks> vr_;
  store::StoreServer server_;
};

TEST(VirtualRanksKeys, ParseIdKeys) {
  auto id = ParseIdKeyUnder("/default_pg/0//cuda//3", "/default_pg/0//");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->kind, IdKey::Kind::kCollective);
  EXPECT_EQ(id->device, "cuda");
  EXPECT_EQ(id->index, 3);
  id = ParseIdKeyUnder("/default_pg/0//7//cuda//5:2", "/default_pg/0//7//");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->kind, IdKey::Kind::kP2P);
  EXPECT_EQ(id->low, 2);
  EXPECT_EQ(id->high, 5);
  id = ParseIdKeyUnder("/default_pg/0//7//cuda//UniqueNCCLID:12", "/default_pg/0//7//");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->kind, IdKey::Kind::kScalable);
  EXPECT_EQ(id->root, 12);
  EXPECT_EQ(id->stem, "/default_pg/0//7//cuda//UniqueNCCLID:");
  EXPECT_FALSE(ParseIdKeyUnder("/default_pg/0//7//cuda//foo", "/default_pg/0//7//"));
  EXPECT_FALSE(ParseIdKeyUnder("/default_pg/0//store_based_barrier_key:1", "/default_pg/0//"));
  EXPECT_FALSE(ParseIdKeyUnder("/default_pg/0//1//cuda//0", "/default_pg/0//")) << "dev may not hold '/'";

  auto sp = SplitStandardIdKey("/default_pg/0//cuda//0");
  ASSERT_TRUE(sp);
  EXPECT_TRUE(sp->is_default);
  EXPECT_EQ(sp->name, "0");
  EXPECT_EQ(sp->prefix, "/default_pg/0//");
  sp = SplitStandardIdKey("/default_pg/0//12//cuda//0");
  ASSERT_TRUE(sp);
  EXPECT_FALSE(sp->is_default);
  EXPECT_EQ(sp->name, "12");
  EXPECT_EQ(sp->prefix, "/default_pg/0//12//");
  EXPECT_FALSE(SplitStandardIdKey("/exception_dump"));
}

TEST(VirtualRanksKeys, ScalableRootsMatchTorchSplit) {
  // 10 ranks over 3 roots: 4, 3, 3 -> roots at group ranks 0, 4, 7.
  EXPECT_EQ(ScalableRootGroupRank(0, 10, 3), 0);
  EXPECT_EQ(ScalableRootGroupRank(1, 10, 3), 4);
  EXPECT_EQ(ScalableRootGroupRank(2, 10, 3), 7);
  EXPECT_EQ(ScalableRootGroupRank(1, 300, 3), 100);
  EXPECT_EQ(ScalableRootGroupRank(2, 256, 2), 256);  // out of range root -> caller checks
}

TEST(VirtualIds, DeterministicAndMarked) {
  std::string a = ipc::MakeVirtualNcclId("/default_pg/0//cuda//0", 4);
  std::string b = ipc::MakeVirtualNcclId("/default_pg/0//cuda//0", 4);
  std::string c = ipc::MakeVirtualNcclId("/default_pg/0//cuda//1", 4);
  EXPECT_EQ(a.size(), 128u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int writer = -1;
  EXPECT_TRUE(ipc::IsVirtualNcclId(a.data(), a.size(), &writer));
  EXPECT_EQ(writer, 4);
  std::string real(128, '\0');
  EXPECT_FALSE(ipc::IsVirtualNcclId(real.data(), real.size()));
}

TEST_F(VirtualStoreTest, InitCountReachesWorldWhenLastRealRankArrives) {
  Start(8, {0, 5});
  auto r0 = Connect();
  auto r5 = Connect();
  int64_t v = 0;
  ASSERT_TRUE(r0->Add("init/", 1, &v));
  EXPECT_EQ(v, 7);
  ASSERT_TRUE(r5->Add("init/", 1, &v));
  EXPECT_EQ(v, 8);
  std::string s;
  ASSERT_TRUE(r0->Get("init/", &s));
  EXPECT_EQ(s, "8");
}

TEST_F(VirtualStoreTest, ThousandRealClientsInitOf8192) {
  std::vector<int> real;
  for (int i = 0; i < 1000; ++i) real.push_back(i * 8);
  Start(8192, real);
  std::vector<std::unique_ptr<StoreClient>> clients(1000);
  std::vector<int64_t> got(1000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < 1000; i += 8) {
        clients[static_cast<size_t>(i)] = std::make_unique<StoreClient>();
        ASSERT_TRUE(clients[static_cast<size_t>(i)]->Connect("127.0.0.1", server_.port(), 30000));
        ASSERT_TRUE(clients[static_cast<size_t>(i)]->Add("init/", 1, &got[static_cast<size_t>(i)]));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*std::max_element(got.begin(), got.end()), 8192);
  EXPECT_EQ(*std::min_element(got.begin(), got.end()), 8192 - 1000 + 1);
}

TEST_F(VirtualStoreTest, DefaultGroupIdWithRealLeaderIsWaitedFor) {
  Start(8, {0, 5});
  auto r0 = Connect();
  auto r5 = Connect();
  EXPECT_EQ(TorchGet(*r5, "/default_pg/0//cuda//0", 200), "") << "rank 0 is real: wait for it";
  std::string real_id(128, '\x42');
  ASSERT_TRUE(r0->Set("/default_pg/0//cuda//0", real_id));
  EXPECT_EQ(TorchGet(*r5, "/default_pg/0//cuda//0"), real_id);
  auto ident = vr_->LookupId(real_id);
  ASSERT_TRUE(ident);
  EXPECT_EQ(ident->members.size(), 8u);
  EXPECT_FALSE(ident->virtual_leader);
}

TEST_F(VirtualStoreTest, DefaultGroupIdWithVirtualLeaderIsSynthesized) {
  Start(8, {3, 5});
  auto r3 = Connect();
  auto r5 = Connect();
  std::string a = TorchGet(*r3, "/default_pg/0//cuda//0");
  std::string b = TorchGet(*r5, "/default_pg/0//cuda//0");
  ASSERT_EQ(a.size(), 128u);
  EXPECT_EQ(a, b);
  int writer = -1;
  EXPECT_TRUE(ipc::IsVirtualNcclId(a.data(), a.size(), &writer));
  EXPECT_EQ(writer, 0);
  EXPECT_EQ(a, ipc::MakeVirtualNcclId("/default_pg/0//cuda//0", 0)) << "deterministic across runs";
  auto ident = vr_->LookupId(a);
  ASSERT_TRUE(ident);
  EXPECT_TRUE(ident->virtual_leader);
  EXPECT_EQ(ident->members, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // A plain GET (no WAIT first) and a CHECK answer too.
  std::string v;
  ASSERT_TRUE(r5->Get("/default_pg/0//cuda//1", &v));
  EXPECT_EQ(v.size(), 128u);
  bool ready = false;
  ASSERT_TRUE(r5->Check({"/default_pg/0//cpu//0"}, &ready));
  EXPECT_TRUE(ready);
}

TEST_F(VirtualStoreTest, RegisteredGroupLeaderDecides) {
  Start(8, {0, 5});
  auto r5 = Connect();
  // The hook registers through the group's own store: "<prefix>__prism_group__".
  ASSERT_TRUE(r5->Set("/default_pg/0//1//__prism_group__", GroupJson("1", {4, 5, 6, 7}, "TENSOR_MODEL_PARALLEL")));
  ASSERT_TRUE(r5->Set("/default_pg/0//2//__prism_group__", GroupJson("2", {5, 1})));
  std::string id1 = TorchGet(*r5, "/default_pg/0//1//cuda//0");
  int writer = -1;
  ASSERT_TRUE(ipc::IsVirtualNcclId(id1.data(), id1.size(), &writer));
  EXPECT_EQ(writer, 4);
  EXPECT_EQ(TorchGet(*r5, "/default_pg/0//2//cuda//0", 200), "") << "group 2's leader is rank 5 itself (real)";
  int64_t n = 0;
  ASSERT_TRUE(r5->NumKeys(&n));
  EXPECT_EQ(n, 1) << "registrations are not stored; the synthesized id is";
  auto g = vr_->LookupGroupByCommDesc("TENSOR_MODEL_PARALLEL:1");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->members, (std::vector<int>{4, 5, 6, 7}));
}

TEST_F(VirtualStoreTest, P2PKeysFollowTheLowerGroupRank) {
  Start(8, {0, 5});
  auto r5 = Connect();
  ASSERT_TRUE(r5->Set("/default_pg/0//1//__prism_group__", GroupJson("1", {4, 5, 6, 7})));
  // group ranks 0 (rank 4, virtual) and 1 (rank 5): the lower, virtual, writes.
  std::string id = TorchGet(*r5, "/default_pg/0//1//cuda//0:1");
  int writer = -1;
  ASSERT_TRUE(ipc::IsVirtualNcclId(id.data(), id.size(), &writer));
  EXPECT_EQ(writer, 4);
  auto ident = vr_->LookupId(id);
  ASSERT_TRUE(ident);
  EXPECT_EQ(ident->members, (std::vector<int>{4, 5}));
  // group ranks 1 (rank 5, real) and 3: rank 5 writes, so wait.
  EXPECT_EQ(TorchGet(*r5, "/default_pg/0//1//cuda//1:3", 200), "");
}

TEST_F(VirtualStoreTest, ScalableInitKeysPerRoot) {
  Start(300, {150});
  auto r = Connect();
  std::vector<std::string> keys;
  for (int i = 0; i < 3; ++i) keys.push_back("/default_pg/0//cuda//UniqueNCCLID:" + std::to_string(i));
  // rank 150 is not a root (roots at 0, 100, 200): every id comes from a virtual root.
  bool timed_out = true;
  ASSERT_TRUE(r->Wait(keys, 2000, &timed_out));
  EXPECT_FALSE(timed_out);
  std::vector<std::string> ids;
  ASSERT_TRUE(r->MultiGet(keys, &ids));
  int writers[3];
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ipc::IsVirtualNcclId(ids[static_cast<size_t>(i)].data(), 128, &writers[i]));
  EXPECT_EQ(writers[0], 0);
  EXPECT_EQ(writers[1], 100);
  EXPECT_EQ(writers[2], 200);
}

TEST_F(VirtualStoreTest, ScalableInitWaitsForARealRoot) {
  Start(300, {100, 150});
  auto r100 = Connect();
  auto r150 = Connect();
  std::vector<std::string> keys;
  for (int i = 0; i < 3; ++i) keys.push_back("/default_pg/0//cuda//UniqueNCCLID:" + std::to_string(i));
  bool timed_out = false;
  ASSERT_TRUE(r150->Wait(keys, 200, &timed_out));
  EXPECT_TRUE(timed_out) << "root 1 is rank 100, real";
  ASSERT_TRUE(r100->Set(keys[1], std::string(128, 'R')));
  ASSERT_TRUE(r150->Wait(keys, 2000, &timed_out));
  EXPECT_FALSE(timed_out);
  std::vector<std::string> ids;
  ASSERT_TRUE(r150->MultiGet(keys, &ids));
  EXPECT_EQ(ids[1], std::string(128, 'R'));
  EXPECT_TRUE(ipc::IsVirtualNcclId(ids[0].data(), 128));
}

TEST_F(VirtualStoreTest, RegistrationAfterTheWaitAnswersIt) {
  Start(8, {0, 5});
  auto r5 = Connect();
  auto other = Connect();
  ASSERT_TRUE(r5->SendRaw(store::EncodeKeyList(store::QueryType::kWait, {"/default_pg/0//3//cuda//0"})));
  int64_t n;
  ASSERT_TRUE(other->NumKeys(&n));  // the WAIT is registered
  auto unresolved = vr_->Unresolved();
  ASSERT_EQ(unresolved.size(), 1u);
  EXPECT_EQ(unresolved[0], "/default_pg/0//3//cuda//0");
  // Another connection (another process of the job) registers group 3 = {6, 5}.
  ASSERT_TRUE(other->Set("/default_pg/0//3//__prism_group__", GroupJson("3", {6, 5})));
  uint8_t b = 9;
  ASSERT_TRUE(r5->ReadRaw(&b, 1, 5000)) << r5->error();
  EXPECT_EQ(b, store::kStopWaiting);
  EXPECT_TRUE(vr_->Unresolved().empty());
}

TEST_F(VirtualStoreTest, LauncherRegistrationByNameAndMembershipInterface) {
  struct Layout : world::GroupMembership {
    std::optional<std::vector<int>> Members(std::string_view name) const override {
      if (name == "9") return std::vector<int>{7, 5};
      return std::nullopt;
    }
  } layout;
  Start(8, {0, 5}, &layout);
  vr_->RegisterGroup("4", {2, 5});  // what the launcher's layout code would do
  auto r5 = Connect();
  std::string a = TorchGet(*r5, "/default_pg/0//4//cuda//0");
  std::string b = TorchGet(*r5, "/default_pg/0//9//cuda//0");
  int wa = -1, wb = -1;
  ASSERT_TRUE(ipc::IsVirtualNcclId(a.data(), a.size(), &wa));
  ASSERT_TRUE(ipc::IsVirtualNcclId(b.data(), b.size(), &wb));
  EXPECT_EQ(wa, 2);
  EXPECT_EQ(wb, 7);
}

TEST_F(VirtualStoreTest, UnknownGroupIsWaitedForNotGuessed) {
  Start(8, {0, 5});
  auto r5 = Connect();
  EXPECT_EQ(TorchGet(*r5, "/default_pg/0//6//cuda//0", 200), "");
  EXPECT_EQ(vr_->Unresolved().size(), 1u);
}

TEST_F(VirtualStoreTest, StoreBarrierAfterInit) {
  Start(8, {0, 5});
  auto r0 = Connect();
  auto r5 = Connect();
  // _store_based_barrier: add(key, 1); count = add(key, 0); the last sets ":last_worker"; all wait on it.
  const std::string key = "/default_pg/store_based_barrier_key:0";
  int64_t v = 0;
  ASSERT_TRUE(r0->Add(key, 1, &v));
  ASSERT_TRUE(r0->Add(key, 0, &v));
  EXPECT_EQ(v, 7);
  ASSERT_TRUE(r5->Add(key, 1, &v));
  ASSERT_TRUE(r5->Add(key, 0, &v));
  EXPECT_EQ(v, 8);
  ASSERT_TRUE(r5->Set(key + ":last_worker", "1"));
  EXPECT_EQ(TorchGet(*r0, key + ":last_worker"), "1");
}

TEST_F(VirtualStoreTest, StoreBarrierOfNewGroups) {
  Start(8, {0, 5});
  auto r5 = Connect();
  int64_t v = 0;
  // new_group without local synchronization: the default store, the whole world takes part.
  ASSERT_TRUE(r5->Add("/default_pg/0//store_based_barrier_key:1", 1, &v));
  EXPECT_EQ(v, 7);
  // use_local_synchronization=True: the group's own store, its members take part.
  ASSERT_TRUE(r5->Set("/default_pg/0//abc//__prism_group__", GroupJson("abc", {4, 5, 6})));
  ASSERT_TRUE(r5->Add("/default_pg/0//abc//store_based_barrier_key:abc", 1, &v));
  EXPECT_EQ(v, 3);
  // The last-worker key is never made up.
  EXPECT_EQ(TorchGet(*r5, "/default_pg/0//store_based_barrier_key:1:last_worker", 200), "");
}

TEST_F(VirtualStoreTest, DefaultGroupRegistersWithoutRanks) {
  Start(8, {3, 5});
  auto c = Connect();
  // What the hook sends for init_process_group: torch's global_ranks_in_group is [] there.
  ASSERT_TRUE(c->Set("/default_pg/0//__prism_group__", R"({"name":"0","ranks":[]})"));
  std::string id = TorchGet(*c, "/default_pg/0//cuda//0");
  int writer = -1;
  ASSERT_TRUE(ipc::IsVirtualNcclId(id.data(), id.size(), &writer));
  EXPECT_EQ(writer, 0);
  EXPECT_EQ(vr_->LookupGroupByName("0")->members.size(), 8u);
}

TEST_F(VirtualStoreTest, BadRegistrationIsIgnoredNotStored) {
  Start(8, {0});
  auto c = Connect();
  ASSERT_TRUE(c->Set("/default_pg/0//5//__prism_group__", "{not json"));
  ASSERT_TRUE(c->Set("/default_pg/0//5//__prism_group__", GroupJson("5", {1, 99})));
  int64_t n = -1;
  ASSERT_TRUE(c->NumKeys(&n));
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(vr_->LookupGroupByName("5"));
}

}  // namespace
}  // namespace prism::coord
