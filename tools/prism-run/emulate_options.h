// The options `collect` and `record` register alike; each runs the emulate path (launcher/emulate.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/emulate.h"

namespace CLI {
class App;
}

namespace prism::cli {

using launcher::EmulateOptions;

// The options `collect` and `record` share: each runs the emulate path (RunEmulate) with its own choice of real ranks.
struct LaunchSubcommandOptions {
  std::string out;
  std::string layout;
  std::string topology;
  int gpus = 0;
  bool quiet = false;
  bool dry_run = false;
  bool json = false;
  double hang_timeout = coord::kDefaultHangTimeoutS;
  int iterations = 0;
  std::optional<uint64_t> payload_max_bytes;
};
// Registers them on `sub` (`default_out`: the directory name used when --out is not given).
void AddLaunchSubcommandOptions(CLI::App* sub, LaunchSubcommandOptions* o, const std::string& default_out,
                                const std::string& gpus_help);
// The emulate options they stand for; without --out, ./<default_out> (then -2, -3, ... while taken).
EmulateOptions ToEmulateOptions(const LaunchSubcommandOptions& o, const std::string& default_out);

}  // namespace prism::cli
