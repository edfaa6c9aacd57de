// The streaming importer (ImportChakra) against the reference that keeps every rank's nodes
// (ImportChakraDocument): the same graph (TraceToJson, byte for byte), the same summary and notes, or the same
// error message, on the fixture, on exported synthesized jobs (with and without Prism's attributes, gzip'd, with
// p2p tags that force per-tag communicators), on every kind of bad input, on unusual but valid encodings that the
// fast decoder leaves to protobuf, and on mutated files. Also: the fixture's graph equals the golden file the
// reference wrote (tests/data/chakra/pp2-tp2.imported.prism.json), and the thread count changes nothing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/chakra/chakra_et_io.h"
#include "replay/chakra/chakra_et_reader.h"
#include "replay/chakra/chakra_export.h"
#include "replay/chakra/chakra_import.h"
#include "replay/synth.h"
#include "replay/trace_io.h"

namespace {

namespace fs = std::filesystem;
using namespace prism;
using chakra::EtFile;
namespace et = chakra::et;

const std::string kFixture = std::string(PRISM_SOURCE_DIR) + "/tests/data/chakra/pp2-tp2";
const std::string kGolden = std::string(PRISM_SOURCE_DIR) + "/tests/data/chakra/pp2-tp2.imported.prism.json";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Rank {
  EtFile f;
  Rank() { f.metadata.set_version("0.0.4"); }
  et::Node& Add(uint64_t id, const std::string& name, et::NodeType type, std::vector<uint64_t> deps = {}) {
    et::Node& n = f.nodes.emplace_back();
    n.set_id(id);
    n.set_name(name);
    n.set_type(type);
    for (uint64_t d : deps) n.add_data_deps(d);
    return n;
  }
  et::Node& Comp(uint64_t id, const std::string& name, uint64_t us, std::vector<uint64_t> deps = {}) {
    et::Node& n = Add(id, name, et::COMP_NODE, deps);
    n.set_duration_micros(us);
    return n;
  }
  et::Node& Coll(uint64_t id, const std::string& name, et::CollectiveCommType ct, int64_t bytes, const std::string& pg,
                 std::vector<uint64_t> deps = {}) {
    et::Node& n = Add(id, name, et::COMM_COLL_NODE, deps);
    *n.add_attr() = chakra::MakeIntAttr("comm_type", ct);
    *n.add_attr() = chakra::MakeIntAttr("comm_size", bytes);
    if (!pg.empty()) *n.add_attr() = chakra::MakeStringAttr("pg_name", pg);
    return n;
  }
  et::Node& P2p(bool send, uint64_t id, const std::string& name, int src, int dst, int tag, int64_t bytes,
                std::vector<uint64_t> deps = {}) {
    et::Node& n = Add(id, name, send ? et::COMM_SEND_NODE : et::COMM_RECV_NODE, deps);
    *n.add_attr() = chakra::MakeInt32Attr("comm_src", src);
    *n.add_attr() = chakra::MakeInt32Attr("comm_dst", dst);
    *n.add_attr() = chakra::MakeInt32Attr("comm_tag", tag);
    *n.add_attr() = chakra::MakeIntAttr("comm_size", bytes);
    return n;
  }
};

// What one importer gave.
struct Outcome {
  bool ok = false;
  std::string error, graph, summary;
};

Outcome ImportWith(const chakra::ImportOptions& o, bool reference) {
  Outcome r;
  trace::Trace t;
  chakra::ImportSummary s;
  r.ok = reference ? chakra::ImportChakraDocument(o, &t, &s, &r.error) : chakra::ImportChakra(o, &t, &s, &r.error);
  if (r.ok) {
    r.graph = replay::TraceToJson(t).dump();
    r.summary = s.Format();
    for (const auto& n : s.notes) r.summary += "note: " + n + "\n";
    r.summary += "from_prism " + std::to_string(s.from_prism) + " comm_group " + s.comm_group_file;
  }
  return r;
}

class ChakraStream : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("prism_chakra_stream_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  void WriteRanks(const std::vector<Rank>& ranks, const std::string& sub = "t") {
    fs::create_directories(P(sub));
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string err;
      ASSERT_TRUE(chakra::WriteEtFile(P(sub + "/t." + std::to_string(r) + ".et"), ranks[r].f, &err)) << err;
    }
  }
  // Both importers on `input`; they must agree. Returns the streaming one's outcome.
  Outcome Agree(const std::string& input, const std::string& label, bool ctrl_deps = true,
                chakra::AllGatherCommSize ag = chakra::AllGatherCommSize::kInput) {
    chakra::ImportOptions o;
    o.input = input;
    o.ctrl_deps = ctrl_deps;
    o.allgather_comm_size = ag;
    const Outcome ref = ImportWith(o, true);
    const Outcome got = ImportWith(o, false);
    EXPECT_EQ(got.ok, ref.ok) << label << ": streaming '" << got.error << "' reference '" << ref.error << "'";
    EXPECT_EQ(got.error, ref.error) << label;
    EXPECT_EQ(got.summary, ref.summary) << label;
    EXPECT_TRUE(got.graph == ref.graph) << label << ": the graphs differ";
    return got;
  }
  fs::path dir_;
};

