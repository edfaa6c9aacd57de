// prism-run [OPTIONS] torchrun ...: emulate (the default mode). Registers the options, picks the policy and calls
// the library: the faithful procedure (launcher/stages.h: collect -> fill -> emulate, with the graph cache) unless
// --policy mirror, --graph FILE or a multi-host option says otherwise (launcher/emulate.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/emulate.h"
#include "launcher/run_options.h"
#include "launcher/stages.h"
#include "emulate_options.h"
#include "subcommands.h"

extern char** environ;

namespace prism::cli {

namespace {
struct DefaultMode {
  launcher::StagedOptions staged;  // staged.policy: "" = graph (the faithful default)
  CLI::Option* payload = nullptr;
  CLI::Option* ranks = nullptr;
};
DefaultMode& Mode() {
  static DefaultMode m;
  return m;
}
}  // namespace

EmulateOptions* AddEmulateOptions(CLI::App& app) {
  DefaultMode& m = Mode();
  for (const launcher::OptionDef& def : launcher::EmulateOptionTable()) {
    CLI::Option* opt = AddTableOption(&app, def, &m.staged);
    if (def.name == "--ranks") m.ranks = opt;
    if (def.name == "--payload") m.payload = opt;
  }
  return &m.staged.emulate;
}

int RunEmulate(const EmulateOptions& /*opts*/, const std::vector<std::string>& command) {
  DefaultMode& m = Mode();
  EmulateOptions& e = m.staged.emulate;
  m.staged.payload_given = m.payload != nullptr && m.payload->count() > 0;
  if (m.ranks != nullptr && m.ranks->count() > 0 && e.ranks.find_first_not_of(" \t") == std::string::npos) {
    std::fprintf(stderr, "prism-run: --ranks \"%s\": no rank given (e.g. 0, 0,517 or 0-7)\n", e.ranks.c_str());
    return kExitBadInput;
  }
  // Multi-host runs (a coordinator here serving others, or joining one) and a given graph run one emulation; the
  // procedure's stages run on one host.
  const bool multi_host = !e.coordinator.empty() || !e.listen.empty() || !e.remote_ranks.empty();
  std::string policy = m.staged.policy;
  // PRISM_POLICY: the policy when --policy is not given (a given --graph still wins over it).
  const char* env_policy = std::getenv("PRISM_POLICY");
  if (policy.empty() && env_policy != nullptr && *env_policy != 0 && e.graph.empty()) {
    policy = env_policy;
    if (policy != "graph" && policy != "mirror") {
      std::fprintf(stderr, "prism-run: PRISM_POLICY=%s: expected graph or mirror\n", env_policy);
      return kExitBadInput;
    }
  }
  if (policy.empty()) policy = !e.graph.empty() ? "given graph" : multi_host ? "mirror" : "graph";
  if (policy == "mirror" && !e.graph.empty()) {
    std::fprintf(stderr, "prism-run: --policy mirror and --graph contradict each other: choose one\n");
    return kExitBadInput;
  }
  if (policy == "graph" && multi_host) {
    std::fprintf(stderr, "prism-run: --policy graph runs its stages on one host; with --coordinator, --listen or "
                         "--remote-ranks give the graph (--graph FILE, made by a one-host run) or --policy mirror\n");
    return kExitBadInput;
  }
  if (policy != "graph") {
    if (m.staged.policy.empty() && multi_host)
      std::fprintf(stderr, "prism-run: note: multi-host run: virtual ranks follow the mirror policy (give --graph "
                           "for a graph)\n");
    const std::string name = policy == "given graph" ? "graph" : policy;
    e.plan_extra = {{"policy", name}, {"stages", {{{"name", "emulate"}}}}};
    if (!e.graph.empty()) e.plan_extra["graph"] = e.graph;
    return launcher::Emulate(e, command);
  }
  for (char** v = environ; v != nullptr && *v != nullptr; ++v) m.staged.environment.emplace_back(*v);
  return launcher::RunStaged(m.staged, command);
}

}  // namespace prism::cli
