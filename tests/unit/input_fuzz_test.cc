// A bounded, deterministic mutation loop over every reader that takes bytes from outside: the graph reader (JSON
// and CBOR), the report reader, the event-file reader, the Chakra ET reader and importer, the store's request
// parser with the store behind it, and the ipc.h frame decoder. Seeds are the repository's own files; the seed of
// the generator and the number of inputs are fixed, so CI sees the same inputs every run. A reader may refuse an
// input (with the file named), never crash, hang or trip ASan/UBSan (./dev.sh test-asan runs this too).
// Deeper runs: PRISM_FUZZ_ITERS=N (default 400 per target); tests/fuzz/ has the libFuzzer targets (clang).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "analysis/observed_trace.h"
#include "analysis/report_compare.h"
#include "common/ipc_io.h"
#include "coordinator/store/store_protocol.h"
#include "coordinator/store/store_state.h"
#include "coordinator/store/virtual_ranks.h"
#include "replay/chakra/chakra_et_io.h"
#include "replay/chakra/chakra_import.h"
#include "replay/trace_io.h"

namespace prism {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Src(const std::string& rel) { return std::string(PRISM_SOURCE_DIR) + "/" + rel; }

int Iterations() {
  const char* v = std::getenv("PRISM_FUZZ_ITERS");
  return v ? std::max(1, std::atoi(v)) : 400;
}

// Byte mutations that reach the readers' edges: flips, inserts, deletes, duplicated ranges, truncation, and
// splices of values known to be hostile (huge CBOR lengths, deep nesting, negative and 300-digit numbers).
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  std::string Mutate(std::string s) {
    const int rounds = 1 + static_cast<int>(rng_() % 4);
    for (int k = 0; k < rounds; ++k) {
      const size_t n = s.size();
      const size_t at = n ? rng_() % n : 0;
      switch (rng_() % 7) {
        case 0:
          if (n) s[at] = static_cast<char>(s[at] ^ (1 << (rng_() % 8)));
          break;
        case 1: s.insert(at, 1, static_cast<char>(rng_() % 256)); break;
        case 2: s.erase(at, 1 + rng_() % 16); break;
        case 3:
          if (n) s.insert(rng_() % n, s.substr(at, 1 + rng_() % 64));
          break;
        case 4: s.resize(at); break;
        case 5: {
          static const char* kSplices[] = {"\x9b\x40\x00\x00\x00\x00\x00\x00\x00", "\xbb\xff\xff\xff\xff\xff\xff\xff",
                                           "\x7b\x7f\xff\xff\xff\xff\xff\xff\xff", "\x81\x81\x81\x81\x81\x81\x81\x81",
                                           "\xfb\x7f\xef\xff\xff\xff\xff\xff\xff", "\x3b\xff\xff\xff\xff\xff\xff\xff"};
          s.insert(at, kSplices[rng_() % 6], 9);
          break;
        }
        default: {
          static const char* kText[] = {"-5", "1e308", "-1e308", "18446744073709551621", "[[[[[[[[", "\"x\"", "null",
                                        "4611686018427387904", "0.5", "{}"};
          s.insert(at, kText[rng_() % 10]);
          break;
        }
      }
    }
    return s;
  }
  uint64_t Next() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

class InputFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PRISM_LOG_LEVEL", "off", 1);
    dir_ = fs::temp_directory_path() / ("prism_fuzz_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

void ExpectGraphReadEndsCleanly(const std::string& path) {
  trace::Trace t;
  std::string error;
  if (!replay::ReadTrace(path, &t, &error)) {
    ASSERT_EQ(error.rfind(path, 0), 0u) << "the error must name the file: " << error;
  }
}

TEST_F(InputFuzz, GraphReaderJson) {
  const std::string seed = Slurp(Src("examples/graphs/gpt-tp2-pp2-dp2.prism.json"));
  ASSERT_FALSE(seed.empty());
  Mutator m(1);
  for (int i = 0; i < Iterations(); ++i) ExpectGraphReadEndsCleanly(Write("g.prism.json", m.Mutate(seed)));
}

TEST_F(InputFuzz, GraphReaderCbor) {
  const std::vector<uint8_t> cbor =
      nlohmann::json::to_cbor(nlohmann::json::parse(Slurp(Src("examples/graphs/gpt-tp2-pp2-dp2.prism.json"))));
  const std::string seed(cbor.begin(), cbor.end());
  Mutator m(2);
  for (int i = 0; i < Iterations(); ++i) ExpectGraphReadEndsCleanly(Write("g.prism", m.Mutate(seed)));
}

TEST_F(InputFuzz, ReportReader) {
  const std::string seed = Slurp(Src("tests/data/graph/megatron_w64_collect/report.json"));
  ASSERT_FALSE(seed.empty());
  Mutator m(3);
  for (int i = 0; i < Iterations(); ++i) {
    const std::string path = Write("report.json", m.Mutate(seed));
    std::string error;
    auto rep = analysis::LoadReport(path, &error);
    if (rep) {
      (void)analysis::ShowReport(*rep, 16);
    } else {
      ASSERT_NE(error.find("report.json"), std::string::npos) << error;
    }
  }
}

TEST_F(InputFuzz, EventFileLines) {
  std::istringstream in(Slurp(Src("tests/data/graph/megatron_w64_collect/rank0.events.jsonl")));
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_FALSE(lines.empty());
  Mutator m(4);
  analysis::RankEventLog log;
  for (int i = 0; i < Iterations() * 4; ++i) {
    const std::string line = m.Mutate(lines[m.Next() % lines.size()]);
    analysis::FeedEventLine(&log, line, i + 1);
  }
  EXPECT_GT(log.malformed, 0);  // the mutations did reach the reader's refusals
}

TEST_F(InputFuzz, ChakraReaderAndImporter) {
  const std::string fixture = Src("tests/data/chakra/pp2-tp2");
  std::vector<std::string> seeds;
  for (int r = 0; r < 4; ++r) seeds.push_back(Slurp(fixture + "/pp2tp2." + std::to_string(r) + ".et"));
  ASSERT_FALSE(seeds[0].empty());
  Mutator m(5);
  for (int i = 0; i < Iterations(); ++i) {
    const int victim = static_cast<int>(m.Next() % 4);
    for (int r = 0; r < 4; ++r) Write("t." + std::to_string(r) + ".et", r == victim ? m.Mutate(seeds[r]) : seeds[r]);
    chakra::EtFile f;
    std::string error;
    (void)chakra::ReadEtFile((dir_ / ("t." + std::to_string(victim) + ".et")).string(), &f, &error);
    chakra::ImportOptions o;
    o.input = dir_.string();
    trace::Trace t;
    chakra::ImportSummary summary;
    if (!chakra::ImportChakra(o, &t, &summary, &error)) {
      ASSERT_FALSE(error.empty());
    }
  }
}

// Feeds `in` to one client of a fresh store in pieces of 1..64 bytes, as a network delivers them; returns the
// requests the store handled. A refused request must come with an error, and drops the client as the server does.
int FeedStore(const std::string& in, Mutator* m) {
  coord::VirtualRanksOptions vo;
  vo.world_size = 16;
  vo.real_ranks = {0, 3};
  vo.ranks_per_root = 4;
  coord::VirtualRanks vr(vo);
  store::StoreState state([](store::ClientId, std::string_view) {}, &vr, /*max_total_bytes=*/1 << 20);
  store::Limits limits;
  limits.max_request_bytes = 1 << 20;
  int handled = 0;
  size_t off = 0;
  std::string buf;
  while (off < in.size()) {
    const size_t piece = std::min<size_t>(in.size() - off, 1 + m->Next() % 64);
    buf.append(in, off, piece);
    off += piece;
    size_t used = 0;
    for (;;) {
      store::Request req;
      size_t consumed = 0;
      std::string error, reply;
      auto st = store::ParseRequest(reinterpret_cast<const uint8_t*>(buf.data()) + used, buf.size() - used, limits,
                                    &req, &consumed, &error);
      if (st == store::ParseStatus::kNeedMore) break;
      if (st != store::ParseStatus::kOk || !state.Handle(0, req, &reply, &error)) {
        EXPECT_FALSE(error.empty());
        state.DropClient(0);
        buf.clear();
        used = 0;
        break;
      }
      EXPECT_GT(consumed, 0u);
      if (consumed == 0) return handled;
      used += consumed;
      ++handled;
    }
    buf.erase(0, used);
  }
  state.RetryWaits();
  return handled;
}

TEST_F(InputFuzz, StoreRequestsThroughTheStore) {
  const std::string seed = Slurp(Src("tests/data/torch_store_wire/megatron_world1_conn0.bin"));
  ASSERT_FALSE(seed.empty());
  Mutator m(6);
  ASSERT_GE(FeedStore(seed, &m), 20);  // the unmutated capture reaches the store request after request
  for (int i = 0; i < Iterations(); ++i) FeedStore(m.Mutate(seed), &m);
}

TEST_F(InputFuzz, IpcFrameDecoder) {
  // A valid frame stream to start from: the decoder's own encoder.
  std::string seed;
  for (int k = 0; k < 4; ++k) seed += ipc::EncodeFrame(ipc::MsgType::kHello, std::string(10 + k, 'a'));
  Mutator m(7);
  for (int i = 0; i < Iterations() * 4; ++i) {
    const std::string in = m.Mutate(seed);
    ipc::FrameDecoder d(1 << 16);
    bool failed = false;
    for (size_t pos = 0; pos < in.size();) {
      const size_t n = std::min<size_t>(in.size() - pos, 1 + m.Next() % 16);
      d.Feed(reinterpret_cast<const uint8_t*>(in.data()) + pos, n);
      pos += n;
      ipc::Frame f;
      for (;;) {
        auto st = d.Next(&f);
        if (st == ipc::DecodeStatus::kNeedMore) break;
        if (st == ipc::DecodeStatus::kError) {
          failed = true;
          break;
        }
        ASSERT_FALSE(failed);
        ASSERT_LE(f.payload.size(), 1u << 16);
      }
    }
  }
}

}  // namespace
}  // namespace prism
