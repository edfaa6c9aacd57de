// prism-run status: live state of every logical rank of a running emulation, from <out>/coordinator.json and the
// status.json the coordinator refreshes while it runs.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "subcommands.h"

namespace prism::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct StatusCli {
  std::string dir;
  bool as_json = false;
};

bool ReadJson(const fs::path& p, json* out, std::string* error) {
  std::ifstream f(p);
  if (!f) {
    *error = fmt::format("cannot open {}", p.string());
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  *out = json::parse(ss.str(), nullptr, false);
  if (out->is_discarded()) {
    *error = fmt::format("{} is not JSON", p.string());
    return false;
  }
  return true;
}

// DIR itself, or the newest DIR/*/ holding a coordinator.json (so `status prism-out` finds the latest run).
std::optional<fs::path> FindRun(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "coordinator.json", ec)) return dir;
  std::optional<fs::path> best;
  fs::file_time_type best_t{};
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    fs::path info = it->path() / "coordinator.json";
    if (!fs::exists(info, ec)) continue;
    auto t = fs::last_write_time(info, ec);
    if (!best || t > best_t) {
      best = it->path();
      best_t = t;
    }
  }
  return best;
}

std::string Bytes(uint64_t b) {
  if (b == 0) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string Ago(uint64_t t_ns, uint64_t now_ns) {
  if (t_ns == 0 || t_ns > now_ns) return "";
  double s = static_cast<double>(now_ns - t_ns) * 1e-9;
  return s < 120 ? fmt::format("{:.1f} s", s) : fmt::format("{:.0f} min", s / 60);
}

int RunStatus(const StatusCli& o) {
  std::optional<fs::path> run;
  if (!o.dir.empty()) {
    run = FindRun(o.dir);
  } else {
    run = FindRun(".");
    if (!run) run = FindRun("prism-out");
  }
  if (!run) {
    std::fprintf(stderr, "prism-run status: no coordinator.json in %s%s\n",
                 o.dir.empty() ? "." : o.dir.c_str(),
                 o.dir.empty() ? " or ./prism-out/*/ (give the run's output directory)" : " or its subdirectories");
    return kExitBadInput;
  }
  json info, status;
  std::string error;
  if (!ReadJson(*run / "coordinator.json", &info, &error)) {
    std::fprintf(stderr, "prism-run status: %s\n", error.c_str());
    return kExitBadInput;
  }
  bool have_status = ReadJson(*run / info.value("status", std::string("status.json")), &status, &error);
  try {
    int pid = info.value("pid", 0);
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    std::string state = info.value("state", std::string("?"));
    std::string alive;
    if (state == "running" && info.value("host", std::string()) == host) {
      alive = (pid > 0 && ::kill(pid, 0) == 0) ? "running" : "not running (the coordinator died)";
    } else {
      alive = state;
    }
    if (o.as_json) {
      json out = {{"coordinator", info}, {"alive", alive}, {"status", have_status ? status : json()}};
      std::printf("%s\n", out.dump(2).c_str());
      return kExitOk;
    }
    uint64_t now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
    std::printf("run %s in %s: coordinator pid %d on %s, %s\n", info.value("run_id", std::string("?")).c_str(),
                run->string().c_str(), pid, info.value("host", std::string("?")).c_str(), alive.c_str());
    std::printf("world %d, real ranks %s, store %s:%d, bus %s\n", info.value("world_size", 0),
                info["real_ranks"].dump().c_str(), info.value("store_host", std::string("?")).c_str(),
                info.value("store_port", 0), info.value("socket", std::string("?")).c_str());
    if (!have_status) {
      std::printf("no status yet: %s\n", error.c_str());
      return kExitOk;
    }
    std::printf("status as of %s ago\n", Ago(status.value("t_ns", uint64_t{0}), now).c_str());
    if (status.contains("store")) {
      const json& s = status["store"];
      std::printf("store: %d clients, %d keys, %d synthesized for virtual ranks, %d waiting, %d dropped\n",
                  s.value("clients", 0), s.value("keys", 0), s.value("synthesized", 0), s.value("waits", 0),
                  s.value("dropped", 0));
      for (const auto& k : s.value("waited_keys", json::array())) {
        std::printf("  waited on: %s\n", k.get<std::string>().c_str());
      }
      for (const auto& k : s.value("unresolved_groups", json::array())) {
        std::printf("  group members unknown for: %s (register the group; docs/coordinator.md)\n",
                    k.get<std::string>().c_str());
      }
    }
    std::printf("%-7s %-14s %-8s %6s %10s %11s %8s  %s\n", "rank", "state", "pid", "iter", "last_it_s", "peak_mem",
                "ops", "position");
    for (const auto& r : status.value("ranks", json::array())) {
      std::string pos;
      if (r.contains("waiting")) {
        const json& w = r["waiting"];
        pos = fmt::format("waiting at comm {} seq {} ({})", w.value("comm", 0), w.value("seq", 0),
                          w.value("kind", std::string()));
        if (w.contains("waiting_for") && !w["waiting_for"].empty()) pos += " for ranks " + w["waiting_for"].dump();
        std::string since = Ago(w.value("since_ns", uint64_t{0}), now);
        if (!since.empty()) pos += ", " + since;
      } else if (r.contains("last_op")) {
        pos = fmt::format("after comm {} seq {}", r["last_op"].value("comm", 0), r["last_op"].value("seq", 0));
      }
      std::printf("%-7d %-14s %-8d %6d %10.3f %11s %8d  %s\n", r.value("rank", -1),
                  r.value("state", std::string()).c_str(), r.value("pid", 0), r.value("iterations", 0),
                  r.value("last_iteration_s", 0.0), Bytes(r.value("peak_memory_bytes", uint64_t{0})).c_str(),
                  r.value("ops_arrived", 0), pos.c_str());
    }
    int virt = status.value("virtual_ranks", 0);
    if (virt > 0) {
      std::string graph = status.value("graph", std::string());
      std::printf("%d virtual ranks: %s\n", virt,
                  graph.empty() ? fmt::format("payload policy '{}', arrivals mirror their real counterparts",
                                              status.value("payload", std::string("mirror")))
                                      .c_str()
                                : ("graph " + graph).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prism-run status: unexpected content in %s: %s\n", run->string().c_str(), e.what());
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace

void AddStatus(CLI::App& app, int* rc) {
  auto o = std::make_shared<StatusCli>();
  auto* sub = app.add_subcommand("status", "live state of every logical rank of a running emulation");
  sub->add_option("dir", o->dir, "the run's output directory (default: newest ./prism-out/*/)");
  sub->add_flag("--json", o->as_json, "print coordinator.json and status.json as one JSON document");
  sub->callback([o, rc] { *rc = RunStatus(*o); });
}

}  // namespace prism::cli