TEST_F(ChakraStream, FixtureEqualsTheReferenceAndItsGoldenGraph) {
  Outcome a = Agree(kFixture, "fixture");
  ASSERT_TRUE(a.ok) << a.error;
  // The golden file is the reference importer's output (ImportChakraDocument, which keeps every rank's nodes), as
  // JSON.
  nlohmann::json golden = nlohmann::json::parse(Slurp(kGolden), nullptr, false);
  ASSERT_FALSE(golden.is_discarded()) << kGolden;
  EXPECT_EQ(a.graph, golden.dump());
  Agree(kFixture, "fixture --no-ctrl-deps", false);
  Agree(kFixture, "fixture --allgather-comm-size output", true, chakra::AllGatherCommSize::kOutput);
}

TEST_F(ChakraStream, ExportedSynthesizedJobs) {
  struct Case {
    const char* label;
    int tp, pp, dp, ep, vpp, mb, iters;
    bool tp_comm, dist_opt;
  };
  const Case cases[] = {
      {"tp2pp2dp2", 2, 2, 2, 1, 1, 4, 1, false, true},
      {"tp2pp4dp2-tpcomm-2iter", 2, 4, 2, 1, 1, 8, 2, true, true},
      {"pp4dp2-vpp2-allreduce", 1, 4, 2, 1, 2, 8, 1, false, false},
      {"tp2pp2dp4-ep2", 2, 2, 4, 2, 1, 4, 1, false, true},
      {"tp4pp4dp4-tpcomm", 4, 4, 4, 1, 1, 8, 1, true, true},
  };
  for (const Case& c : cases) {
    replay::SynthOptions o;
    o.tp = c.tp;
    o.pp = c.pp;
    o.dp = c.dp;
    o.ep = c.ep;
    o.vpp = c.vpp;
    o.microbatches = c.mb;
    o.iterations = c.iters;
    o.tp_comm = c.tp_comm;
    o.distributed_optimizer = c.dist_opt;
    trace::Trace t;
    std::string err;
    ASSERT_TRUE(replay::Synthesize(o, &t, &err)) << c.label << ": " << err;
    for (bool attrs : {true, false}) {
      chakra::ExportOptions eo;
      eo.out_dir = P(std::string(c.label) + (attrs ? "" : "-bare"));
      eo.prism_attrs = attrs;
      ASSERT_TRUE(chakra::ExportChakra(t, eo, nullptr, &err)) << err;
      Outcome a = Agree(eo.out_dir, eo.out_dir);
      EXPECT_TRUE(a.ok) << a.error;
      // The fast decoder reads every node of our own files (nothing left to protobuf).
      chakra::EtReader reader;
      ASSERT_TRUE(reader.Open(eo.out_dir + "/prism.0.et", &err)) << err;
      chakra::EtNodeView v;
      while (reader.Next(&v, &err) > 0) {
      }
      EXPECT_EQ(reader.protobuf_decoded(), 0u) << c.label;
    }
  }
}

