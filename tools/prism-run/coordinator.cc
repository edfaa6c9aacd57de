// prism-run coordinator: run the coordinator alone (store, logical world, event bus) until SIGINT/SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>
#include <memory>
#include <string>

#include "common/rank_list.h"
#include "coordinator/coordinator.h"
#include "coordinator/release/graph_release.h"
#include "model/world.h"
#include "model/megatron_membership.h"
#include "subcommands.h"

namespace prism::cli {
namespace {

struct CoordinatorCli {
  int world_size = 0;
  std::string ranks = "0";
  int port = 0;
  std::string host = "127.0.0.1";
  std::string bus_tcp;
  std::string layout;
  int gpus_per_node = 8;
  std::string graph;
  std::string payload = "mirror";
  std::string topology;
  std::string out;
  int ranks_per_root = 128;
  std::string record_wire;
  double hang_timeout = coord::kDefaultHangTimeoutS;
  std::string on_hang = "stop";
};

std::string DefaultOut() {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return std::string("prism-out/coordinator-") + buf;
}

int RunCoordinator(const CoordinatorCli& o) {
  coord::CoordinatorOptions opts;
  opts.world_size = o.world_size;
  std::string error;
  auto ranks = prism::ParseRankList(o.ranks, o.world_size, "--ranks", &error);
  if (!ranks) {
    std::fprintf(stderr, "prism-run coordinator: %s\n", error.c_str());
    return kExitBadInput;
  }
  opts.real_ranks = *ranks;
  std::sort(opts.real_ranks.begin(), opts.real_ranks.end());
  // Megatron's groups from --layout: only a fallback, the Python hook's registrations win (docs/coordinator.md).
  std::unique_ptr<world::MegatronMembership> membership;
  if (!o.layout.empty()) {
    auto layout = world::ParseLayout(o.layout, &error);
    if (!layout || !world::ResolveLayout(&*layout, o.world_size, "--world-size", &error)) {
      std::fprintf(stderr, "prism-run coordinator: --layout '%s': %s\n", o.layout.c_str(), error.c_str());
      return kExitBadInput;
    }
    auto w = world::World::Make(*layout, o.gpus_per_node, &error);
    if (!w) {
      std::fprintf(stderr, "prism-run coordinator: --layout '%s': %s\n", o.layout.c_str(), error.c_str());
      return kExitBadInput;
    }
    membership = std::make_unique<world::MegatronMembership>(*w);
    opts.membership = membership.get();
  }
  opts.store_host = o.host;
  opts.store_port = static_cast<uint16_t>(o.port);
  opts.bus_tcp = o.bus_tcp;
  opts.layout = o.layout;
  opts.graph = o.graph;
  // Why here and not in the coordinator: a bad graph is bad input (exit 2) before anything listens.
  std::unique_ptr<coord::GraphRelease> graph_release;
  if (!o.graph.empty()) {
    graph_release = coord::GraphRelease::Load(o.graph, o.world_size, opts.real_ranks, &error);
    if (!graph_release) {
      std::fprintf(stderr, "prism-run coordinator: --graph: %s\n", error.c_str());
      return kExitBadInput;
    }
    if (!graph_release->UseTopology(o.topology, &error)) {
      std::fprintf(stderr, "prism-run coordinator: --topology: %s\n", error.c_str());
      return kExitBadInput;
    }
    opts.release_policy = graph_release.get();
  }
  opts.payload = o.payload;
  opts.topology = o.topology;
  opts.out_dir = o.out.empty() ? DefaultOut() : o.out;
  opts.ranks_per_root = o.ranks_per_root;
  opts.record_wire = o.record_wire;
  opts.hang_timeout_s = o.hang_timeout;
  if (o.on_hang == "stop") {
    // Why a signal: the hook runs on the bus thread; the main thread, in sigwait below, does the stopping.
    opts.on_hang = [](const std::string&) { ::kill(::getpid(), SIGUSR1); };
  }

  // Why block first: the store and bus threads inherit the mask, so SIGINT/SIGTERM reach sigwait below only.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  auto coord = coord::Coordinator::Start(opts, &error);
  if (!coord) {
    std::fprintf(stderr, "prism-run coordinator: %s\n", error.c_str());
    return kExitFailure;
  }
  const auto& ep = coord->endpoints();
  std::printf("prism coordinator: world %d, real ranks %s, out %s\n", o.world_size, o.ranks.c_str(),
              opts.out_dir.c_str());
  std::printf("MASTER_ADDR=%s MASTER_PORT=%u PRISM_COORD_SOCKET=%s%s%s\n", ep.store_host.c_str(),
              unsigned{ep.store_port}, ep.socket_path.c_str(), ep.bus_tcp.empty() ? "" : " PRISM_COORD_ADDR=",
              ep.bus_tcp.c_str());
  if (graph_release) std::fprintf(stderr, "prism coordinator: virtual ranks follow graph %s\n", o.graph.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  if (sig == SIGUSR1) {
    std::fprintf(stderr, "prism-run coordinator: hang diagnosed (--on-hang stop), stopping\n");
    // Why wait: prism-runs on other hosts read the diagnosis and their dumps from the store every half second.
    if (!ep.bus_tcp.empty()) std::this_thread::sleep_for(std::chrono::seconds(2));
    coord->Stop();
    return kExitHang;
  }
  std::fprintf(stderr, "prism-run coordinator: signal %d, stopping\n", sig);
  coord->Stop();
  return kExitOk;
}

}  // namespace

void AddCoordinator(CLI::App& app, int* rc) {
  auto o = std::make_shared<CoordinatorCli>();
  auto* sub = app.add_subcommand("coordinator",
                                 "run the coordinator alone: the rendezvous store (TCPStore protocol, virtual ranks "
                                 "stood in for), the event bus for libprism; until SIGINT/SIGTERM");
  sub->add_option("--world-size", o->world_size, "ranks of the target job")
      ->required()
      ->check(WorldSize())
      ->envname("PRISM_WORLD_SIZE");
  sub->add_option("--ranks", o->ranks, "logical ranks run for real: \"0\", \"0,517\", \"0-7\"")
      ->capture_default_str()
      ->envname("PRISM_RANKS");
  sub->add_option("--port", o->port, "store port (MASTER_PORT); 0 picks a free one")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535))
      ->envname("PRISM_STORE_PORT");
  sub->add_option("--host", o->host, "store bind address; 0.0.0.0 to accept other hosts")
      ->capture_default_str()
      ->envname("PRISM_STORE_HOST");
  sub->add_option("--bus-tcp", o->bus_tcp, "also serve the event bus on HOST:PORT (for ranks on other hosts)")
      ->envname("PRISM_COORD_LISTEN");
  sub->add_option("--layout", o->layout,
                  "\"tp=8,pp=4,dp=32[,...]\": Megatron's groups as a fallback for unregistered group members");
  sub->add_option("--gpus-per-node", o->gpus_per_node, "placement for --layout")->capture_default_str();
  sub->add_option("--graph", o->graph, "PrismTrace the virtual ranks follow in real time (release times of real ranks' operations)");
  sub->add_option("--payload", o->payload, "data policy of virtual members, passed to the shims")
      ->capture_default_str()
      ->check(CLI::IsMember({"mirror", "recorded", "random", "zeros"}));
  sub->add_option("--topology", o->topology, "target cluster, passed to the shims");
  sub->add_option("--out", o->out, "output directory (coord.sock, coordinator.json, status.json)")
      ->envname("PRISM_OUT_DIR");
  sub->add_option("--ranks-per-root", o->ranks_per_root, "TORCH_NCCL_RANKS_PER_ROOT of the job (scalable init)")
      ->capture_default_str()
      ->envname("TORCH_NCCL_RANKS_PER_ROOT");
  sub->add_option("--record-wire", o->record_wire, "write every byte store clients send to FILE (replay tests)");
  sub->add_option("--hang-timeout", o->hang_timeout,
                  "seconds without progress of any real rank, while some wait, before the hang diagnosis "
                  "(<out>/hang.json, printed); 0 turns it off")
      ->capture_default_str()
      ->check(NonNegative())
      ->envname("PRISM_HANG_TIMEOUT");
  sub->add_option("--on-hang", o->on_hang, "after the diagnosis: stop (exit 4) or wait (keep running)")
      ->capture_default_str()
      ->check(CLI::IsMember({"wait", "stop"}));
  sub->callback([o, rc] { *rc = RunCoordinator(*o); });
}

}  // namespace prism::cli
