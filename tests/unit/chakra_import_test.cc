// Chakra ET files: the framing (against files framed by protoc + a script, not by our writer), gzip, broken
// files; and import-chakra's mapping: communicators, streams, `after` edges, role-class folding, nodes Prism
// cannot represent, and every kind of bad input with a message that names the file and the node.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "replay/chakra/chakra_et_io.h"
#include "replay/chakra/chakra_import.h"
#include "replay/trace_validate.h"

namespace {

namespace fs = std::filesystem;
using namespace prism;
using chakra::EtFile;
namespace et = chakra::et;

const std::string kFixture = std::string(PRISM_SOURCE_DIR) + "/tests/data/chakra/pp2-tp2";

// A hand-made rank file.
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
    *n.add_attr() = chakra::MakeBoolAttr("is_cpu_op", false);
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

class ChakraTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("prism_chakra_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  void WriteRanks(const std::vector<Rank>& ranks, const std::string& prefix = "t") {
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string err;
      ASSERT_TRUE(chakra::WriteEtFile(P(prefix + "." + std::to_string(r) + ".et"), ranks[r].f, &err)) << err;
    }
  }
  bool Import(trace::Trace* t, chakra::ImportSummary* s, std::string* err, bool ctrl = true) {
    chakra::ImportOptions o;
    o.input = dir_.string();
    o.ctrl_deps = ctrl;
    return chakra::ImportChakra(o, t, s, err);
  }
  // Import expected to fail; returns the message.
  std::string ImportError() {
    trace::Trace t;
    chakra::ImportSummary s;
    std::string err;
    EXPECT_FALSE(Import(&t, &s, &err));
    return err;
  }
  fs::path dir_;
};

const trace::Node* FindNode(const trace::Trace& t, int32_t rank, const std::string& name,
                            const trace::Stream** stream = nullptr) {
  for (const auto& st : t.classes[t.ranks[rank].cls].streams) {
    for (const auto& n : st.nodes) {
      if (n.name == name) {
        if (stream) *stream = &st;
        return &n;
      }
    }
  }
  return nullptr;
}

const trace::Comm& CommOf(const trace::Trace& t, int32_t rank, const trace::Node& n) {
  uint32_t id = t.ranks[rank].comms.at(n.comm_slot);
  for (const auto& c : t.comms) {
    if (c.id == id) return c;
  }
  static trace::Comm none;
  return none;
}

// ---------------------------------------------------------------------------------------------------------
// The file format.

TEST_F(ChakraTest, ReadsFilesFramedByProtocAndAScript) {
  // tests/data/chakra/make_fixtures.py framed these with protoc --encode and its own varint code.
  EtFile f;
  std::string err;
  ASSERT_TRUE(chakra::ReadEtFile(kFixture + "/pp2tp2.0.et", &f, &err)) << err;
  EXPECT_EQ(f.metadata.version(), "0.0.4");
  ASSERT_EQ(f.nodes.size(), 7u);
  const et::Node& send = f.nodes[3];
  EXPECT_EQ(send.type(), et::COMM_SEND_NODE);
  EXPECT_EQ(send.name(), "send act");
  ASSERT_EQ(send.data_deps_size(), 1);
  EXPECT_EQ(send.data_deps(0), 2u);
  const auto* dst = chakra::FindAttr(send.attr(), "comm_dst");
  ASSERT_NE(dst, nullptr);
  EXPECT_EQ(chakra::AttrInt(*dst), 2);
  EXPECT_EQ(f.nodes[0].duration_micros(), 120u);
  // comm_type ALL_REDUCE is 0 and still present (oneof presence).
  const auto* ct = chakra::FindAttr(f.nodes[1].attr(), "comm_type");
  ASSERT_NE(ct, nullptr);
  EXPECT_EQ(chakra::AttrInt(*ct), 0);
}

TEST_F(ChakraTest, WriterProducesTheSameBytesAsTheIndependentFraming) {
  EtFile f;
  std::string err;
  ASSERT_TRUE(chakra::ReadEtFile(kFixture + "/pp2tp2.2.et", &f, &err)) << err;
  ASSERT_TRUE(chakra::WriteEtFile(P("copy.et"), f, &err)) << err;
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(P("copy.et")), bytes(kFixture + "/pp2tp2.2.et"));
}