TEST_F(ChakraStream, GzipAndThreadCountsGiveTheSame) {
  replay::SynthOptions o;
  o.tp = 2;
  o.pp = 4;
  o.dp = 4;
  o.microbatches = 8;
  o.tp_comm = true;
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(replay::Synthesize(o, &t, &err)) << err;
  chakra::ExportOptions eo;
  eo.out_dir = P("plain");
  ASSERT_TRUE(chakra::ExportChakra(t, eo, nullptr, &err)) << err;
  // The same files, gzip'd.
  fs::create_directories(P("gz"));
  for (int r = 0; r < 32; ++r) {
    EtFile f;
    ASSERT_TRUE(chakra::ReadEtFile(P("plain/prism." + std::to_string(r) + ".et"), &f, &err)) << err;
    ASSERT_TRUE(chakra::WriteEtFile(P("gz/prism." + std::to_string(r) + ".et.gz"), f, &err)) << err;
  }
  fs::copy_file(P("plain/comm_group.json"), P("gz/comm_group.json"));
  Outcome plain = Agree(P("plain"), "plain");
  Outcome gz = Agree(P("gz"), "gz");
  ASSERT_TRUE(plain.ok && gz.ok);
  EXPECT_EQ(plain.graph, gz.graph);
  for (int threads : {1, 2, 3, 7}) {
    chakra::ImportOptions io;
    io.input = P("plain");
    io.threads = threads;
    trace::Trace x;
    ASSERT_TRUE(chakra::ImportChakra(io, &x, nullptr, &err)) << err;
    EXPECT_EQ(replay::TraceToJson(x).dump(), plain.graph) << threads << " threads";
  }
}

TEST_F(ChakraStream, P2pTagsAndProcessGroupTables) {
  {  // ASTRA-sim pairs by (src, dst, tag, size): per-(tag, size) communicators.
    std::vector<Rank> ranks(4);
    for (int base : {0, 2}) {
      ranks[base].P2p(true, 0, "s1", base, base + 1, 1, 100);
      ranks[base].P2p(true, 1, "s2", base, base + 1, 2, 200, {0});
      ranks[base].P2p(false, 2, "back", base + 1, base, 7, 50, {1});
      ranks[base + 1].P2p(false, 0, "r2", base, base + 1, 2, 200);
      ranks[base + 1].P2p(false, 1, "r1", base, base + 1, 1, 100, {0});
      ranks[base + 1].P2p(true, 2, "back", base + 1, base, 7, 50, {1});
    }
    WriteRanks(ranks, "tags");
    EXPECT_TRUE(Agree(P("tags"), "tags").ok);
  }
  {  // Tags that differ within one pair's messages, same order on both sides: one communicator.
    std::vector<Rank> ranks(2);
    for (int k = 0; k < 4; ++k) {
      ranks[0].P2p(true, k, "s" + std::to_string(k), 0, 1, k, 64, k ? std::vector<uint64_t>{uint64_t(k - 1)}
                                                                    : std::vector<uint64_t>{});
      ranks[1].P2p(false, 10 + k, "r" + std::to_string(k), 0, 1, k, 64,
                   k ? std::vector<uint64_t>{uint64_t(10 + k - 1)} : std::vector<uint64_t>{});
    }
    WriteRanks(ranks, "varying");
    EXPECT_TRUE(Agree(P("varying"), "varying").ok);
  }
  {  // PyTorch's process-group table, and p2p on a defined group.
    const std::string table =
        R"(['[{"pg_name": "0", "pg_desc": "default_pg", "ranks": []}, )"
        R"({"pg_name": "5", "pg_desc": "TENSOR_MODEL_PARALLEL", "ranks": [2, 3]}]'])";
    std::vector<Rank> ranks(4);
    for (int r = 0; r < 4; ++r) {
      ranks[r].Add(0, "## process_group:init ##", et::METADATA_NODE).mutable_inputs()->set_values(table);
      ranks[r].Comp(1, "fwd", 10, {0});
      if (r >= 2) ranks[r].Coll(2, "tp", et::REDUCE_SCATTER, 8192, "5", {1});
      ranks[r].Coll(3, "dp", et::ALL_REDUCE, 1024, "0", {1});
      ranks[r].Coll(4, "world too", et::ALL_GATHER, 16, "", {3});
      ranks[r].Add(5, "store", et::MEM_STORE_NODE, {4}).set_duration_micros(3 + r);
    }
    *ranks[2].P2p(true, 6, "tp send", 2, 3, 0, 32, {4}).add_attr() = chakra::MakeStringAttr("pg_name", "5");
    *ranks[3].P2p(false, 6, "tp recv", 2, 3, 0, 32, {4}).add_attr() = chakra::MakeStringAttr("pg_name", "5");
    WriteRanks(ranks, "pg");
    EXPECT_TRUE(Agree(P("pg"), "pg").ok);
  }
}

