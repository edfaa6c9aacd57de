// The emulate command's option table (launcher/run_options.h) is the one source of its flags: `prism-run --help`
// prints every row with its default, and docs/cli.md's option table is the table rendered (PRISM_UPDATE_DOCS=1 on
// this test rewrites it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "cli_runner.h"
#include "launcher/run_options.h"

namespace {

using prism::launcher::DefaultPlainText;
using prism::launcher::EmulateOptionTable;
using prism::launcher::OptionDef;

const std::string kDoc = std::string(PRISM_SOURCE_DIR) + "/docs/cli.md";
const std::string kBegin = "<!-- emulate options: rendered from src/launcher/run_options.cc -->\n";
const std::string kEnd = "<!-- end of emulate options -->\n";

TEST(CliOptions, DocsMatchTheTable) {
  std::ifstream in(kDoc);
  ASSERT_TRUE(in) << kDoc;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  const size_t b = doc.find(kBegin), e = doc.find(kEnd);
  ASSERT_NE(b, std::string::npos) << kDoc << " has no line " << kBegin;
  ASSERT_NE(e, std::string::npos) << kDoc << " has no line " << kEnd;
  ASSERT_LT(b, e);
  const std::string have = doc.substr(b + kBegin.size(), e - b - kBegin.size());
  const std::string want = prism::launcher::OptionsMarkdown();
  if (have != want && std::getenv("PRISM_UPDATE_DOCS") != nullptr) {
    doc.replace(b + kBegin.size(), have.size(), want);
    std::ofstream(kDoc) << doc;
    return;
  }
  EXPECT_EQ(have, want) << "docs/cli.md's emulate options differ from the table; PRISM_UPDATE_DOCS=1 "
                           "build/tests/unit/cli_options_test rewrites them";
}

TEST(CliOptions, RowsAreWellFormed) {
  std::set<std::string_view> names;
  for (const OptionDef& d : EmulateOptionTable()) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name << " twice";
    EXPECT_EQ(d.name.rfind("--", 0), 0u) << d.name;
    EXPECT_FALSE(d.help.empty()) << d.name;
    EXPECT_LE(d.lo, d.hi) << d.name;
    // A default the table says from StagedOptions{} is one of the row's choices.
    if (!d.choices.empty() && d.default_note.empty()) {
      EXPECT_NE(("|" + std::string(d.choices) + "|").find("|" + DefaultPlainText(d) + "|"), std::string::npos)
          << d.name;
    }
  }
  EXPECT_GT(names.size(), 20u);
}

TEST(CliOptions, HelpPrintsEveryRowAndItsDefault) {
  const auto r = prism::test_util::RunPrism("--help");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const OptionDef& d : EmulateOptionTable()) {
    EXPECT_NE(r.out.find(std::string(d.name)), std::string::npos) << d.name;
    const std::string def = DefaultPlainText(d);
    if (!def.empty()) {
      EXPECT_NE(r.out.find("(default " + def + ")"), std::string::npos) << d.name << ": " << def;
    }
  }
}

// The table's checks run where a value is parsed: a value outside a row's choices or range, from the flag or from
// its environment variable, exits 2 naming the flag.
TEST(CliOptions, ValuesAreCheckedWhereParsed) {
  for (const char* args : {"--fill-tolerance nan", "--fill-tolerance -1", "--fill-rounds 0", "--collect-swap maybe",
                           "--payload-max-bytes 12Q", "--on-hang never", "--gpus 0", "--policy fast"}) {
    const auto r = prism::test_util::RunPrism(std::string("--dry-run ") + args + " torchrun --nproc-per-node 2 x.py");
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out;
    const std::string flag = std::string(args).substr(0, std::string(args).find(' '));
    EXPECT_NE(r.out.find(flag), std::string::npos) << args << "\n" << r.out;
  }
  setenv("PRISM_HANG_TIMEOUT", "-5", 1);
  const auto h = prism::test_util::RunPrism("--dry-run torchrun --nproc-per-node 2 x.py");
  unsetenv("PRISM_HANG_TIMEOUT");
  EXPECT_EQ(h.rc, 2) << h.out;
  EXPECT_NE(h.out.find("--hang-timeout"), std::string::npos) << h.out;
}

}  // namespace