TEST_F(ChakraTest, GzipFilesAreReadLikeChakraDoes) {
  EtFile f;
  std::string err;
  ASSERT_TRUE(chakra::ReadEtFile(kFixture + "/pp2tp2.0.et", &f, &err)) << err;
  ASSERT_TRUE(chakra::WriteEtFile(P("z.et.gz"), f, &err)) << err;
  std::ifstream in(P("z.et.gz"), std::ios::binary);
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  EXPECT_EQ(magic[0], 0x1f);
  EXPECT_EQ(magic[1], 0x8b);
  EtFile back;
  ASSERT_TRUE(chakra::ReadEtFile(P("z.et.gz"), &back, &err)) << err;
  ASSERT_EQ(back.nodes.size(), f.nodes.size());
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    EXPECT_EQ(back.nodes[i].SerializeAsString(), f.nodes[i].SerializeAsString()) << i;
  }
}

TEST_F(ChakraTest, BrokenFilesNameTheFileTheMessageAndTheOffset) {
  std::string err;
  EtFile f;
  EXPECT_FALSE(chakra::ReadEtFile(P("absent.et"), &f, &err));
  EXPECT_NE(err.find("absent.et: cannot open"), std::string::npos) << err;

  std::ofstream(P("empty.et")).close();
  EXPECT_FALSE(chakra::ReadEtFile(P("empty.et"), &f, &err));
  EXPECT_NE(err.find("empty.et: empty file"), std::string::npos) << err;

  // Cut the fixture inside its last node.
  std::ifstream in(kFixture + "/pp2tp2.2.et", std::ios::binary);
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  std::ofstream(P("cut.et"), std::ios::binary) << bytes.substr(0, bytes.size() - 5);
  EXPECT_FALSE(chakra::ReadEtFile(P("cut.et"), &f, &err));
  EXPECT_NE(err.find("cut.et: message 4 (node #3) (offset "), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  // A length prefix followed by bytes that are not a Node (field 3 with wire type 7 does not exist).
  std::string junk = bytes.substr(0, 8) + std::string("\x03\x1f\xff\xff", 4);
  std::ofstream(P("junk.et"), std::ios::binary) << junk;
  EXPECT_FALSE(chakra::ReadEtFile(P("junk.et"), &f, &err));
  EXPECT_NE(err.find("junk.et: message 1 (node #0) (offset 8): the 3 bytes do not parse"), std::string::npos) << err;
}

TEST_F(ChakraTest, IntegerAttributesAreReadWhateverTheirKind) {
  et::AttributeProto a;
  a.set_uint64_val(7);
  EXPECT_EQ(chakra::AttrInt(a), 7);
  a.set_sint32_val(-3);
  EXPECT_EQ(chakra::AttrInt(a), -3);
  a.set_fixed64_val(1ull << 40);
  EXPECT_EQ(chakra::AttrInt(a), int64_t{1} << 40);
  a.set_string_val("x");
  EXPECT_FALSE(chakra::AttrInt(a).has_value());
  EXPECT_EQ(chakra::AttrValueKind(a), "string_val");
}

// ---------------------------------------------------------------------------------------------------------
// Mapping.

TEST_F(ChakraTest, FixtureMapsToStreamsCommsAndTwoRoleClasses) {
  chakra::ImportOptions o;
  o.input = kFixture;  // comm_group.json next to the files is picked up
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(chakra::ImportChakra(o, &t, &s, &err)) << err;
  EXPECT_EQ(s.comm_group_file, kFixture + "/comm_group.json");
  ASSERT_EQ(t.world_size, 4);
  EXPECT_EQ(t.layout.dp, 4);
  EXPECT_TRUE(replay::ValidateTrace(t).empty());
  // Two pipeline stages; the tensor-parallel peers of a stage fold (their ids differ: 0.. vs 100..).
  ASSERT_EQ(t.classes.size(), 2u);
  EXPECT_EQ(t.ranks[0].cls, t.ranks[1].cls);
  EXPECT_EQ(t.ranks[2].cls, t.ranks[3].cls);
  EXPECT_NE(t.ranks[0].cls, t.ranks[2].cls);
  EXPECT_EQ(t.classes[t.ranks[0].cls].name, "rank0");
  EXPECT_EQ(t.classes[t.ranks[2].cls].name, "rank2");
  // pg "1", pg "2", the world ("0"), and one pair communicator per pipeline message flow.
  EXPECT_EQ(t.comms.size(), 5u);

  const trace::Stream* st = nullptr;
  const trace::Node* ar = FindNode(t, 1, "tp allreduce fwd", &st);
  ASSERT_NE(ar, nullptr);
  EXPECT_EQ(st->name, "comm.g0");
  EXPECT_EQ(ar->op, trace::CollOp::kAllReduce);
  EXPECT_EQ(ar->bytes, 1048576u);
  EXPECT_EQ(ar->dur_us, -1.0);  // no recorded duration: the cost model decides
  EXPECT_EQ(CommOf(t, 1, *ar).ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(CommOf(t, 3, *FindNode(t, 3, "tp allreduce fwd")).ranks, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(CommOf(t, 3, *FindNode(t, 3, "grad allreduce")).desc, "world");

  // Rank 0's send to rank 2: pair communicator [0, 2], peer 1; waits for the all-reduce through the
  // MEM_LOAD node Prism does not represent.
  const trace::Node* send = FindNode(t, 0, "send act", &st);
  ASSERT_NE(send, nullptr);
  EXPECT_EQ(send->kind, trace::NodeKind::kSend);
  EXPECT_EQ(st->name, "send.p0.1");
  EXPECT_EQ(CommOf(t, 0, *send).ranks, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(send->peer, 1);
  EXPECT_EQ(send->after, (std::vector<uint32_t>{ar->id}));
  const trace::Node* recv = FindNode(t, 3, "recv act", &st);
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(CommOf(t, 3, *recv).ranks, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(recv->peer, 0);
  const trace::Node* embed = FindNode(t, 0, "embed", &st);
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(st->name, "compute");
  EXPECT_EQ(embed->dur_us, 120.0);
  // fwd tail follows embed on the compute stream: that dependency is stream order, not an edge.
  EXPECT_EQ(FindNode(t, 0, "fwd tail")->after, (std::vector<uint32_t>{ar->id}));

  EXPECT_EQ(s.not_represented, (std::map<std::string, uint64_t>{{"MEM_LOAD_NODE", 2}, {"METADATA_NODE", 2}}));
  EXPECT_EQ(s.imported.at("compute"), 6u);
  EXPECT_EQ(s.imported.at("coll allreduce"), 8u);
  EXPECT_EQ(s.imported.at("send"), 2u);
  EXPECT_EQ(s.imported.at("recv"), 2u);
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes[0].find("2 MEM_LOAD_NODE"), std::string::npos) << s.notes[0];
  EXPECT_NE(s.Format().find("not represented: 4, MEM_LOAD_NODE 2, METADATA_NODE 2"), std::string::npos)
      << s.Format();
}

TEST_F(ChakraTest, IdenticalReplicasFoldEvenWithGlobalNodeIds) {
  // Chakra's generator numbers nodes with one counter across ranks; structure decides, not ids.
  std::vector<Rank> ranks(4);
  for (int r = 0; r < 4; ++r) {
    uint64_t b = 10 * r;
    ranks[r].Comp(b, "fwd", 100);
    ranks[r].Coll(b + 1, "grads", et::ALL_REDUCE, 1 << 20, "", {b});
    ranks[r].Comp(b + 2, "opt", 30, {b + 1});
  }
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  EXPECT_EQ(t.classes.size(), 1u);
  EXPECT_EQ(s.classes, 1u);
  EXPECT_EQ(t.comms.size(), 1u);
  EXPECT_EQ(t.comms[0].ranks.size(), 4u);
}

TEST_F(ChakraTest, DifferentDurationsDoNotFold) {
  std::vector<Rank> ranks(2);
  ranks[0].Comp(0, "fwd", 100);
  ranks[1].Comp(0, "fwd", 101);
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  EXPECT_EQ(t.classes.size(), 2u);
}

TEST_F(ChakraTest, CpuOpsGetTheirOwnStreamAndCtrlDepsAreOptional) {
  std::vector<Rank> ranks(1);
  et::Node& cpu = ranks[0].Comp(0, "launch", 5);
  cpu.mutable_attr(0)->set_bool_val(true);  // is_cpu_op
  et::Node& k = ranks[0].Comp(1, "kernel", 50);
  k.add_ctrl_deps(0);
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err, /*ctrl=*/true)) << err;
  const trace::Stream* st = nullptr;
  const trace::Node* launch = FindNode(t, 0, "launch", &st);
  ASSERT_NE(launch, nullptr);
  EXPECT_EQ(st->name, "cpu");
  EXPECT_EQ(FindNode(t, 0, "kernel", &st)->after, (std::vector<uint32_t>{launch->id}));
  EXPECT_EQ(st->name, "compute");
  ASSERT_TRUE(Import(&t, &s, &err, /*ctrl=*/false)) << err;
  EXPECT_TRUE(FindNode(t, 0, "kernel")->after.empty());
}

TEST_F(ChakraTest, RecordedCommDurationsAreKept) {
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) r.Coll(0, "ar", et::ALL_GATHER, 4096, "").set_duration_micros(42);
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  const trace::Node* n = FindNode(t, 0, "ar");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->op, trace::CollOp::kAllGather);
  EXPECT_EQ(n->dur_us, 42.0);
}

