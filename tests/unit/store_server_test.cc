// The TCPStore server over loopback: every command as torch's libuv server answers it, waits woken by other
// clients, CANCEL_WAIT, many clients, and misbehaving clients dropped while the others carry on.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <thread>

#include "coordinator/store/store_client.h"
#include "coordinator/store/store_server.h"

namespace prism::store {
namespace {

class StoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(server_.Start(opts_, &error)) << error;
    ASSERT_NE(server_.port(), 0);
  }
  void TearDown() override { server_.Stop(); }

  std::unique_ptr<StoreClient> Connect() {
    auto c = std::make_unique<StoreClient>();
    EXPECT_TRUE(c->Connect("127.0.0.1", server_.port())) << c->error();
    return c;
  }

  // True when the server closed the client's connection within a few seconds.
  static bool ClosedByServer(StoreClient& c) {
    char b;
    for (int i = 0; i < 50; ++i) {
      if (!c.ReadRaw(&b, 1, 100)) {
        if (c.error() != "timed out") return true;
      } else {
        return false;  // unexpected data
      }
    }
    return false;
  }

  StoreServerOptions opts_;
  StoreServer server_;
};

TEST_F(StoreServerTest, PortZeroPicksAPortAndPingEchoes) {
  auto c = Connect();
  uint32_t echo = 0;
  ASSERT_TRUE(c->Ping(0xdeadbeef, &echo));
  EXPECT_EQ(echo, 0xdeadbeefu);
}

TEST_F(StoreServerTest, SetGetAndMissingKeys) {
  auto c = Connect();
  std::string v;
  ASSERT_TRUE(c->Get("/missing", &v));
  EXPECT_EQ(v, "");
  std::string bin("\0\1\2\xff", 4);
  ASSERT_TRUE(c->Set("/k", bin));
  ASSERT_TRUE(c->Get("/k", &v));
  EXPECT_EQ(v, bin);
  ASSERT_TRUE(c->Set("/k", "second"));
  ASSERT_TRUE(c->Get("/k", &v));
  EXPECT_EQ(v, "second");
}

TEST_F(StoreServerTest, AddStoresAsciiDecimal) {
  auto c = Connect();
  int64_t r = 0;
  ASSERT_TRUE(c->Add("init/", 1, &r));
  EXPECT_EQ(r, 1);
  ASSERT_TRUE(c->Add("init/", 2, &r));
  EXPECT_EQ(r, 3);
  ASSERT_TRUE(c->Add("init/", -10, &r));
  EXPECT_EQ(r, -7);
  std::string v;
  ASSERT_TRUE(c->Get("init/", &v));
  EXPECT_EQ(v, "-7");
  ASSERT_TRUE(c->Set("/n", " 41"));  // torch parses with stoll: leading blanks are fine
  ASSERT_TRUE(c->Add("/n", 1, &r));
  EXPECT_EQ(r, 42);
}

TEST_F(StoreServerTest, AddOnANonNumberDropsOnlyThatClient) {
  auto bad = Connect();
  auto good = Connect();
  ASSERT_TRUE(good->Set("/word", "hello"));
  ASSERT_TRUE(bad->SendRaw(EncodeAdd("/word", 1)));
  EXPECT_TRUE(ClosedByServer(*bad));
  int64_t r = 0;
  ASSERT_TRUE(good->Add("/num", 5, &r));
  EXPECT_EQ(r, 5);
  EXPECT_EQ(server_.Stats().dropped, 1u);
}

TEST_F(StoreServerTest, CheckWaitAndNumKeys) {
  auto c = Connect();
  bool ready = true;
  ASSERT_TRUE(c->Check({"/a"}, &ready));
  EXPECT_FALSE(ready);
  ASSERT_TRUE(c->Set("/a", "1"));
  ASSERT_TRUE(c->Check({"/a"}, &ready));
  EXPECT_TRUE(ready);
  ASSERT_TRUE(c->Check({"/a", "/b"}, &ready));
  EXPECT_FALSE(ready);
  bool timed_out = true;
  ASSERT_TRUE(c->Wait({"/a"}, 1000, &timed_out));
  EXPECT_FALSE(timed_out);
  int64_t n = 0;
  ASSERT_TRUE(c->NumKeys(&n));
  EXPECT_EQ(n, 1);
}

