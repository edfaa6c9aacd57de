// Fuzzes the Chakra importer (src/replay/chakra/chakra_import.cc, chakra_et_io.cc: protobuf, optionally gzip) as
// `prism-run import-chakra DIR` drives it: each part of the input (fuzz_split.h) is rank k's ET file
// (fuzz.<k>.et), except a part that starts with '{', which is the comm_group.json. The files go to a directory of
// this process's own under $TMPDIR. Nothing may crash, and a graph the importer accepts (it validates it) must
// read back through the trace reader.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_split.h"
#include "replay/chakra/chakra_import.h"
#include "replay/trace_io.h"

namespace {

namespace fs = std::filesystem;
fs::path g_dir;

void Write(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  g_dir = fs::path(tmp && *tmp ? tmp : "/tmp") / ("prism_chakra_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(g_dir);
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(g_dir, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prism;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(g_dir, ec)) fs::remove(e.path(), ec);
  chakra::ImportOptions opts;
  opts.input = g_dir.string();
  int ranks = 0;
  for (std::string_view part : fuzz::SplitFiles(data, size, 9)) {
    if (!part.empty() && part.front() == '{' && opts.comm_group.empty()) {
      opts.comm_group = (g_dir / "groups.json").string();
      Write(opts.comm_group, part);
    } else {
      Write(g_dir / ("fuzz." + std::to_string(ranks++) + ".et"), part);
    }
  }
  if (ranks == 0) return 0;
  opts.ctrl_deps = size % 2 == 0;
  trace::Trace t;
  std::string error;
  if (!chakra::ImportChakra(opts, &t, nullptr, &error)) return 0;
  const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(replay::TraceToJson(t));
  trace::Trace back;
  if (!replay::TraceFromBytes(std::string(cbor.begin(), cbor.end()), &back, &error)) {
    std::fprintf(stderr, "chakra_import_fuzz: the imported graph does not read back: %s\n", error.c_str());
    std::abort();
  }
  return 0;
}