// comm_size as ASTRA-sim's collectives read it (docs/chakra.md, "comm_size"): an all-gather's is each rank's
// input, so Prism's bytes (nccl-tests' S, the whole output) is comm_size x the communicator's ranks; the other
// collectives' comm_size is S already.
TEST_F(ChakraTest, AllGatherCommSizeIsEachRanksInput) {
  std::vector<Rank> ranks(4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].Coll(0, "ag world", et::ALL_GATHER, 1000, "");
    ranks[r].Coll(1, "ag pair", et::ALL_GATHER, 1000, r < 2 ? "1" : "2", {0});
    ranks[r].Coll(2, "ar", et::ALL_REDUCE, 1000, "", {1});
    ranks[r].Coll(3, "rs", et::REDUCE_SCATTER, 1000, "", {2});
    ranks[r].Coll(4, "a2a", et::ALL_TO_ALL, 1000, "", {3});
  }
  WriteRanks(ranks);
  std::ofstream(P("comm_group.json")) << R"({"1": [0, 1], "2": [2, 3]})";
  for (auto mode : {chakra::AllGatherCommSize::kInput, chakra::AllGatherCommSize::kOutput}) {
    const bool input = mode == chakra::AllGatherCommSize::kInput;
    chakra::ImportOptions o;
    o.input = dir_.string();
    o.allgather_comm_size = mode;
    trace::Trace t;
    std::string err;
    ASSERT_TRUE(chakra::ImportChakra(o, &t, nullptr, &err)) << err;
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(FindNode(t, r, "ag world")->bytes, input ? 4000u : 1000u) << r;
      EXPECT_EQ(FindNode(t, r, "ag pair")->bytes, input ? 2000u : 1000u) << r;
      EXPECT_EQ(FindNode(t, r, "ar")->bytes, 1000u);
      EXPECT_EQ(FindNode(t, r, "rs")->bytes, 1000u);
      EXPECT_EQ(FindNode(t, r, "a2a")->bytes, 1000u);
    }
  }
}

