// The plan for several hosts (launcher/plan.h): the host that starts the coordinator (--listen, --remote-ranks) and
// one that joins it by HOST:PORT with the coordinator's published document (event bus port, real ranks, world size).
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "launcher/plan.h"

namespace prism::launcher {
namespace {

HostInfo Host() {
  HostInfo h;
  h.env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  h.count_gpus = [] { return 8; };
  h.libprism = "/opt/prism/lib/libprism.so";
  h.python_hook_dir = "/opt/prism/lib/python";
  h.which = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  h.shebang = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  h.cwd = "/w";
  return h;
}

PlanRequest Req(const std::string& ranks) {
  PlanRequest r;
  std::istringstream in("torchrun --nnodes 2 --nproc-per-node 8 job.py");
  for (std::string w; in >> w;) r.command.push_back(w);
  r.ranks = ranks;
  r.out_dir = "/tmp/out";
  return r;
}

std::map<std::string, std::string> Env(const Plan& p) { return {p.env.begin(), p.env.end()}; }

TEST(TwoNodePlan, FirstHostStartsTheCoordinatorForEveryHost) {
  PlanRequest r = Req("0-7");
  r.listen = "10.0.0.1";
  r.remote_ranks = "8-15";
  std::string err;
  auto p = BuildPlan(r, Host(), &err);
  ASSERT_TRUE(p) << err;
  EXPECT_TRUE(p->start_coordinator);
  EXPECT_EQ(p->listen, "10.0.0.1");
  EXPECT_EQ(p->remote_ranks.size(), 8u);
  EXPECT_EQ(Env(*p)["MASTER_ADDR"], "10.0.0.1");  // the store binds that address only
  EXPECT_EQ(Env(*p)["PRISM_REAL_RANKS"], "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15");
  EXPECT_EQ(PlanToJson(*p)["hosts"]["remote_ranks"].size(), 8u);

  r.listen = "0.0.0.0";
  p = BuildPlan(r, Host(), &err);
  ASSERT_TRUE(p) << err;
  EXPECT_EQ(Env(*p)["MASTER_ADDR"], "127.0.0.1");

  r.remote_ranks = "7-8";
  EXPECT_FALSE(BuildPlan(r, Host(), &err));
  EXPECT_NE(err.find("rank 7 also runs here"), std::string::npos) << err;
  r.remote_ranks = "16";
  EXPECT_FALSE(BuildPlan(r, Host(), &err));
  EXPECT_NE(err.find("--remote-ranks"), std::string::npos) << err;

  r.listen.clear();
  r.remote_ranks = "8";
  p = BuildPlan(r, Host(), &err);
  ASSERT_TRUE(p) << err;
  bool warned = false;
  for (const std::string& w : p->warnings) warned = warned || w.find("without --listen") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST(TwoNodePlan, SecondHostJoinsByHostPort) {
  PlanRequest r = Req("8-15");
  r.node_rank = 1;  // with --ranks and --coordinator: this host's number
  r.coordinator = "10.0.0.1:29500";
  r.coordinator_doc = R"({"store_host":"node0","store_port":29500,"bus_tcp":"node0:41234","world_size":16,
                          "real_ranks":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]})";
  std::string err;
  auto p = BuildPlan(r, Host(), &err);
  ASSERT_TRUE(p) << err;
  EXPECT_FALSE(p->start_coordinator);
  EXPECT_EQ(p->host_index, 1);
  ASSERT_EQ(p->real.size(), 8u);
  EXPECT_EQ(p->real[0].rank, 8);
  auto env = Env(*p);
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  // The bus port from the document, on the address this host reached the store at (not the document's host name).
  EXPECT_EQ(env["PRISM_COORD_ADDR"], "10.0.0.1:41234");
  EXPECT_EQ(env.count("PRISM_COORD_SOCKET"), 0u);
  EXPECT_EQ(env["PRISM_REAL_RANKS"], "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15");
  for (const std::string& w : p->warnings) EXPECT_EQ(w.find("event bus"), std::string::npos) << w;

  // A rank the coordinator runs as virtual, another world size, options of the first host: refused.
  r.coordinator_doc = R"({"bus_tcp":"node0:41234","world_size":16,"real_ranks":[0,1,2,3,4,5,6,7,8]})";
  EXPECT_FALSE(BuildPlan(r, Host(), &err));
  EXPECT_NE(err.find("rank(s) 9,10,11,12,13,14,15 are virtual"), std::string::npos) << err;
  r.coordinator_doc = R"({"bus_tcp":"node0:41234","world_size":64,"real_ranks":[]})";
  EXPECT_FALSE(BuildPlan(r, Host(), &err));
  EXPECT_NE(err.find("world of 64 ranks"), std::string::npos) << err;
  r.coordinator_doc = R"({"bus_tcp":"","world_size":16})";
  p = BuildPlan(r, Host(), &err);
  ASSERT_TRUE(p) << err;
  bool warned = false;
  for (const std::string& w : p->warnings) warned = warned || w.find("Unix socket only") != std::string::npos;
  EXPECT_TRUE(warned);
  r.coordinator_doc.clear();
  r.listen = "0.0.0.0";
  EXPECT_FALSE(BuildPlan(r, Host(), &err));
  EXPECT_NE(err.find("belong to the prism-run that starts the coordinator"), std::string::npos) << err;

  // Without --coordinator, --ranks and --node-rank together stay an error.
  PlanRequest alone = Req("8");
  alone.node_rank = 1;
  EXPECT_FALSE(BuildPlan(alone, Host(), &err));
  EXPECT_NE(err.find("not both"), std::string::npos) << err;
}

}  // namespace
}  // namespace prism::launcher