// Recorded traces: among nodes free to go, the earlier start time first (then the smaller id); ranks that differ
// only in a name, a duration or a dependency do not share a class, ranks that differ only in their node ids do.
TEST_F(ChakraStream, StartTimesNamesAndIds) {
  std::vector<Rank> ranks(4);
  for (int r = 0; r < 4; ++r) {
    const uint64_t base = 100 * r;  // ids from one counter across ranks, as Chakra's generator numbers them
    for (uint64_t k = 0; k < 6; ++k) {
      et::Node& n = ranks[r].Comp(base + k, "op" + std::to_string(k), 10 + k);
      n.set_start_time_micros(1000 - 100 * k);  // started in the reverse of id order
      if (k == 3) *n.add_attr() = chakra::MakeBoolAttr("is_cpu_op", true);
    }
    ranks[r].Add(base + 6, "load", et::MEM_LOAD_NODE, {base + 0, base + 1}).set_start_time_micros(50);
    ranks[r].Coll(base + 7, "ar", et::ALL_REDUCE, 64, "", {base + 6, base + 4});
  }
  ranks[2].f.nodes[1].set_name("renamed");
  ranks[3].f.nodes[2].set_duration_micros(99);
  WriteRanks(ranks, "recorded");
  Outcome a = Agree(P("recorded"), "recorded");
  ASSERT_TRUE(a.ok) << a.error;
  trace::Trace t;
  chakra::ImportOptions o;
  o.input = P("recorded");
  std::string err;
  ASSERT_TRUE(chakra::ImportChakra(o, &t, nullptr, &err)) << err;
  EXPECT_EQ(t.classes.size(), 3u);  // ranks 0 and 1 share one
  EXPECT_EQ(t.ranks[0].cls, t.ranks[1].cls);
  std::vector<std::string> order;
  for (const auto& st : t.classes[t.ranks[0].cls].streams) {
    if (st.name != "compute") continue;
    for (const auto& n : st.nodes) order.push_back(n.name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"op5", "op4", "op2", "op1", "op0"}));
}

// Every kind of bad input gives the reference's message.
TEST_F(ChakraStream, BadInputGivesTheReferenceMessage) {
  std::vector<std::pair<std::string, std::vector<Rank>>> cases;
  auto add = [&](const std::string& label, std::vector<Rank> ranks) { cases.emplace_back(label, std::move(ranks)); };
  {
    std::vector<Rank> r(1);
    r[0].Comp(5, "x", 1, {99});
    add("dangling", r);
  }
  {
    std::vector<Rank> r(1);
    r[0].Comp(1, "a", 1, {2});
    r[0].Comp(2, "b", 1, {1});
    add("cycle", r);
  }
  {
    std::vector<Rank> r(1);
    r[0].Comp(4, "self", 1, {4});
    add("self", r);
  }
  {  // A duplicate id after a node that fails to classify: the duplicate is reported (ids are checked first).
    std::vector<Rank> r(1);
    r[0].Add(4, "mystery", et::COMM_COLL_NODE);
    r[0].Comp(3, "a", 1);
    r[0].Comp(3, "b", 1);
    add("dup-after-bad", r);
  }
  {  // A dangling dependency before a node that fails to classify: the dependency is reported.
    std::vector<Rank> r(1);
    r[0].Comp(1, "a", 1, {42});
    r[0].Add(4, "mystery", et::COMM_COLL_NODE);
    add("dangling-before-bad", r);
  }
  {
    std::vector<Rank> r(2);
    for (auto& x : r) x.Coll(0, "ar", et::ALL_REDUCE, 8, "9");
    add("unknown-pg", r);
  }
  {
    std::vector<Rank> r(1);
    *r[0].Add(4, "ar", et::COMM_COLL_NODE).add_attr() = chakra::MakeStringAttr("comm_size", "1MB");
    add("comm-size-kind", r);
  }
  {
    std::vector<Rank> r(2);
    r[0].Coll(0, "ar", et::ALL_REDUCE, 1024, "");
    r[1].Coll(7, "ar", et::ALL_REDUCE, 2048, "");
    add("disagree", r);
  }
  {
    std::vector<Rank> r(2);
    r[0].Coll(0, "ar0", et::ALL_REDUCE, 64, "");
    r[0].Coll(1, "ar1", et::ALL_REDUCE, 64, "", {0});
    r[1].Coll(0, "ar0", et::ALL_REDUCE, 64, "");
    add("misses", r);
  }
  {
    std::vector<Rank> r(3);
    r[0].Comp(0, "c", 1);
    r[0].Coll(1, "a2a", et::ALL_TO_ALL, 64, "", {0});
    r[1].Coll(1, "a2a", et::ALL_TO_ALL, 128, "");
    r[2].Coll(1, "bc", et::BROADCAST, 64, "");
    add("alltoall-sizes-then-op", r);
  }
  {
    std::vector<Rank> r(2);
    r[0].P2p(true, 3, "s", 0, 1, 0, 100);
    r[1].Comp(0, "idle", 1);
    add("send-without-recv", r);
  }
  {
    std::vector<Rank> r(2);
    r[0].P2p(true, 3, "s", 0, 1, 1, 100);
    r[1].P2p(false, 3, "r", 0, 1, 2, 100);
    add("tag-mismatch", r);
  }
  {
    std::vector<Rank> r(2);
    r[1].P2p(true, 3, "s", 0, 1, 0, 100);
    add("send-by-other", r);
  }
  {
    std::vector<Rank> r(2);
    r[0].P2p(true, 3, "s", 0, 5, 0, 100);
    add("peer-outside", r);
  }
  {
    std::vector<Rank> r(2);
    for (auto& x : r) x.Coll(0, "ag", et::ALL_GATHER, int64_t{1} << 50, "");
    add("allgather-overflow", r);
  }
  {
    std::vector<Rank> r(1);
    r[0].Comp(0, "long", 1);
    *r[0].f.nodes[0].add_attr() = chakra::MakeDoubleAttr("prism_dur_us", 1e13);
    add("duration", r);
  }
  for (auto& [label, ranks] : cases) {
    WriteRanks(ranks, label);
    Outcome a = Agree(P(label), label);
    EXPECT_FALSE(a.ok) << label;
  }
  {  // A rank outside its group (comm-group file).
    std::vector<Rank> r(3);
    for (int k = 0; k < 3; ++k) r[k].Coll(0, "ar", et::ALL_REDUCE, 8, "1");
    WriteRanks(r, "not-member");
    std::ofstream(P("not-member/comm_group.json")) << R"({"1": [0, 1]})";
    EXPECT_FALSE(Agree(P("not-member"), "not-member").ok);
  }
  {  // A p2p peer outside the named group.
    std::vector<Rank> r(3);
    *r[0].P2p(true, 0, "s", 0, 2, 0, 8).add_attr() = chakra::MakeStringAttr("pg_name", "1");
    *r[2].P2p(false, 0, "r", 0, 2, 0, 8).add_attr() = chakra::MakeStringAttr("pg_name", "1");
    WriteRanks(r, "peer-not-member");
    std::ofstream(P("peer-not-member/comm_group.json")) << R"({"1": [0, 1]})";
    EXPECT_FALSE(Agree(P("peer-not-member"), "peer-not-member").ok);
  }
}