TEST_F(ChakraTest, AllGatherWhoseOutputOverflowsIsRefused) {
  std::vector<Rank> ranks(4);
  // Each rank's input within the bound, the gathered output over it (limits::kMaxBytes = 2^50).
  for (auto& r : ranks) r.Coll(7, "huge", et::ALL_GATHER, int64_t{1} << 49, "");
  WriteRanks(ranks);
  EXPECT_NE(ImportError().find("t.0.et: node 7 'huge': comm_size 562949953421312 x 4 ranks (the all-gather's "
                               "output) is over 1125899906842624 bytes"),
            std::string::npos)
      << ImportError();
  // A comm_size over the bound itself is refused where it is read.
  ranks.assign(4, Rank{});
  for (auto& r : ranks) r.Coll(7, "huge", et::ALL_GATHER, int64_t{1} << 62, "");
  WriteRanks(ranks);
  EXPECT_NE(ImportError().find("comm_size 4611686018427387904 is outside 0..1125899906842624"), std::string::npos)
      << ImportError();
}

TEST_F(ChakraTest, ProcessGroupTableFromPyTorchMetadataNode) {
  // PyTorch's ET carries its process groups in a METADATA node; ASTRA-sim reads the same table.
  const std::string table =
      R"(['[{"pg_name": "0", "pg_desc": "default_pg", "ranks": []}, )"
      R"({"pg_name": "5", "pg_desc": "TENSOR_MODEL_PARALLEL", "ranks": [2, 3]}]'])";
  std::vector<Rank> ranks(4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].Add(0, "## process_group:init ##", et::METADATA_NODE).mutable_inputs()->set_values(table);
    ranks[r].Comp(1, "fwd", 10, {0});
    if (r >= 2) ranks[r].Coll(2, "tp", et::REDUCE_SCATTER, 8192, "5", {1});
    ranks[r].Coll(3, "dp", et::ALL_REDUCE, 1024, "0", {1});
  }
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  EXPECT_EQ(CommOf(t, 2, *FindNode(t, 2, "tp")).desc, "TENSOR_MODEL_PARALLEL");
  EXPECT_EQ(CommOf(t, 2, *FindNode(t, 2, "tp")).ranks, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(CommOf(t, 0, *FindNode(t, 0, "dp")).desc, "default_pg");
  EXPECT_EQ(CommOf(t, 0, *FindNode(t, 0, "dp")).ranks.size(), 4u);
  EXPECT_EQ(s.not_represented.at("METADATA_NODE (process-group table, used for communicators)"), 4u);
}

