// Registers the rows of the option table (launcher/run_options.h) as CLI11 options: the flag, its value's name, the
// check of its choices or range, its environment variable, and the default in its help.
#include <string>
#include <variant>
#include <vector>

#include "subcommands.h"

namespace prism::cli {

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};

std::vector<std::string> Choices(std::string_view text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t bar = std::min(text.find('|', at), text.size());
    out.emplace_back(text.substr(at, bar - at));
    at = bar + 1;
  }
  return out;
}

}  // namespace

CLI::Option* AddTableOption(CLI::App* app, const launcher::OptionDef& def, launcher::StagedOptions* spec) {
  const std::string name(def.name);
  std::string help(def.help);
  const std::string dflt = launcher::DefaultPlainText(def);
  if (!dflt.empty()) help += " (default " + dflt + ")";
  if (!def.env.empty() && !def.cli_reads_env) help += " (env " + std::string(def.env) + ")";
  CLI::Option* opt = std::visit(
      Overloaded{[&](launcher::FlagField f) { return app->add_flag(name, f(*spec), help); },
                 [&](launcher::SizeField f) { return AddSizeOption(app, name, &f(*spec), help); },
                 [&](auto f) { return app->add_option(name, f(*spec), help); }},
      def.field);
  if (!def.value.empty()) opt->type_name(std::string(def.value));
  // The value name already lists the choices: the check adds no text of its own to --help.
  if (!def.choices.empty()) opt->check(CLI::IsMember(Choices(def.choices)).description(""));
  if (def.lo != def.hi) opt->check(InRange(def.lo, def.hi));
  if (!def.env.empty() && def.cli_reads_env) opt->envname(std::string(def.env));
  return opt;
}

}  // namespace prism::cli