TEST_F(StoreServerTest, CompareSetFollowsTorch) {
  auto c = Connect();
  std::string r;
  // Missing key, expected "": stores desired and returns it.
  ASSERT_TRUE(c->CompareSet("/cs", "", "first", &r));
  EXPECT_EQ(r, "first");
  // Mismatch: returns the current value, unchanged.
  ASSERT_TRUE(c->CompareSet("/cs", "nope", "second", &r));
  EXPECT_EQ(r, "first");
  // Match: swaps.
  ASSERT_TRUE(c->CompareSet("/cs", "first", "second", &r));
  EXPECT_EQ(r, "second");
  // Missing key, expected non-empty: returns expected, stores nothing.
  ASSERT_TRUE(c->CompareSet("/other", "x", "y", &r));
  EXPECT_EQ(r, "x");
  bool ready = true;
  ASSERT_TRUE(c->Check({"/other"}, &ready));
  EXPECT_FALSE(ready);
}

TEST_F(StoreServerTest, DeleteAppendMultiGetMultiSetListKeys) {
  auto c = Connect();
  int64_t n = -1;
  ASSERT_TRUE(c->DeleteKey("/none", &n));
  EXPECT_EQ(n, 0);
  ASSERT_TRUE(c->Append("/ap", "ab"));
  ASSERT_TRUE(c->Append("/ap", "cd"));
  std::string v;
  ASSERT_TRUE(c->Get("/ap", &v));
  EXPECT_EQ(v, "abcd");
  ASSERT_TRUE(c->DeleteKey("/ap", &n));
  EXPECT_EQ(n, 1);
  ASSERT_TRUE(c->MultiSet({"/m1", "/m2", "/m3"}, {"1", "", "333"}));
  std::vector<std::string> vals;
  ASSERT_TRUE(c->MultiGet({"/m3", "/m1", "/nope", "/m2"}, &vals));
  EXPECT_EQ(vals, (std::vector<std::string>{"333", "1", "", ""}));
  std::vector<std::string> keys;
  ASSERT_TRUE(c->ListKeys(&keys));
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()), (std::set<std::string>{"/m1", "/m2", "/m3"}));
}

TEST_F(StoreServerTest, Queues) {
  auto c = Connect();
  int64_t n = -1;
  ASSERT_TRUE(c->QueueLen("/q", &n));
  EXPECT_EQ(n, 0);
  std::optional<std::string> v = "x";
  ASSERT_TRUE(c->QueuePop("/q", &v));
  EXPECT_FALSE(v.has_value());
  ASSERT_TRUE(c->QueuePush("/q", "one"));
  ASSERT_TRUE(c->QueuePush("/q", "two"));
  ASSERT_TRUE(c->QueueLen("/q", &n));
  EXPECT_EQ(n, 2);
  bool ready = false;
  ASSERT_TRUE(c->Check({"/q"}, &ready));  // a non-empty queue counts as present (torch's checkKeys)
  EXPECT_TRUE(ready);
  ASSERT_TRUE(c->QueuePop("/q", &v));
  EXPECT_EQ(v, "one");
  ASSERT_TRUE(c->QueuePop("/q", &v));
  EXPECT_EQ(v, "two");
}

