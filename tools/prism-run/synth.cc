// prism-run synth: write a synthetic Megatron-style graph
#include "subcommands.h"

namespace prism::cli {

void AddSynth(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("synth", "write a synthetic Megatron-style graph [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("synth", "issue 3"); });
}

}  // namespace prism::cli
