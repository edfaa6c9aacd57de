// Hostile and broken inputs to the readers: size caps before reading, depth and count checks before parsing, and
// range checks of every numeric field (include/prism/limits.h; docs/trace-format.md "Limits").
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "analysis/observed_trace.h"
#include "analysis/report_compare.h"
#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "replay/chakra/chakra_et_io.h"
#include "replay/synth.h"
#include "replay/trace_io.h"

namespace prism {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class InputLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("prism_limits_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::ofstream(P(name), std::ios::binary) << bytes;
    return P(name);
  }
  // A sparse file: stat says `size` bytes, none of them is on disk.
  std::string Sparse(const std::string& name, uint64_t size) const {
    Write(name, "x");
    fs::resize_file(P(name), size);
    return P(name);
  }
  static json Example() {
    std::ifstream in(std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json");
    return json::parse(in);
  }
  // The example graph with its first communication node's `key` set to `v`; the read's error.
  std::string ReadWithNodeField(const std::string& key, const json& v) {
    json j = Example();
    for (json& n : j["classes"][0]["streams"][0]["nodes"]) {
      if (n["kind"] != "compute") {
        n[key] = v;
        break;
      }
    }
    return ReadError(j);
  }
  std::string ReadError(const json& j) {
    const std::string path = Write("g.prism.json", j.dump());
    trace::Trace t;
    std::string error;
    EXPECT_FALSE(replay::ReadTrace(path, &t, &error));
    return error;
  }
  fs::path dir_;
};

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST_F(InputLimits, BoundedReadRefusesDirectoriesDevicesAndOversizeFilesByName) {
  std::string data, error;
  fs::create_directories(P("report.json"));
  EXPECT_FALSE(ReadFileBounded(P("report.json"), 1 << 20, "test files", &data, &error));
  EXPECT_TRUE(Has(error, P("report.json") + ": is a directory")) << error;
  EXPECT_FALSE(ReadFileBounded("/dev/zero", 1 << 20, "test files", &data, &error));
  EXPECT_TRUE(Has(error, "/dev/zero: is a device")) << error;
  const std::string big = Sparse("big", uint64_t{20} << 30);
  EXPECT_FALSE(ReadFileBounded(big, limits::kMaxGraphFileBytes, "graph files", &data, &error));
  EXPECT_TRUE(Has(error, big + ": 21474836480 bytes is larger than the 1073741824-byte (1 GiB) cap on graph files"))
      << error;
  EXPECT_TRUE(data.empty());
  ASSERT_TRUE(ReadFileBounded(Write("ok", "abc"), 3, "test files", &data, &error)) << error;
  EXPECT_EQ(data, "abc");
  EXPECT_FALSE(ReadFileBounded(P("ok"), 2, "test files", &data, &error));
}

TEST_F(InputLimits, CborNestingCountsAndLengthsAreCheckedBeforeParsing) {
  std::string why;
  // 2 million nested one-element arrays: the parser's recursion would overflow the stack.
  std::string deep(2'000'000, '\x81');
  deep += '\x00';
  EXPECT_FALSE(CheckCborShape(deep, DocumentBounds{}, &why));
  EXPECT_TRUE(Has(why, "nested deeper than 64 levels at byte 64")) << why;
  // An array that declares 2^62 elements in a 10-byte file.
  const std::string huge_array = std::string("\x9b\x40\x00\x00\x00\x00\x00\x00\x00", 9) + '\x00';
  EXPECT_FALSE(CheckCborShape(huge_array, DocumentBounds{}, &why));
  EXPECT_TRUE(Has(why, "the array at byte 0 declares 4611686018427387904 elements but 1 bytes remain")) << why;
  const std::string huge_map = std::string("\xbb\x40\x00\x00\x00\x00\x00\x00\x00", 9) + "\x00\x00";
  EXPECT_FALSE(CheckCborShape(huge_map, DocumentBounds{}, &why));
  EXPECT_TRUE(Has(why, "map at byte 0 declares")) << why;
  const std::string huge_string = std::string("\x7b\xff\xff\xff\xff\xff\xff\xff\xff", 9) + "ab";
  EXPECT_FALSE(CheckCborShape(huge_string, DocumentBounds{}, &why));
  EXPECT_TRUE(Has(why, "string at byte 0 declares 18446744073709551615 bytes but 2 remain")) << why;
  EXPECT_FALSE(CheckCborShape(std::string("\x82\x19\x01", 3), DocumentBounds{}, &why));
  EXPECT_TRUE(Has(why, "cut short")) << why;
  DocumentBounds few;
  few.max_values = 3;
  EXPECT_FALSE(CheckCborShape(std::string("\x84\x01\x02\x03\x04", 5), few, &why));
  EXPECT_TRUE(Has(why, "more than 3 values")) << why;
  // Indefinite lengths, tags and the real graphs pass.
  EXPECT_TRUE(CheckCborShape(std::string("\x9f\x01\xbf\x61\x61\x02\xff\xff", 8), DocumentBounds{}, &why)) << why;
  EXPECT_TRUE(CheckCborShape(std::string("\xc1\x1a\x00\x00\x00\x01", 6), DocumentBounds{}, &why)) << why;
  std::string graph;
  ASSERT_TRUE(ReadFileBounded(std::string(PRISM_SOURCE_DIR) + "/tests/data/graph/megatron_w64_fill/filled.prism",
                              limits::kMaxGraphFileBytes, "graph files", &graph, &why));
  EXPECT_TRUE(CheckCborShape(graph, DocumentBounds{}, &why)) << why;
}

TEST_F(InputLimits, JsonNestingIsCheckedOutsideStrings) {
  std::string why;
  EXPECT_FALSE(CheckJsonShape(std::string(100, '[') + std::string(100, ']'), DocumentBounds{}, &why));
  EXPECT_TRUE(Has(why, "nested deeper than 64 levels at byte 64")) << why;
  EXPECT_TRUE(CheckJsonShape("{\"a\": \"" + std::string(100, '[') + "\\\"\"}", DocumentBounds{}, &why)) << why;
  EXPECT_TRUE(CheckJsonShape(Example().dump(), DocumentBounds{}, &why)) << why;
}

TEST_F(InputLimits, TraceReaderRefusesDeepCborOversizeFilesAndDevicesNamingTheFile) {
  trace::Trace t;
  std::string error;
  std::string deep(2'000'000, '\x81');
  deep += '\x00';
  const std::string path = Write("deep.prism", deep);
  EXPECT_FALSE(replay::ReadTrace(path, &t, &error));
  EXPECT_TRUE(Has(error, path + ": CBOR nested deeper than 64 levels")) << error;
  const std::string lie = Write("lie.prism", std::string("\x9b\x40\x00\x00\x00\x00\x00\x00\x00\x00", 10));
  EXPECT_FALSE(replay::ReadTrace(lie, &t, &error));
  EXPECT_TRUE(Has(error, lie + ": CBOR the array at byte 0 declares 4611686018427387904 elements")) << error;
  const std::string big = Sparse("big.prism", uint64_t{20} << 30);
  EXPECT_FALSE(replay::ReadTrace(big, &t, &error));
  EXPECT_TRUE(Has(error, big + ": 21474836480 bytes is larger than the 1073741824-byte (1 GiB) cap")) << error;
  EXPECT_FALSE(replay::ReadTrace("/dev/zero", &t, &error));
  EXPECT_TRUE(Has(error, "/dev/zero: is a device")) << error;
  fs::create_directories(P("dir.prism"));
  EXPECT_FALSE(replay::ReadTrace(P("dir.prism"), &t, &error));
  EXPECT_TRUE(Has(error, "is a directory")) << error;
}

TEST_F(InputLimits, TraceNumericFieldsAreRangeCheckedWithTheFieldNamed) {
  std::string e = ReadWithNodeField("bytes", -5);
  EXPECT_TRUE(Has(e, "\"bytes\" is -5: must be an integer in 0..1125899906842624")) << e;
  e = ReadWithNodeField("bytes", 1e30);
  EXPECT_TRUE(Has(e, "\"bytes\" is 1e+30")) << e;
  e = ReadWithNodeField("dur_us", 1e308);
  EXPECT_TRUE(Has(e, "\"dur_us\" is 1e+308: must be in 0..1e+12")) << e;
  {
    // A communication node's negative duration is the format's "no recorded duration" (docs/trace-format.md).
    json j = Example();
    for (json& n : j["classes"][0]["streams"][0]["nodes"])
      if (n["kind"] != "compute") n["dur_us"] = -3.0;
    trace::Trace t;
    std::string error;
    EXPECT_TRUE(replay::ReadTrace(Write("neg.prism.json", j.dump()), &t, &error)) << error;
  }
  e = ReadWithNodeField("dur_us", "fast");
  EXPECT_TRUE(Has(e, "\"dur_us\" has the wrong type (string)")) << e;
  e = ReadWithNodeField("root", uint64_t{1} << 40);
  EXPECT_TRUE(Has(e, "\"root\" is 1099511627776: must be an integer in -1..1048575")) << e;
  e = ReadWithNodeField("id", -1);
  EXPECT_TRUE(Has(e, "\"id\" is -1")) << e;
  json j = Example();
  j["world_size"] = uint64_t{1} << 40;
  e = ReadError(j);
  EXPECT_TRUE(Has(e, "\"world_size\" is 1099511627776: must be an integer in 1..1048576")) << e;
  j = Example();
  j["layout"]["tp"] = -2;
  e = ReadError(j);
  EXPECT_TRUE(Has(e, "layout: \"tp\" is -2")) << e;
  j = Example();
  j["comms"][0]["ranks"][0] = -1;
  e = ReadError(j);
  EXPECT_TRUE(Has(e, "comms[0]: \"ranks\"[0] is -1")) << e;
  j = Example();
  j["rank_class"][0]["comms"][0] = -7;
  e = ReadError(j);
  EXPECT_TRUE(Has(e, "rank_class[0]: \"comms\" is -7")) << e;
  // None of the messages prints a type's extreme.
  EXPECT_FALSE(Has(e, "1797693")) << e;
}

TEST_F(InputLimits, ReportReaderSaysDirectoryAndNamesANonNumericField) {
  std::string error;
  fs::create_directories(P("run/report.json"));
  EXPECT_FALSE(analysis::LoadReport(P("run"), &error));
  EXPECT_TRUE(Has(error, "report.json: is a directory")) << error;
  EXPECT_FALSE(analysis::LoadReport(P("run/report.json"), &error));
  EXPECT_TRUE(Has(error, "report.json: is a directory")) << error;
  json rep = {{"schema_version", 1}, {"world_size", 8}, {"mode", "simulate"}, {"iteration_time_s", 0.5},
              {"ranks", json::array({{{"rank", 0}, {"iteration_time_s", "fast"}}})}};
  EXPECT_FALSE(analysis::LoadReport(Write("a.json", rep.dump()), &error));
  EXPECT_TRUE(Has(error, "\"ranks[0].iteration_time_s\" is \"fast\": must be a number")) << error;
  rep["ranks"][0]["iteration_time_s"] = 0.4;
  rep["ranks"][0]["wait_s"] = {{"DATA_PARALLEL", "x"}};
  EXPECT_FALSE(analysis::LoadReport(Write("b.json", rep.dump()), &error));
  EXPECT_TRUE(Has(error, "\"ranks[0].wait_s.DATA_PARALLEL\"")) << error;
  rep["ranks"][0]["wait_s"] = {{"DATA_PARALLEL", 0.1}};
  rep["world_size"] = 5000000000LL;
  EXPECT_FALSE(analysis::LoadReport(Write("c.json", rep.dump()), &error));
  EXPECT_TRUE(Has(error, "\"world_size\" is 5000000000: must be an integer in 1..1048576")) << error;
  rep["world_size"] = 8;
  EXPECT_TRUE(analysis::LoadReport(Write("d.json", rep.dump()), &error)) << error;
}

TEST_F(InputLimits, EventFileReaderCapsTheFileAndCountsOutOfRangeLinesAsMalformed) {
  analysis::RankEventLog log;
  std::string error;
  const std::string big = Sparse("rank0.events.jsonl", uint64_t{5} << 30);
  EXPECT_FALSE(analysis::ReadRankEventLog(big, 0, &log, &error));
  EXPECT_TRUE(Has(error, big + ": 5368709120 bytes is larger than the 4294967296-byte (4 GiB) cap on event files"))
      << error;
  const std::string ok = Write("rank1.events.jsonl",
                               "{\"type\":\"op\",\"comm_id\":0,\"seq\":0,\"op\":\"send\",\"peer\":1099511627776}\n"
                               "{\"type\":\"hello\",\"world_size\":1e300}\n" +
                                   std::string(100, '[') + "\n");
  ASSERT_TRUE(analysis::ReadRankEventLog(ok, 1, &log, &error)) << error;
  EXPECT_EQ(log.malformed, 3);
  EXPECT_TRUE(Has(log.first_malformed, "peer, root or stream is outside")) << log.first_malformed;
  EXPECT_TRUE(log.ops.empty());
  EXPECT_EQ(log.world_size, 0);
}

// Found by event_file_fuzz: an op line cut short of its arrival_ns and release_ns (read as 0) sorted first and made
// a 57-year compute gap to the next operation, which the builder wrote and every graph reader then refused (> 1e12
// us). Clock stamps are bounded where they are read (0..2^62, so that differences never overflow), and a duration
// past the format's bound is the builder's error, naming the rank.
TEST_F(InputLimits, EventFileClockStampsAndTheDurationsTheyMakeAreBounded) {
  analysis::RankEventLog log;
  log.rank = 0;
  int64_t n = 0;
  for (const char* line : {
           R"({"type":"hello","rank":0,"world_size":1})",
           R"({"type":"comm","comm_id":0,"key":"k","desc":"default_pg","nranks":1,"rank":0,"members":[0]})",
           R"({"type":"comm","comm_id":1,"key":"k1","desc":"","nranks":1,"rank":0,"members":[0]})",
           R"({"type":"op","comm_id":0,"seq":0,"op":"allreduce","dtype":"f32","bytes":4,"stream":0,)"
           R"("arrival_ns":1795952516301822784,"release_ns":1795952516310191568})",
           R"({"type":"op","comm_id":1,"seq":0,"op":"allreduce","dtype":"bf16","bytes":262144,"stream":0})",
           R"({"type":"op","comm_id":0,"seq":1,"op":"allreduce","dtype":"f32","bytes":4,"stream":0,)"
           R"("arrival_ns":1795952517890266944,"release_ns":1795952518151978448})",
           R"({"type":"iter","iteration":0,"t_ns":-5})",
           R"({"type":"op","comm_id":0,"seq":2,"op":"allreduce","arrival_ns":9000000000000000000})"}) {
    analysis::FeedEventLine(&log, line, ++n);
  }
  EXPECT_EQ(log.malformed, 2);
  EXPECT_TRUE(Has(log.first_malformed, "line 7: iteration line's t_ns is outside 0..2^62")) << log.first_malformed;
  ASSERT_EQ(log.ops.size(), 3u);
  std::string error;
  world::Layout layout;
  ASSERT_TRUE(world::ResolveLayout(&layout, 1, "test", &error)) << error;
  auto w = world::World::Make(layout, 8, &error);
  ASSERT_TRUE(w) << error;
  EXPECT_FALSE(analysis::BuildObservedTrace({log}, *w, analysis::ObservedTraceOptions{}, &error));
  EXPECT_TRUE(Has(error, "rank 0's events give stream 'stream0' node 1 a duration of 1.79595e+15 us, past the "
                         "format's bound of 1e+12 us")) << error;
}

TEST_F(InputLimits, ChakraReaderRefusesDirectoriesAndOversizeFiles) {
  chakra::EtFile f;
  std::string error;
  fs::create_directories(P("d.0.et"));
  EXPECT_FALSE(chakra::ReadEtFile(P("d.0.et"), &f, &error));
  EXPECT_TRUE(Has(error, "is a directory")) << error;
  const std::string big = Sparse("big.0.et", uint64_t{5} << 30);
  EXPECT_FALSE(chakra::ReadEtFile(big, &f, &error));
  EXPECT_TRUE(Has(error, big + ": 5368709120 bytes is larger than the 4294967296-byte (4 GiB) cap")) << error;
  EXPECT_FALSE(chakra::ReadEtFile("/dev/zero", &f, &error));
  EXPECT_TRUE(Has(error, "is a device")) << error;
}

TEST(SynthLimits, SizesAndDurationsAreBoundedBeforeAllocating) {
  replay::SynthOptions o;
  trace::Trace t;
  std::string error;
  o.microbatches = 2'000'000'000;
  EXPECT_FALSE(replay::Synthesize(o, &t, &error));
  EXPECT_TRUE(Has(error, "--microbatches 2000000000 is more than 65536")) << error;
  o = replay::SynthOptions{};
  o.iterations = 60000;
  o.microbatches = 60000;
  EXPECT_FALSE(replay::Synthesize(o, &t, &error));
  EXPECT_TRUE(Has(error, "nodes per rank")) << error;
  o = replay::SynthOptions{};
  o.fwd_us = -5;
  EXPECT_FALSE(replay::Synthesize(o, &t, &error));
  EXPECT_TRUE(Has(error, "--fwd-us -5 is outside 0..1e+12 us")) << error;
  o.fwd_us = 1e308;
  EXPECT_FALSE(replay::Synthesize(o, &t, &error));
  EXPECT_TRUE(Has(error, "--fwd-us 1e+308")) << error;
  o = replay::SynthOptions{};
  EXPECT_TRUE(replay::Synthesize(o, &t, &error)) << error;
}

}  // namespace
}  // namespace prism