// Writes length-delimited messages, each given as its bytes.
void WriteFrames(const std::string& path, const std::vector<std::string>& messages) {
  std::string out;
  for (const std::string& m : messages) {
    uint64_t n = m.size();
    do {
      unsigned char b = n & 0x7f;
      n >>= 7;
      out.push_back(static_cast<char>(n ? b | 0x80 : b));
    } while (n);
    out += m;
  }
  std::ofstream(path, std::ios::binary) << out;
}

std::string Varint(uint64_t v) {
  std::string s;
  do {
    unsigned char b = v & 0x7f;
    v >>= 7;
    s.push_back(static_cast<char>(v ? b | 0x80 : b));
  } while (v);
  return s;
}

// Encodings protobuf accepts that the fast decoder leaves to it, or reads itself in a form our writer does not
// use: the streaming importer must read them as the reference does.
TEST_F(ChakraStream, UnusualEncodingsReadAsProtobufReadsThem) {
  et::GlobalMetadata meta;
  meta.set_version("0.0.4");
  auto node = [](uint64_t id, const std::string& name, std::vector<uint64_t> deps) {
    et::Node n;
    n.set_id(id);
    n.set_name(name);
    n.set_type(et::COMP_NODE);
    n.set_duration_micros(5);
    for (uint64_t d : deps) n.add_data_deps(d);
    return n;
  };
  std::vector<std::string> msgs = {meta.SerializeAsString()};
  msgs.push_back(node(1, "plain", {}).SerializeAsString());
  // Unpacked data_deps (wire type 0, one tag per value) and an unknown field 99 (varint).
  msgs.push_back(node(2, "unpacked", {}).SerializeAsString() + std::string("\x28\x01", 2) +
                 Varint((99 << 3) | 0) + Varint(12345));
  // A list attribute (int64_list), and a name that is valid UTF-8 but not ASCII.
  {
    et::Node n = node(3, "gemm \xc3\xa9t\xc3\xa9", {2});
    auto* a = n.add_attr();
    a->set_name("shape");
    a->mutable_int64_list()->add_values(4);
    a->mutable_int64_list()->add_values(8);
    msgs.push_back(n.SerializeAsString());
  }
  // A field repeated (the last id wins) and an over-long varint for duration_micros.
  msgs.push_back(node(40, "twice", {3}).SerializeAsString() + Varint(1 << 3) + Varint(4) + std::string("\x38") +
                 std::string("\x87\x80\x80\x80\x80\x80\x80\x80\x80\x00", 10));
  // Two inputs fields merge; a group (wire type 3) as an unknown field.
  msgs.push_back(node(5, "inputs", {4}).SerializeAsString() + std::string("\x42\x03\x0a\x01x", 5) +
                 std::string("\x42\x03\x12\x01y", 5) + Varint((98 << 3) | 3) + Varint((98 << 3) | 4));
  WriteFrames(P("t.0.et"), msgs);
  WriteFrames(P("t.1.et"), msgs);
  Outcome a = Agree(dir_.string(), "unusual");
  EXPECT_TRUE(a.ok) << a.error;
  chakra::EtReader reader;
  std::string err;
  ASSERT_TRUE(reader.Open(P("t.0.et"), &err)) << err;
  chakra::EtNodeView v;
  std::vector<uint64_t> ids, durations;
  while (reader.Next(&v, &err) > 0) {
    ids.push_back(v.id);
    durations.push_back(v.duration_micros);
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(durations, (std::vector<uint64_t>{5, 5, 5, 7, 5}));
  EXPECT_EQ(reader.protobuf_decoded(), 2u);  // node 3 (a list, a UTF-8 name) and node 5 (a group)

  // Invalid UTF-8 in a string field, and a varint of 11 bytes: protobuf refuses both; so do both importers.
  fs::remove(P("t.1.et"));
  WriteFrames(P("t.0.et"), {meta.SerializeAsString(), node(1, "bad \xff utf8", {}).SerializeAsString()});
  EXPECT_FALSE(Agree(dir_.string(), "invalid utf-8").ok);
  WriteFrames(P("t.0.et"), {meta.SerializeAsString(), std::string("\x08") + std::string(10, '\x80') + "\x01"});
  EXPECT_FALSE(Agree(dir_.string(), "long varint").ok);
}

// A deterministic byte-level mutator (xorshift).
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ULL + 1) {}
  uint64_t Next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }
  std::string Mutate(std::string in) {
    const int edits = 1 + static_cast<int>(Next() % 3);
    for (int e = 0; e < edits && !in.empty(); ++e) {
      const size_t at = Next() % in.size();
      switch (Next() % 5) {
        case 0: in[at] = static_cast<char>(Next()); break;                 // a byte
        case 1: in[at] = static_cast<char>(in[at] ^ (1 << (Next() % 8))); break;  // a bit
        case 2: in.resize(at); break;                                      // truncated
        case 3: in.insert(at, 1, static_cast<char>(Next())); break;        // a byte more
        default: in.erase(at, 1 + Next() % 4); break;                      // bytes less
      }
    }
    return in;
  }

 private:
  uint64_t s_;
};

TEST_F(ChakraStream, MutatedFilesGiveTheReferenceOutcome) {
  std::vector<std::string> seeds;
  for (int r = 0; r < 4; ++r) seeds.push_back(Slurp(kFixture + "/pp2tp2." + std::to_string(r) + ".et"));
  const std::string groups = Slurp(kFixture + "/comm_group.json");
  ASSERT_FALSE(seeds[0].empty());
  Mutator m(26);
  int accepted = 0;
  for (int i = 0; i < 400; ++i) {
    const int victim = static_cast<int>(m.Next() % 4);
    for (int r = 0; r < 4; ++r) {
      std::ofstream(P("t." + std::to_string(r) + ".et"), std::ios::binary)
          << (r == victim ? m.Mutate(seeds[r]) : seeds[r]);
    }
    std::ofstream(P("comm_group.json")) << groups;
    Outcome a = Agree(dir_.string(), "mutation " + std::to_string(i));
    accepted += a.ok;
    if (HasFailure()) break;
  }
  EXPECT_GT(accepted, 0);  // some mutations still import (ids, durations, names changed)
}

}  // namespace
