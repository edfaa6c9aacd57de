// PrismTrace reader, writer and validator: round trips and one test per validator error.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace prism::replay {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kExample = std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json";

json LoadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::string TempPath(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("prism_trace_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A two-rank graph: one allreduce and one send/recv pair, edited by each test to break one thing.
json TinyGraph() {
  return json::parse(R"({
    "magic": "PRISMTRACE", "schema_version": 1, "world_size": 2,
    "comms": [{"id": 0, "ranks": [0, 1], "desc": "world"}],
    "classes": [
      {"name": "sender", "comm_slots": ["w"], "streams": [
        {"name": "compute", "nodes": [
          {"id": 0, "kind": "compute", "dur_us": 10},
          {"id": 1, "kind": "coll", "op": "allreduce", "comm": "w", "bytes": 1024, "dtype": "f32"}]},
        {"name": "p2p", "nodes": [
          {"id": 2, "kind": "send", "comm": "w", "peer": 1, "bytes": 64, "dtype": "bf16", "after": [0]}]}]},
      {"name": "receiver", "comm_slots": ["w"], "streams": [
        {"name": "compute", "nodes": [
          {"id": 0, "kind": "compute", "dur_us": 10},
          {"id": 1, "kind": "coll", "op": "allreduce", "comm": "w", "bytes": 1024, "dtype": "f32"}]},
        {"name": "p2p", "nodes": [
          {"id": 2, "kind": "recv", "comm": "w", "peer": 0, "bytes": 64, "dtype": "bf16"}]}]}],
    "rank_class": [{"class": 0, "comms": [0]}, {"class": 1, "comms": [0]}]
  })");
}

// Parses and validates; returns "" when valid, else the first error.
std::string FirstError(const json& j) {
  trace::Trace t;
  std::string err;
  if (!TraceFromJson(j, &t, &err)) return err;
  auto errors = ValidateTrace(t);
  return errors.empty() ? "" : errors.front();
}

TEST(TraceFormat, ExampleGraphIsValid) {
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(ReadTrace(kExample, &t, &err)) << err;
  EXPECT_EQ(t.world_size, 8);
  EXPECT_EQ(t.classes.size(), 2u);
  EXPECT_EQ(t.ranks.size(), 8u);
  EXPECT_EQ(t.layout.tp, 2);
}

TEST(TraceFormat, TinyGraphIsValid) { EXPECT_EQ(FirstError(TinyGraph()), ""); }

TEST(TraceFormat, CborJsonRoundTrip) {
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(ReadTrace(kExample, &t, &err)) << err;
  std::string cbor = TempPath("rt.prism"), js = TempPath("rt.prism.json");
  ASSERT_TRUE(WriteTrace(t, cbor, &err)) << err;
  ASSERT_TRUE(WriteTrace(t, js, &err)) << err;
  // The CBOR file really is CBOR (not JSON text) and smaller.
  std::ifstream in(cbor, std::ios::binary);
  char first = 0;
  in.get(first);
  EXPECT_NE(first, '{');
  EXPECT_LT(fs::file_size(cbor), fs::file_size(js));
  trace::Trace a, b;
  ASSERT_TRUE(ReadTrace(cbor, &a, &err)) << err;
  ASSERT_TRUE(ReadTrace(js, &b, &err)) << err;
  EXPECT_EQ(TraceToJson(a), TraceToJson(t));
  EXPECT_EQ(TraceToJson(b), TraceToJson(t));
  // And the JSON form of the original file survives unchanged in meaning.
  trace::Trace orig;
  ASSERT_TRUE(TraceFromJson(LoadJson(kExample), &orig, &err)) << err;
  EXPECT_EQ(TraceToJson(orig), TraceToJson(t));
}

TEST(TraceFormat, TruncatedCborIsRejected) {
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(ReadTrace(kExample, &t, &err)) << err;
  std::string path = TempPath("trunc.prism");
  ASSERT_TRUE(WriteTrace(t, path, &err));
  fs::resize_file(path, fs::file_size(path) / 2);
  EXPECT_FALSE(ReadTrace(path, &t, &err));
  // The shape scan sees the cut first: a length that runs past the end of the file.
  EXPECT_NE(err.find(": CBOR "), std::string::npos) << err;
  EXPECT_NE(err.find("remain"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
}

TEST(TraceFormat, TruncatedJsonIsRejected) {
  std::string path = TempPath("trunc.prism.json");
  std::string text = TinyGraph().dump();
  WriteText(path, text.substr(0, text.size() / 2));
  trace::Trace t;
  std::string err;
  EXPECT_FALSE(ReadTrace(path, &t, &err));
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
}

TEST(TraceFormat, EmptyAndMissingFiles) {
  trace::Trace t;
  std::string err;
  EXPECT_FALSE(ReadTrace(TempPath("does-not-exist.prism"), &t, &err));
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
  std::string empty = TempPath("empty.prism");
  WriteText(empty, "");
  EXPECT_FALSE(ReadTrace(empty, &t, &err));
  EXPECT_NE(err.find("empty"), std::string::npos) << err;
}

TEST(TraceFormat, WrongMagic) {
  json j = TinyGraph();
  j["magic"] = "CHAKRA";
  EXPECT_NE(FirstError(j).find("wrong magic"), std::string::npos);
}

TEST(TraceFormat, WrongVersion) {
  json j = TinyGraph();
  j["schema_version"] = 99;
  EXPECT_NE(FirstError(j).find("schema_version 99 is not supported"), std::string::npos);
}

TEST(TraceFormat, UnknownEnumNamesThePlace) {
  json j = TinyGraph();
  j["classes"][1]["streams"][0]["nodes"][1]["op"] = "allreduse";
  std::string e = FirstError(j);
  EXPECT_NE(e.find("unknown op \"allreduse\""), std::string::npos) << e;
  EXPECT_NE(e.find("'receiver'"), std::string::npos) << e;
  EXPECT_NE(e.find("stream 'compute'"), std::string::npos) << e;
  EXPECT_NE(e.find("node[1]"), std::string::npos) << e;

  json k = TinyGraph();
  k["classes"][0]["streams"][0]["nodes"][0]["kind"] = "comptue";
  EXPECT_NE(FirstError(k).find("unknown kind \"comptue\""), std::string::npos);
  json d = TinyGraph();
  d["classes"][0]["streams"][1]["nodes"][0]["dtype"] = "f17";
  EXPECT_NE(FirstError(d).find("unknown dtype \"f17\""), std::string::npos);
}

TEST(TraceFormat, SendCompletionIsOptionalAndChecked) {
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(TraceFromJson(TinyGraph(), &t, &err)) << err;
  EXPECT_EQ(t.send_completion, trace::SendCompletion::kInvalid);  // absent
  EXPECT_FALSE(TraceToJson(t).contains("send_completion"));
  for (const char* v : {"rendezvous", "eager", "nccl"}) {
    json j = TinyGraph();
    j[std::string(trace::kSendCompletionKey)] = v;
    ASSERT_TRUE(TraceFromJson(j, &t, &err)) << err;
    EXPECT_EQ(trace::ToString(t.send_completion), v);
    EXPECT_EQ(TraceToJson(t).at("send_completion"), v);
  }
  json bad = TinyGraph();
  bad["send_completion"] = "lazy";
  EXPECT_NE(FirstError(bad).find("trace: unknown send_completion \"lazy\""), std::string::npos) << FirstError(bad);
  bad["send_completion"] = 3;
  EXPECT_NE(FirstError(bad).find("send_completion"), std::string::npos) << FirstError(bad);
}

TEST(TraceFormat, DanglingAfter) {
  json j = TinyGraph();
  j["classes"][0]["streams"][1]["nodes"][0]["after"] = {42};
  std::string e = FirstError(j);
  EXPECT_NE(e.find("dangling \"after\" 42"), std::string::npos) << e;
  EXPECT_NE(e.find("class 'sender' stream 'p2p' node 2"), std::string::npos) << e;
}

TEST(TraceFormat, CommRankOutsideWorld) {
  json j = TinyGraph();
  j["comms"][0]["ranks"] = {0, 5};
  std::string e = FirstError(j);
  EXPECT_NE(e.find("member rank 5 is outside the world (size 2)"), std::string::npos) << e;
}

TEST(TraceFormat, RankNotInItsComm) {
  json j = TinyGraph();
  j["world_size"] = 3;
  j["rank_class"].push_back({{"class", 1}, {"comms", {0}}});
  std::string e = FirstError(j);
  EXPECT_NE(e.find("rank 2: slot 'w' bound to comm 0 which does not contain rank 2"), std::string::npos) << e;
}

TEST(TraceFormat, CollectiveMembersDisagree) {
  json j = TinyGraph();
  j["classes"][1]["streams"][0]["nodes"][1]["bytes"] = 2048;
  std::string e = FirstError(j);
  EXPECT_NE(e.find("members disagree at sequence 0 (bytes 1024 vs 2048)"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 class 'receiver' stream 'compute' node 1"), std::string::npos) << e;

  json op = TinyGraph();
  op["classes"][1]["streams"][0]["nodes"][1]["op"] = "allgather";
  EXPECT_NE(FirstError(op).find("op allreduce vs allgather"), std::string::npos);

  json extra = TinyGraph();
  extra["classes"][0]["streams"][0]["nodes"].push_back(
      {{"id", 7}, {"kind", "coll"}, {"op", "barrier"}, {"comm", "w"}, {"dtype", "u8"}});
  EXPECT_NE(FirstError(extra).find("issues 2 collectives but rank 1 only 1"), std::string::npos);
}

TEST(TraceFormat, UnmatchedSendRecv) {
  json j = TinyGraph();
  j["classes"][1]["streams"][1]["nodes"] = json::array();
  std::string e = FirstError(j);
  EXPECT_NE(e.find("unmatched send"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 sends 1 messages to rank 1 on comm 0, which posts 0 receives"), std::string::npos) << e;

  json size = TinyGraph();
  size["classes"][1]["streams"][1]["nodes"][0]["bytes"] = 65;
  EXPECT_NE(FirstError(size).find("p2p size mismatch"), std::string::npos);
}

TEST(TraceFormat, PeerOutsideComm) {
  json j = TinyGraph();
  j["classes"][0]["streams"][1]["nodes"][0]["peer"] = 3;
  EXPECT_NE(FirstError(j).find("peer 3 is outside comm 0"), std::string::npos);
}

TEST(TraceFormat, LayoutMustCoverWorld) {
  json j = TinyGraph();
  j["layout"] = {{"tp", 4}};
  EXPECT_NE(FirstError(j).find("but world_size is 2"), std::string::npos);
}

TEST(TraceFormat, CollectivesOfOneCommMaySpanStreams) {
  // torch issues blocking collectives on the caller's current stream: one communicator on two streams is legal and
  // sequenced by node id (docs/trace-format.md).
  json j = TinyGraph();
  for (int c = 0; c < 2; ++c) {
    j["classes"][c]["streams"][1]["nodes"].push_back(
        {{"id", 9}, {"kind", "coll"}, {"op", "barrier"}, {"comm", "w"}, {"dtype", "u8"}});
  }
  EXPECT_EQ(FirstError(j), "");
}

}  // namespace
}  // namespace prism::replay