TEST_F(StoreServerTest, QueuePushWakesOneWaiter) {
  auto a = Connect();
  auto b = Connect();
  auto pusher = Connect();
  ASSERT_TRUE(a->SendRaw(EncodeKeyList(QueryType::kWait, {"/q"})));
  ASSERT_TRUE(b->SendRaw(EncodeKeyList(QueryType::kWait, {"/q"})));
  int64_t n;
  ASSERT_TRUE(pusher->QueueLen("/q", &n));  // both WAITs are registered once this round trip is done
  ASSERT_TRUE(pusher->QueuePush("/q", "item"));
  uint8_t r = 9;
  ASSERT_TRUE(a->ReadRaw(&r, 1, 5000)) << a->error();
  EXPECT_EQ(r, kStopWaiting);
  EXPECT_FALSE(b->ReadRaw(&r, 1, 200));  // only one item, only one waiter woken
  EXPECT_EQ(b->error(), "timed out");
}

TEST_F(StoreServerTest, WaitIsWokenBySetFromAnotherClient) {
  auto waiter = Connect();
  auto setter = Connect();
  std::atomic<bool> done{false};
  bool timed_out = true;
  bool ok = false;
  std::thread t([&] {
    ok = waiter->Wait({"/x", "/y"}, 30000, &timed_out);
    done = true;
  });
  ASSERT_TRUE(setter->Set("/x", "1"));
  int64_t n;
  ASSERT_TRUE(setter->NumKeys(&n));  // a round trip: /x is processed
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load()) << "woken with /y still missing";
  ASSERT_TRUE(setter->Set("/y", "2"));
  t.join();
  EXPECT_TRUE(ok) << waiter->error();
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(server_.Stats().store.waits, 0u);
}

TEST_F(StoreServerTest, CancelWaitLikeTorchTimeout) {
  auto c = Connect();
  bool timed_out = false;
  ASSERT_TRUE(c->Wait({"/never"}, 100, &timed_out)) << c->error();
  EXPECT_TRUE(timed_out);
  EXPECT_EQ(server_.Stats().store.waits, 0u);
  // The cancelled wait must not answer later.
  auto other = Connect();
  ASSERT_TRUE(other->Set("/never", "now"));
  uint8_t b;
  EXPECT_FALSE(c->ReadRaw(&b, 1, 200));
  EXPECT_EQ(c->error(), "timed out");
  uint32_t echo = 0;
  ASSERT_TRUE(c->Ping(7, &echo));
  EXPECT_EQ(echo, 7u);
}

TEST_F(StoreServerTest, CancelWaitWithoutAWaitStillAnswers) {
  auto c = Connect();
  ASSERT_TRUE(c->SendRaw(EncodeNoArgs(QueryType::kCancelWait)));
  uint8_t b = 9;
  ASSERT_TRUE(c->ReadU8(&b));
  EXPECT_EQ(b, kWaitCanceled);
}

TEST_F(StoreServerTest, BarrierCommand) {
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a->SendRaw(EncodeBarrier("/bar", 2)));
  uint8_t r;
  EXPECT_FALSE(a->ReadRaw(&r, 1, 100));
  // A plain SET of the barrier key must not release barrier participants.
  ASSERT_TRUE(b->Barrier("/bar", 2, 5000)) << b->error();
  ASSERT_TRUE(a->ReadRaw(&r, 1, 5000));
  EXPECT_EQ(r, kStopWaiting);
  std::string v;
  ASSERT_TRUE(b->Get("/bar", &v));
  EXPECT_EQ(v, "2");
}

TEST_F(StoreServerTest, HalfARequestNowAndTheRestLater) {
  auto c = Connect();
  std::string set = EncodeKeyValue(QueryType::kSet, "/split", std::string(100000, 'v'));
  for (size_t cut : {1ul, 9ul, 17ul, 5000ul, set.size() - 1}) {
    ASSERT_TRUE(c->SendRaw(set.substr(0, cut)));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(c->SendRaw(set.substr(cut)));
    std::string v;
    ASSERT_TRUE(c->Get("/split", &v));
    EXPECT_EQ(v.size(), 100000u);
    int64_t n;
    ASSERT_TRUE(c->DeleteKey("/split", &n));
  }
}

