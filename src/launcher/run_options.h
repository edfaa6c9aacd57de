// The options of `prism-run [OPTIONS] torchrun ...` as one table: each row names the flag, the environment variable
// that sets it when the flag is absent, where its value lands in the run's options (StagedOptions) and its help.
// The CLI registers every flag from it, `--help` prints it, and docs/cli.md's option table is rendered from it
// (OptionsMarkdown; ctest CliOptions.DocsMatchTheTable keeps them equal). A default is the value a
// default-constructed StagedOptions holds, so it is written once.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "launcher/stages.h"

namespace prism::launcher {

// Where a row's value lands. Why accessors rather than member pointers: the values sit in StagedOptions and in its
// EmulateOptions, and a member pointer cannot reach into a member.
using FlagField = bool& (*)(StagedOptions&);
using TextField = std::string& (*)(StagedOptions&);
using TextListField = std::vector<std::string>& (*)(StagedOptions&);
using IntField = int& (*)(StagedOptions&);
using NumberField = double& (*)(StagedOptions&);
using SizeField = std::optional<uint64_t>& (*)(StagedOptions&);
using OptionField = std::variant<FlagField, TextField, TextListField, IntField, NumberField, SizeField>;

struct OptionDef {
  std::string_view name;     // "--fill-rounds"
  std::string_view value = {};  // the value's name in --help and the docs ("N", "LIST", "graph|mirror"); "" for a flag
  OptionField field;
  std::string_view choices = {};  // "graph|mirror": the only values taken ("" = any)
  double lo = 0, hi = 0;     // integers and numbers: the accepted range (lo == hi: unchecked)
  std::string_view env = {};  // the variable that sets it when the flag is absent ("" = none)
  // false: the library reads `env` itself, after the flags (PRISM_POLICY: a given --graph wins over it).
  bool cli_reads_env = true;
  // The default in words (Markdown), when the value StagedOptions{} holds does not say it (e.g. "`./prism-out/<time>`").
  std::string_view default_note = {};
  std::string_view help = {};  // one line for --help
  std::string_view doc = {};  // docs/cli.md's longer text ("" = help)
};

// Every option of the emulate command line, in --help's order.
std::span<const OptionDef> EmulateOptionTable();

// The default of `def` as Markdown: default_note when set, else the value StagedOptions{} holds in backquotes ("" when
// it holds none: an empty text, an unset size, a false flag).
std::string DefaultText(const OptionDef& def);
// The same for --help: without the backquotes.
std::string DefaultPlainText(const OptionDef& def);

// docs/cli.md's option table of the emulate command (a Markdown table, one row per option).
std::string OptionsMarkdown();

}  // namespace prism::launcher
