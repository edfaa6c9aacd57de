// prism-run's subcommands: one file each; every file registers its flags and calls library code.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "checks.h"
#include "launcher/emulate.h"
#include "launcher/run_options.h"

namespace prism::cli {

using launcher::EmulateOptions;

// Exit codes shared by all subcommands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // the job failed, a regression was found, the replay deadlocked
inline constexpr int kExitBadInput = 2;    // malformed graph/topology/command line
inline constexpr int kExitHang = 4;        // emulate: prism diagnosed a hang and stopped the job (--on-hang stop);
                                           // coordinator: a hang was diagnosed (--on-hang stop)

// Each Add* registers a subcommand on `app`; its callback stores the exit code in *rc.
void AddSimulate(CLI::App& app, int* rc);
void AddSynth(CLI::App& app, int* rc);
void AddCollect(CLI::App& app, int* rc);
void AddRecord(CLI::App& app, int* rc);
void AddFill(CLI::App& app, int* rc);
void AddReport(CLI::App& app, int* rc);
void AddStatus(CLI::App& app, int* rc);
void AddCoordinator(CLI::App& app, int* rc);
void AddImportChakra(CLI::App& app, int* rc);
void AddExportChakra(CLI::App& app, int* rc);
void AddGraph(CLI::App& app, int* rc);
void AddCalibrate(CLI::App& app, int* rc);

// Emulate is the default mode (`prism-run [OPTIONS] torchrun ...`): its options live on the top-level app.
// RunEmulate picks the policy from them and calls the library (launcher/stages.h or launcher/emulate.h).
EmulateOptions* AddEmulateOptions(CLI::App& app);
// Registers one row of launcher/run_options.h on `app`, its value landing in `spec`.
CLI::Option* AddTableOption(CLI::App* app, const launcher::OptionDef& def, launcher::StagedOptions* spec);
int RunEmulate(const EmulateOptions& opts, const std::vector<std::string>& command);

}  // namespace prism::cli