TEST_F(StoreServerTest, PipelinedRequestsAnswerInOrder) {
  auto c = Connect();
  std::string batch = EncodeKeyValue(QueryType::kSet, "/p", "v") + EncodeKeyOnly(QueryType::kGet, "/p") +
                      EncodeAdd("/c", 4) + EncodePing(99) + EncodeNoArgs(QueryType::kGetNumKeys);
  ASSERT_TRUE(c->SendRaw(batch));
  std::string v;
  int64_t i = 0;
  uint32_t echo = 0;
  ASSERT_TRUE(c->ReadBytes(&v));
  EXPECT_EQ(v, "v");
  ASSERT_TRUE(c->ReadI64(&i));
  EXPECT_EQ(i, 4);
  ASSERT_TRUE(c->ReadRaw(&echo, 4, 1000));
  EXPECT_EQ(echo, 99u);
  ASSERT_TRUE(c->ReadI64(&i));
  EXPECT_EQ(i, 2);
}

TEST_F(StoreServerTest, LargestValueRoundTripsAndOneMoreByteIsDropped) {
  auto c = Connect();
  std::string big(8u << 20, 'b');
  ASSERT_TRUE(c->Set("/big", big));
  std::string v;
  ASSERT_TRUE(c->Get("/big", &v));
  EXPECT_EQ(v, big);
  auto bad = Connect();
  std::string head;
  PutU8(&head, static_cast<uint8_t>(QueryType::kSet));
  PutBytes(&head, "/big2");
  PutU64(&head, (8u << 20) + 1);
  ASSERT_TRUE(bad->SendRaw(head));  // the length alone gets it dropped: no need to send 8 MiB
  EXPECT_TRUE(ClosedByServer(*bad));
  int64_t n;
  ASSERT_TRUE(c->NumKeys(&n));
  EXPECT_EQ(n, 1);
}