TEST_F(ChakraTest, UnrepresentableCollectivesAreCountedAndDependenciesKept) {
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) {
    r.Comp(0, "a", 10);
    r.Coll(1, "gather", et::GATHER, 64, "", {0});
    r.Comp(2, "b", 10, {1});
    r.Add(3, "store", et::MEM_STORE_NODE, {2}).set_duration_micros(7);
    r.Coll(4, "ar", et::ALL_REDUCE, 64, "", {3});
  }
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  EXPECT_EQ(s.not_represented,
            (std::map<std::string, uint64_t>{{"COMM_COLL_NODE GATHER", 2}, {"MEM_STORE_NODE", 2}}));
  EXPECT_EQ(s.not_represented_us, 14.0);
  const trace::Node* a = FindNode(t, 0, "a");
  const trace::Node* b = FindNode(t, 0, "b");
  // b waited on a through the gather: same stream, so stream order carries it; ar waits on b through the store.
  EXPECT_EQ(FindNode(t, 0, "ar")->after, (std::vector<uint32_t>{b->id}));
  EXPECT_LT(a->id, b->id);
}

TEST_F(ChakraTest, TagOrderUnlikeIssueOrderGetsOneCommunicatorPerTag) {
  // ASTRA-sim pairs messages by (src, dst, tag, size): rank 1 receives tag 2 first. Prism pairs in order
  // per communicator, so each (tag, size) gets its own.
  std::vector<Rank> ranks(2);
  ranks[0].P2p(true, 0, "s1", 0, 1, 1, 100);
  ranks[0].P2p(true, 1, "s2", 0, 1, 2, 200, {0});
  ranks[1].P2p(false, 0, "r2", 0, 1, 2, 200);
  ranks[1].P2p(false, 1, "r1", 0, 1, 1, 100, {0});
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  EXPECT_EQ(t.comms.size(), 2u);
  EXPECT_EQ(CommOf(t, 0, *FindNode(t, 0, "s1")).id, CommOf(t, 1, *FindNode(t, 1, "r1")).id);
  EXPECT_EQ(CommOf(t, 0, *FindNode(t, 0, "s2")).id, CommOf(t, 1, *FindNode(t, 1, "r2")).id);
  EXPECT_NE(CommOf(t, 0, *FindNode(t, 0, "s1")).id, CommOf(t, 0, *FindNode(t, 0, "s2")).id);
}

