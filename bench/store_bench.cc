// Store benchmark: TCPStore operations per second over loopback, and the store side of an 8192-rank rendezvous with
// one real rank (Megatron's groups, virtual ranks standing in). Prints medians of several runs; asserts nothing.
//   store_bench [--runs N] [--ops N] [--world N] [--rank R]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/store/store_client.h"
#include "coordinator/store/store_server.h"
#include "coordinator/store/virtual_ranks.h"
#include "model/world.h"

namespace {

using namespace prism;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// ops/s of one operation kind with `clients` connections, each in its own thread doing `ops` requests.
double OpsPerSecond(const std::string& kind, int clients, int ops) {
  store::StoreServer server;
  std::string error;
  if (!server.Start({}, &error)) {
    std::fprintf(stderr, "store_bench: %s\n", error.c_str());
    std::exit(1);
  }
  std::vector<std::unique_ptr<store::StoreClient>> cs;
  for (int i = 0; i < clients; ++i) {
    cs.push_back(std::make_unique<store::StoreClient>());
    if (!cs.back()->Connect("127.0.0.1", server.port())) std::exit(1);
    cs.back()->Set("/k" + std::to_string(i), std::string(128, 'v'));
  }
  std::atomic<int> failures{0};
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      store::StoreClient& c = *cs[static_cast<size_t>(i)];
      std::string key = "/k" + std::to_string(i), v;
      std::string val(128, 'v');
      int64_t r;
      bool ready;
      for (int n = 0; n < ops; ++n) {
        bool ok = true;
        if (kind == "SET") {
          // SET has no reply: a PING every 64 keeps the pipe honest (counted as ops too).
          ok = c.Set(key, val);
          if (n % 64 == 63) {
            uint32_t e;
            ok = ok && c.Ping(1, &e);
          }
        } else if (kind == "GET") {
          ok = c.Get(key, &v);
        } else if (kind == "ADD") {
          ok = c.Add("/counter", 1, &r);
        } else if (kind == "WAIT+GET") {
          ok = c.WaitGet(key, 10000, &v);
        } else if (kind == "CHECK") {
          ok = c.Check({"/exception_dump"}, &ready);
        }
        if (!ok) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  double s = Seconds(t0, Clock::now());
  if (failures) std::fprintf(stderr, "store_bench: %d failed %s requests\n", failures.load(), kind.c_str());
  return static_cast<double>(clients) * ops / s;
}

struct Rendezvous {
  double init_s = 0;     // connect + VALIDATE + PING + ADD init/ until the count is the world size
  double groups_s = 0;   // registrations + unique ids of every group the rank is in
  double total_s = 0;
  int groups = 0, member_of = 0, synthesized = 0;
};

// What one real rank's store traffic looks like when Megatron starts on `world` ranks: init/, the default group's
// id, then for every group initialize_model_parallel creates (names "1", "2", ... in order) the hook's registration
// and, where the rank is a member, its NCCL id (SET when it leads, WAIT+GET otherwise, as torch does on the first
// collective).
Rendezvous RunRendezvous(const world::World& w, int rank) {
  coord::VirtualRanksOptions vo;
  vo.world_size = w.size();
  vo.real_ranks = {rank};
  coord::VirtualRanks vr(vo);
  store::StoreServerOptions so;
  so.stand_in = &vr;
  store::StoreServer server;
  std::string error;
  if (!server.Start(so, &error)) {
    std::fprintf(stderr, "store_bench: %s\n", error.c_str());
    std::exit(1);
  }
  Rendezvous r;
  auto t0 = Clock::now();
  store::StoreClient c;
  int64_t count = 0;
  if (!c.Connect("127.0.0.1", server.port()) || !c.Add("init/", 1, &count) || count != w.size()) {
    std::fprintf(stderr, "store_bench: init/ reached %lld, not %d\n", static_cast<long long>(count), w.size());
    std::exit(1);
  }
  auto t1 = Clock::now();
  std::string id;
  const std::string id_val(128, 'r');
  auto exchange = [&](const std::string& prefix, const std::vector<int>& members) {
    if (members.empty() || members[0] == rank) {
      c.Set(prefix + "cuda//0", id_val);  // this rank leads: torch's broadcastUniqueNCCLID SET
    } else if (!c.WaitGet(prefix + "cuda//0", 60000, &id) || id.size() != 128) {
      std::fprintf(stderr, "store_bench: no id for %s\n", prefix.c_str());
      std::exit(1);
    }
  };
  exchange("/default_pg/0//", {0});
  const auto& groups = w.MegatronGroups();
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].backend != "nccl") continue;
    std::string name = std::to_string(i + 1);
    std::string prefix = "/default_pg/0//" + name + "//";
    std::string ranks;
    for (int m : groups[i].members) ranks += (ranks.empty() ? "" : ",") + std::to_string(m);
    c.Set(prefix + "__prism_group__", "{\"name\":\"" + name + "\",\"ranks\":[" + ranks + "]}");
    ++r.groups;
    if (std::find(groups[i].members.begin(), groups[i].members.end(), rank) == groups[i].members.end()) continue;
    ++r.member_of;
    exchange(prefix, groups[i].members);
  }
  auto t2 = Clock::now();
  r.init_s = Seconds(t0, t1);
  r.groups_s = Seconds(t1, t2);
  r.total_s = Seconds(t0, t2);
  r.synthesized = static_cast<int>(vr.synthesized());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5, ops = 20000, world_size = 8192, rank = 517;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--runs") runs = v;
    else if (a == "--ops") ops = v;
    else if (a == "--world") world_size = v;
    else if (a == "--rank") rank = v;
  }
  setenv("PRISM_LOG_LEVEL", "warn", 0);
  std::printf("store_bench: %u hardware threads, median of %d runs\n", std::thread::hardware_concurrency(), runs);
  std::printf("%-10s %8s %14s\n", "op", "clients", "ops/s");
  for (const char* kind : {"GET", "SET", "ADD", "CHECK", "WAIT+GET"}) {
    for (int clients : {1, 8, 64}) {
      std::vector<double> v;
      for (int i = 0; i < runs; ++i) v.push_back(OpsPerSecond(kind, clients, std::max(ops / clients, 200)));
      std::printf("%-10s %8d %14.0f\n", kind, clients, Median(v));
    }
  }

  std::string error;
  auto layout = world::ParseLayout("tp=8,pp=4,gloo=0", &error);
  if (!layout || !world::ResolveLayout(&*layout, world_size, "--world", &error)) {
    std::fprintf(stderr, "store_bench: layout: %s\n", error.c_str());
    return 1;
  }
  auto w = world::World::Make(*layout, 8, &error);
  if (!w) {
    std::fprintf(stderr, "store_bench: world: %s\n", error.c_str());
    return 1;
  }
  std::vector<double> init, groups, total;
  Rendezvous last;
  for (int i = 0; i < runs; ++i) {
    last = RunRendezvous(*w, rank);
    init.push_back(last.init_s);
    groups.push_back(last.groups_s);
    total.push_back(last.total_s);
  }
  std::printf("rendezvous: world %d (%s), real rank %d: %d groups registered, member of %d, %d ids synthesized\n",
              world_size, layout->ToSpec().c_str(), rank, last.groups, last.member_of, last.synthesized);
  std::printf("  init/ reaches %d: %.3f ms   groups and ids: %.3f ms   total: %.3f ms\n", world_size,
              Median(init) * 1e3, Median(groups) * 1e3, Median(total) * 1e3);
  return 0;
}
