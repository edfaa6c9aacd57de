// prism-run status [DIR | HOST:PORT] [--json]: where every logical rank of an emulation is
// (coordinator/status/status_view.h), from a run's output directory (running or finished) or live from a
// coordinator's store on any host.
// prism-run status --flight-recorder DIR: the same diagnosis from PyTorch Flight Recorder dumps (flight_recorder.h).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "coordinator/coordinator.h"
#include "coordinator/hang/flight_recorder.h"
#include "coordinator/status/status_view.h"
#include "coordinator/store/store_client.h"
#include "subcommands.h"

namespace prism::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct StatusCli {
  std::string dir;
  bool as_json = false;
  size_t max_groups = 24;
  std::string flight_recorder;
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
    *out = json();
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

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

// "host:port" (not a directory): the port, else 0.
int HostPort(const std::string& s, std::string* host) {
  std::error_code ec;
  if (s.empty() || fs::exists(s, ec)) return 0;
  size_t c = s.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == s.size()) return 0;
  for (size_t i = c + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return 0;
  }
  int port = std::stoi(s.substr(c + 1));
  if (port <= 0 || port > 65535) return 0;
  *host = s.substr(0, c);
  return port;
}

int Print(const coord::StatusDocs& docs, const StatusCli& o) {
  if (o.as_json) {
    json out = {{"coordinator", docs.info}, {"alive", docs.alive}, {"status", docs.status}, {"hang", docs.hang}};
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  coord::StatusViewOptions vo;
  vo.now_ns = NowNs();
  // Why: for a run that ended, "waiting for 3 h" would count the time since it ended; durations stop with it.
  if (docs.alive.rfind("running", 0) != 0 && docs.status.is_object() && docs.status.contains("t_ns")) {
    vo.now_ns = docs.status.value("t_ns", vo.now_ns);
  }
  vo.max_groups = o.max_groups;
  std::printf("%s", coord::RenderStatus(docs, vo).c_str());
  return kExitOk;
}

int RunRemote(const std::string& host, int port, const StatusCli& o) {
  store::StoreClient c;
  if (!c.Connect(host, static_cast<uint16_t>(port), 5000)) {
    std::fprintf(stderr, "prism-run status: cannot reach the coordinator's store at %s:%d: %s\n", host.c_str(), port,
                 c.error().c_str());
    return kExitFailure;
  }
  coord::StatusDocs docs;
  docs.where = fmt::format("{}:{}", host, port);
  std::string text;
  if (!c.Get(coord::kStatusKey, &text)) {
    std::fprintf(stderr, "prism-run status: %s: %s\n", docs.where.c_str(), c.error().c_str());
    return kExitFailure;
  }
  if (text.empty()) {
    std::fprintf(stderr, "prism-run status: %s answers as a TCPStore but holds no %s (not a prism coordinator, or "
                         "one older than this prism-run)\n",
                 docs.where.c_str(), coord::kStatusKey);
    return kExitBadInput;
  }
  docs.status = json::parse(text, nullptr, false);
  if (docs.status.is_discarded()) docs.status = json();
  docs.alive = "running (read from its store)";
  if (c.Get(coord::kHangKey, &text) && !text.empty()) {
    docs.hang = json::parse(text, nullptr, false);
    if (docs.hang.is_discarded()) docs.hang = json();
  }
  return Print(docs, o);
}

// Production (or prism's own) Flight Recorder dumps: prism's diagnosis and the ranks to run for real.
int RunFlightRecorder(const StatusCli& o) {
  coord::FrReadResult r = coord::ReadFrDir(o.flight_recorder);
  for (const std::string& p : r.problems) std::fprintf(stderr, "prism-run status: %s\n", p.c_str());
  if (r.dumps.empty()) {
    std::fprintf(stderr, "prism-run status: --flight-recorder %s: no Flight Recorder dump found (files named "
                         "<prefix><rank>, e.g. nccl_trace_rank_0)\n",
                 o.flight_recorder.c_str());
    return kExitBadInput;
  }
  coord::FrAnalysis a = coord::AnalyzeFr(r.dumps);
  if (o.as_json) {
    std::printf("%s", a.Json().c_str());
  } else {
    std::printf("flight recorder dumps in %s: %s", o.flight_recorder.c_str(), a.Text().c_str());
  }
  return kExitOk;
}

int RunStatus(const StatusCli& o) {
  if (!o.flight_recorder.empty()) return RunFlightRecorder(o);
  std::string host;
  if (int port = HostPort(o.dir, &host)) return RunRemote(host, port, o);
  std::optional<fs::path> run;
  if (!o.dir.empty()) {
    run = FindRun(o.dir);
  } else {
    run = FindRun(".");
    if (!run) run = FindRun("prism-out");
  }
  if (!run) {
    std::fprintf(stderr, "prism-run status: no coordinator.json in %s%s\n", o.dir.empty() ? "." : o.dir.c_str(),
                 o.dir.empty() ? " or ./prism-out/*/ (give the run's output directory, or HOST:PORT of its store)"
                               : " or its subdirectories");
    return kExitBadInput;
  }
  coord::StatusDocs docs;
  docs.where = run->string();
  std::string error;
  if (!ReadJson(*run / "coordinator.json", &docs.info, &error)) {
    std::fprintf(stderr, "prism-run status: %s\n", error.c_str());
    return kExitBadInput;
  }
  try {
    std::string status_file = docs.info.value("status", std::string("status.json"));
    ReadJson(*run / status_file, &docs.status, &error);
    std::error_code ec;
    if (fs::exists(*run / "hang.json", ec)) ReadJson(*run / "hang.json", &docs.hang, &error);
    int pid = docs.info.value("pid", 0);
    char me[256] = {0};
    ::gethostname(me, sizeof(me) - 1);
    std::string state = docs.info.value("state", std::string("?"));
    if (state == "running" && docs.info.value("host", std::string()) == me) {
      docs.alive = (pid > 0 && ::kill(pid, 0) == 0) ? "running" : "not running (the coordinator died)";
    } else {
      docs.alive = state;
    }
    return Print(docs, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prism-run status: unexpected content in %s: %s\n", run->string().c_str(), e.what());
    return kExitBadInput;
  }
}

}  // namespace

void AddStatus(CLI::App& app, int* rc) {
  auto o = std::make_shared<StatusCli>();
  auto* sub = app.add_subcommand("status", "where every logical rank of an emulation is, and the hang diagnosis");
  sub->add_option("dir", o->dir,
                  "the run's output directory (default: newest ./prism-out/*/), or HOST:PORT of a running "
                  "coordinator's store");
  sub->add_flag("--json", o->as_json, "print coordinator.json, status.json and hang.json as one JSON document");
  sub->add_option("--groups", o->max_groups, "virtual-rank groups shown")->capture_default_str();
  sub->add_option("--flight-recorder", o->flight_recorder,
                  "read PyTorch Flight Recorder dumps from DIR (<prefix><rank> files) instead: the hang diagnosis and "
                  "the ranks to run for real to reproduce it");
  sub->callback([o, rc] { *rc = RunStatus(*o); });
}

}  // namespace prism::cli