TEST_F(ChakraTest, P2pWithoutPeerIsReportedNotGuessed) {
  // PyTorch-converted traces carry only comm_size (and pg_name) on p2p nodes.
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) {
    et::Node& n = r.Add(0, "send?", et::COMM_SEND_NODE);
    *n.add_attr() = chakra::MakeIntAttr("comm_size", 16);
    r.Comp(1, "after", 3, {0});
  }
  WriteRanks(ranks);
  trace::Trace t;
  chakra::ImportSummary s;
  std::string err;
  ASSERT_TRUE(Import(&t, &s, &err)) << err;
  EXPECT_EQ(s.not_represented.at("COMM_SEND_NODE without comm_dst"), 2u);
}

// ---------------------------------------------------------------------------------------------------------
// Bad input: every message names the file and, where there is one, the node.

TEST_F(ChakraTest, DanglingDependency) {
  std::vector<Rank> ranks(1);
  ranks[0].Comp(5, "x", 1, {99});
  WriteRanks(ranks);
  EXPECT_NE(ImportError().find("t.0.et: node 5 'x': data_dep 99 names no node in the file"), std::string::npos);
}

TEST_F(ChakraTest, DependencyCycle) {
  std::vector<Rank> ranks(1);
  ranks[0].Comp(1, "a", 1, {2});
  ranks[0].Comp(2, "b", 1, {1});
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("t.0.et: node 1 'a': dependency cycle"), std::string::npos) << e;
}

TEST_F(ChakraTest, DuplicateNodeId) {
  std::vector<Rank> ranks(1);
  ranks[0].Comp(3, "a", 1);
  ranks[0].Comp(3, "b", 1);
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("t.0.et: node 3 'b': id used twice"), std::string::npos) << e;
}

TEST_F(ChakraTest, UnknownProcessGroup) {
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) r.Coll(0, "ar", et::ALL_REDUCE, 8, "9");
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("t.0.et: node 0 'ar': process group \"9\" is not defined (no comm-group file; pass --comm-group"),
            std::string::npos)
      << e;
}

TEST_F(ChakraTest, CollectiveWithoutCommType) {
  std::vector<Rank> ranks(1);
  et::Node& n = ranks[0].Add(4, "mystery", et::COMM_COLL_NODE);
  *n.add_attr() = chakra::MakeIntAttr("comm_size", 8);
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("t.0.et: node 4 'mystery' (COMM_COLL_NODE): no comm_type attribute"), std::string::npos) << e;
}

TEST_F(ChakraTest, CommSizeOfTheWrongKind) {
  std::vector<Rank> ranks(1);
  et::Node& n = ranks[0].Add(4, "ar", et::COMM_COLL_NODE);
  *n.add_attr() = chakra::MakeIntAttr("comm_type", et::ALL_REDUCE);
  *n.add_attr() = chakra::MakeStringAttr("comm_size", "1MB");
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("node 4 'ar' (COMM_COLL_NODE): attribute comm_size holds string_val, not an integer"),
            std::string::npos)
      << e;
}

TEST_F(ChakraTest, MembersDisagreeOnACollective) {
  std::vector<Rank> ranks(2);
  ranks[0].Coll(0, "ar", et::ALL_REDUCE, 1024, "");
  ranks[1].Coll(7, "ar", et::ALL_REDUCE, 2048, "");
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("communicator 'world' (2 ranks): members disagree at collective #0: "), std::string::npos) << e;
  EXPECT_NE(e.find("t.0.et: node 0 'ar' allreduce 1024 bytes vs "), std::string::npos) << e;
  EXPECT_NE(e.find("t.1.et: node 7 'ar' allreduce 2048 bytes"), std::string::npos) << e;
}