TEST_F(StoreServerTest, GarbageClientsAreDroppedOthersCarryOn) {
  auto good = Connect();
  ASSERT_TRUE(good->Set("/alive", "1"));
  // 1: random bytes as the first thing.
  StoreClient g1;
  ASSERT_TRUE(g1.Connect("127.0.0.1", server_.port(), 1000, /*handshake=*/false));
  ASSERT_TRUE(g1.SendRaw("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(ClosedByServer(g1));
  // 2: a valid command but no VALIDATE first.
  StoreClient g2;
  ASSERT_TRUE(g2.Connect("127.0.0.1", server_.port(), 1000, false));
  ASSERT_TRUE(g2.SendRaw(EncodeKeyValue(QueryType::kSet, "/sneaky", "x")));
  EXPECT_TRUE(ClosedByServer(g2));
  // 3: VALIDATE with the wrong magic.
  StoreClient g3;
  ASSERT_TRUE(g3.Connect("127.0.0.1", server_.port(), 1000, false));
  ASSERT_TRUE(g3.SendRaw(EncodeValidate(0x12345678)));
  EXPECT_TRUE(ClosedByServer(g3));
  // 4: validated, then an unknown command byte.
  StoreClient g4;
  ASSERT_TRUE(g4.Connect("127.0.0.1", server_.port(), 1000, true));
  ASSERT_TRUE(g4.SendRaw(std::string(1, '\x55')));
  EXPECT_TRUE(ClosedByServer(g4));
  // 5: a key count over the limit.
  StoreClient g5;
  ASSERT_TRUE(g5.Connect("127.0.0.1", server_.port(), 1000, true));
  std::string w;
  PutU8(&w, static_cast<uint8_t>(QueryType::kMultiGet));
  PutU64(&w, 1ull << 40);
  ASSERT_TRUE(g5.SendRaw(w));
  EXPECT_TRUE(ClosedByServer(g5));

  std::string v;
  ASSERT_TRUE(good->Get("/alive", &v));
  EXPECT_EQ(v, "1");
  ASSERT_TRUE(good->Get("/sneaky", &v));
  EXPECT_EQ(v, "");
  EXPECT_EQ(server_.Stats().dropped, 5u);
}

TEST_F(StoreServerTest, ClientKilledMidRequestWhileOthersContinue) {
  // A child process connects, validates, sends half of a SET and is killed with SIGKILL.
  std::string hello = EncodeValidate() + EncodePing(1);
  std::string half = EncodeKeyValue(QueryType::kSet, "/half", std::string(1000, 'h')).substr(0, 500);
  uint16_t port = server_.port();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) ::_exit(1);
    ::write(fd, hello.data(), hello.size());
    char echo[4];
    ::read(fd, echo, 4);
    ::write(fd, half.data(), half.size());
    ::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  auto waiter = Connect();
  ASSERT_TRUE(waiter->SendRaw(EncodeKeyList(QueryType::kWait, {"/after"})));
  char r;
  ASSERT_EQ(::read(ready[0], &r, 1), 1);
  ::close(ready[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The others carry on: a new client sets the key the waiter waits for.
  auto setter = Connect();
  ASSERT_TRUE(setter->Set("/after", "1"));
  uint8_t b = 9;
  ASSERT_TRUE(waiter->ReadRaw(&b, 1, 5000)) << waiter->error();
  EXPECT_EQ(b, kStopWaiting);
  std::string v;
  ASSERT_TRUE(setter->Get("/half", &v));
  EXPECT_EQ(v, "") << "half a SET must not be applied";
  for (int i = 0; i < 100 && server_.Stats().dropped == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(server_.Stats().dropped, 1u) << "a mid-request disconnect is logged as a drop";
}

TEST_F(StoreServerTest, WaitingClientThatDisconnectsIsForgotten) {
  {
    auto w = Connect();
    ASSERT_TRUE(w->SendRaw(EncodeKeyList(QueryType::kWait, {"/gone"})));
    int64_t n;
    auto probe = Connect();
    ASSERT_TRUE(probe->NumKeys(&n));
    EXPECT_EQ(server_.Stats().store.waits, 1u);
  }
  for (int i = 0; i < 100 && server_.Stats().store.waits != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_.Stats().store.waits, 0u);
  auto s = Connect();
  ASSERT_TRUE(s->Set("/gone", "x"));
  EXPECT_EQ(server_.Stats().clients, 1u);
}

TEST_F(StoreServerTest, ThousandClientsDoTheInitDance) {
  constexpr int kClients = 1000;
  constexpr int kThreads = 8;
  std::vector<std::unique_ptr<StoreClient>> clients(kClients);
  std::vector<int64_t> got(kClients, -1);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kClients; i += kThreads) {
        clients[static_cast<size_t>(i)] = std::make_unique<StoreClient>();
        StoreClient& c = *clients[static_cast<size_t>(i)];
        if (!c.Connect("127.0.0.1", server_.port(), 30000) || !c.Add("init/", 1, &got[static_cast<size_t>(i)])) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  std::set<int64_t> distinct(got.begin(), got.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kClients));
  EXPECT_EQ(*distinct.begin(), 1);
  EXPECT_EQ(*distinct.rbegin(), kClients);
  EXPECT_EQ(server_.Stats().clients, static_cast<uint64_t>(kClients));
  // Every connection still works (all open at once).
  std::string v;
  ASSERT_TRUE(clients[0]->Get("init/", &v));
  EXPECT_EQ(v, std::to_string(kClients));
  ASSERT_TRUE(clients[kClients - 1]->Get("init/", &v));
  EXPECT_EQ(v, std::to_string(kClients));
}

// A lowered per-client reply cap, so that replies many times over it stay a few MiB.
class StoreServerCapTest : public StoreServerTest {
 protected:
  static constexpr uint64_t kCap = 1u << 20;
  void SetUp() override {
    opts_.max_output_bytes = kCap;
    StoreServerTest::SetUp();
  }
  // Why poll the stats, not the socket: replies the kernel took before the drop would read as data.
  bool DroppedSoon(uint64_t n) {
    for (int i = 0; i < 250 && server_.Stats().dropped < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return server_.Stats().dropped == n;
  }
};

TEST_F(StoreServerCapTest, MultiGetNamingALargeValueManyTimesIsCappedAsItIsBuilt) {
  auto good = Connect();
  std::string big(256u << 10, 'm');
  ASSERT_TRUE(good->Set("/big", big));
  auto bad = Connect();
  ASSERT_TRUE(bad->SendRaw(EncodeKeyList(QueryType::kMultiGet, std::vector<std::string>(64, "/big"))));  // 16 MiB
  EXPECT_TRUE(DroppedSoon(1));
  EXPECT_LE(server_.Stats().max_unread, kCap);
  std::string v;
  ASSERT_TRUE(good->Get("/big", &v));
  EXPECT_EQ(v, big);
  std::vector<std::string> vals;
  ASSERT_TRUE(good->MultiGet({"/big", "/big"}, &vals));  // under the cap: answered
  EXPECT_EQ(vals, (std::vector<std::string>{big, big}));
}

TEST_F(StoreServerCapTest, PipelinedGetsOfALargeValueAreCappedAsTheyAreQueued) {
  auto good = Connect();
  std::string big(64u << 10, 'g');
  ASSERT_TRUE(good->Set("/big", big));
  auto bad = Connect();
  std::string gets;
  for (int i = 0; i < 256; ++i) gets += EncodeKeyOnly(QueryType::kGet, "/big");  // 3 KiB asking for 16 MiB
  ASSERT_TRUE(bad->SendRaw(gets));
  EXPECT_TRUE(DroppedSoon(1));
  EXPECT_LE(server_.Stats().max_unread, kCap);
  std::string v;
  ASSERT_TRUE(good->Get("/big", &v));
  EXPECT_EQ(v, big);
  uint32_t echo = 0;
  ASSERT_TRUE(good->Ping(5, &echo));
  EXPECT_EQ(echo, 5u);
}

// Throws from inside a request, as an allocation failure would.
class ThrowingStandIn : public StandIn {
 public:
  std::optional<std::string> Materialize(std::string_view key, Access, std::span<const std::string_view>) override {
    if (key == "/oom") throw std::bad_alloc();
    if (key == "/oops") throw std::runtime_error("oops");
    return std::nullopt;
  }
};

// The two amplifications at the default caps, in a child process whose address space is limited to 4 GiB:
// a MULTI_GET naming an 8 MiB value 1024 times (12 KiB asking for 8 GiB) and 1024 pipelined GETs of it. Each asking
// client is dropped, the store lives and still answers a PING and a GET. Not under ASan (its shadow memory alone
// reserves more than the limit).
#if defined(__SANITIZE_ADDRESS__)
#define PRISM_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PRISM_UNDER_ASAN 1
#endif
#endif
TEST(StoreServerAddressLimit, BothAmplificationsUnderFourGiBLeaveTheStoreAnsweringAPing) {
#ifdef PRISM_UNDER_ASAN
  GTEST_SKIP() << "ASan reserves more address space than the limit";
#endif
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Exit codes name the step that failed (no gtest in the child).
    const rlimit rl{4ull << 30, 4ull << 30};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(10);
    StoreServer server;
    std::string error;
    if (!server.Start(StoreServerOptions{}, &error)) _exit(11);
    StoreClient good;
    if (!good.Connect("127.0.0.1", server.port())) _exit(12);
    const std::string big(8u << 20, 'v');
    if (!good.Set("/big", big)) _exit(13);
    auto dropped = [&](uint64_t n) {
      for (int i = 0; i < 500 && server.Stats().dropped < n; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return server.Stats().dropped >= n;
    };
    StoreClient multi, pipelined;
    if (!multi.Connect("127.0.0.1", server.port()) || !pipelined.Connect("127.0.0.1", server.port())) _exit(14);
    if (!multi.SendRaw(EncodeKeyList(QueryType::kMultiGet, std::vector<std::string>(1024, "/big")))) _exit(15);
    if (!dropped(1)) _exit(16);
    std::string gets;
    for (int i = 0; i < 1024; ++i) gets += EncodeKeyOnly(QueryType::kGet, "/big");
    if (!pipelined.SendRaw(gets)) _exit(17);
    if (!dropped(2)) _exit(18);
    uint32_t echo = 0;
    if (!good.Ping(7, &echo) || echo != 7) _exit(19);
    std::string v;
    if (!good.Get("/big", &v) || v != big) _exit(20);
    server.Stop();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "step that failed (see the test's exit codes)";
}

TEST(StoreServerExceptions, AFailingRequestDropsOnlyThatClient) {
  ThrowingStandIn stand_in;
  StoreServerOptions o;
  o.stand_in = &stand_in;
  StoreServer s;
  std::string error;
  ASSERT_TRUE(s.Start(o, &error)) << error;
  StoreClient good;
  ASSERT_TRUE(good.Connect("127.0.0.1", s.port())) << good.error();
  ASSERT_TRUE(good.Set("/k", "v"));
  int n = 0;
  for (const char* key : {"/oom", "/oops"}) {
    StoreClient bad;
    ASSERT_TRUE(bad.Connect("127.0.0.1", s.port())) << bad.error();
    ASSERT_TRUE(bad.SendRaw(EncodeKeyOnly(QueryType::kGet, key)));
    ++n;
    for (int i = 0; i < 250 && s.Stats().dropped < static_cast<uint64_t>(n); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(s.Stats().dropped, static_cast<uint64_t>(n)) << key;
    std::string v;
    ASSERT_TRUE(good.Get("/k", &v)) << good.error();
    EXPECT_EQ(v, "v");
  }
}

TEST(StoreServerBind, AllInterfacesWhenAsked) {
  StoreServerOptions o;
  o.host = "0.0.0.0";
  StoreServer s;
  std::string error;
  ASSERT_TRUE(s.Start(o, &error)) << error;
  StoreClient c;
  ASSERT_TRUE(c.Connect("127.0.0.1", s.port())) << c.error();
}

TEST(StoreServerBind, PortInUseIsAClearError) {
  StoreServer a, b;
  std::string error;
  ASSERT_TRUE(a.Start({}, &error)) << error;
  StoreServerOptions o;
  o.port = a.port();
  EXPECT_FALSE(b.Start(o, &error));
  EXPECT_NE(error.find(std::to_string(a.port())), std::string::npos) << error;
}

TEST(StoreServerRecord, CaptureHoldsWhatClientsSent) {
  std::string path = ::testing::TempDir() + "/store_capture.bin";
  StoreServerOptions o;
  o.record_path = path;
  StoreServer s;
  std::string error;
  ASSERT_TRUE(s.Start(o, &error)) << error;
  {
    StoreClient c;
    ASSERT_TRUE(c.Connect("127.0.0.1", s.port()));
    ASSERT_TRUE(c.Set("/rec", "v"));
    int64_t n;
    ASSERT_TRUE(c.NumKeys(&n));
  }
  for (int i = 0; i < 100 && s.Stats().clients != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.Stop();
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string all;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) all.append(buf, n);
  std::fclose(f);
  ASSERT_GE(all.size(), 16u);
  EXPECT_EQ(all.substr(0, 8), "PRSMWIRE");
  std::string sent = EncodeValidate() + EncodePing(static_cast<uint32_t>(::getpid())) +
                     EncodeKeyValue(QueryType::kSet, "/rec", "v") + EncodeNoArgs(QueryType::kGetNumKeys);
  std::string data;
  bool closed = false;
  for (size_t pos = 16; pos + 16 <= all.size();) {
    uint32_t conn, kind;
    uint64_t len;
    std::memcpy(&conn, all.data() + pos, 4);
    std::memcpy(&kind, all.data() + pos + 4, 4);
    std::memcpy(&len, all.data() + pos + 8, 8);
    EXPECT_EQ(conn, 1u);
    data += all.substr(pos + 16, len);
    closed = closed || kind == kWireClosed;
    pos += 16 + len;
  }
  EXPECT_EQ(data, sent);
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace prism::store