TEST_F(ChakraTest, MemberMissesACollective) {
  std::vector<Rank> ranks(2);
  ranks[0].Coll(0, "ar0", et::ALL_REDUCE, 64, "");
  ranks[0].Coll(1, "ar1", et::ALL_REDUCE, 64, "", {0});
  ranks[1].Coll(0, "ar0", et::ALL_REDUCE, 64, "");
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("rank 1 ("), std::string::npos) << e;
  EXPECT_NE(e.find("issues 1 collective, rank 0 issues 2; the first without a partner: "), std::string::npos) << e;
  EXPECT_NE(e.find("t.0.et: node 1 'ar1'"), std::string::npos) << e;
}

TEST_F(ChakraTest, SendWithoutReceive) {
  std::vector<Rank> ranks(2);
  ranks[0].P2p(true, 3, "s", 0, 1, 0, 100);
  ranks[1].Comp(0, "idle", 1);
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("t.0.et: node 3 's': rank 0 sends 1 message of 100 bytes with tag 0 to rank 1, which receives 0"),
            std::string::npos)
      << e;
}

TEST_F(ChakraTest, SendIssuedByAnotherRank) {
  std::vector<Rank> ranks(2);
  ranks[1].P2p(true, 3, "s", 0, 1, 0, 100);
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("t.1.et: node 3 's' (COMM_SEND_NODE): comm_src 0 is not this file's rank 1"), std::string::npos)
      << e;
}

TEST_F(ChakraTest, PeerOutsideTheWorld) {
  std::vector<Rank> ranks(2);
  ranks[0].P2p(true, 3, "s", 0, 5, 0, 100);
  WriteRanks(ranks);
  std::string e = ImportError();
  EXPECT_NE(e.find("node 3 's' (COMM_SEND_NODE): comm_dst = 5 is not a rank of this 2-rank trace"), std::string::npos)
      << e;
}

TEST_F(ChakraTest, MissingRankFile) {
  std::vector<Rank> ranks(3);
  WriteRanks(ranks);
  fs::remove(P("t.1.et"));
  std::string e = ImportError();
  EXPECT_NE(e.find(": rank 1 has no file (t.2.et is the next one)"), std::string::npos) << e;
}

TEST_F(ChakraTest, SeveralPrefixesNeedAChoice) {
  std::vector<Rank> ranks(1);
  WriteRanks(ranks, "a");
  WriteRanks(ranks, "b");
  std::string e = ImportError();
  EXPECT_NE(e.find("several trace prefixes (a, b): choose one with --prefix"), std::string::npos) << e;
  chakra::ImportOptions o;
  o.input = P("b");  // ASTRA-sim's way: a path prefix
  trace::Trace t;
  std::string err;
  EXPECT_TRUE(chakra::ImportChakra(o, &t, nullptr, &err)) << err;
}

TEST_F(ChakraTest, BadCommGroupFile) {
  std::vector<Rank> ranks(2);
  WriteRanks(ranks);
  std::ofstream(P("comm_group.json")) << R"({"1": [0, 2]})";
  std::string e = ImportError();
  EXPECT_NE(e.find("comm_group.json: group \"1\": 2 is not a rank of this 2-rank trace"), std::string::npos) << e;
  std::ofstream(P("comm_group.json")) << R"([0, 1])";
  e = ImportError();
  EXPECT_NE(e.find("comm_group.json: must be a JSON object"), std::string::npos) << e;
}

TEST_F(ChakraTest, RankNotInItsGroup) {
  std::vector<Rank> ranks(3);
  for (int r = 0; r < 3; ++r) ranks[r].Coll(0, "ar", et::ALL_REDUCE, 8, "1");
  WriteRanks(ranks);
  std::ofstream(P("comm_group.json")) << R"({"1": [0, 1]})";
  std::string e = ImportError();
  EXPECT_NE(e.find("t.2.et: node 0 'ar': rank 2 is not a member of process group \"1\""), std::string::npos) << e;
}

}  // namespace
