// The streaming trace reader (ReadTraceUnchecked, trace_sax.cc) against the document reader
// (ReadTraceUncheckedDom): the same trace::Trace for every graph in tests/data and examples/ and for synthesized
// ones, as JSON and as CBOR; the same message for broken graphs, truncated files and flipped bytes; its own
// limits (nesting depth, declared counts) refuse what they must.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "replay/synth.h"
#include "replay/trace_io.h"

namespace prism::replay {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string TempPath(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("prism_trace_sax_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Cbor(const json& j) {
  std::vector<uint8_t> b = json::to_cbor(j);
  return std::string(b.begin(), b.end());
}

// Field by field, so that a field TraceToJson leaves out still counts.
void ExpectSameTrace(const trace::Trace& a, const trace::Trace& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.layout.tp, b.layout.tp);
  EXPECT_EQ(a.layout.pp, b.layout.pp);
  EXPECT_EQ(a.layout.dp, b.layout.dp);
  EXPECT_EQ(a.layout.cp, b.layout.cp);
  EXPECT_EQ(a.layout.ep, b.layout.ep);
  EXPECT_EQ(a.layout.etp, b.layout.etp);
  EXPECT_EQ(a.layout.order, b.layout.order);
  EXPECT_EQ(a.topology, b.topology);
  EXPECT_EQ(a.send_completion, b.send_completion);
  ASSERT_EQ(a.comms.size(), b.comms.size());
  for (size_t i = 0; i < a.comms.size(); ++i) {
    EXPECT_EQ(a.comms[i].id, b.comms[i].id);
    EXPECT_EQ(a.comms[i].ranks, b.comms[i].ranks);
    EXPECT_EQ(a.comms[i].desc, b.comms[i].desc);
  }
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    EXPECT_EQ(a.ranks[r].cls, b.ranks[r].cls);
    EXPECT_EQ(a.ranks[r].comms, b.ranks[r].comms);
  }
  ASSERT_EQ(a.classes.size(), b.classes.size());
  for (size_t c = 0; c < a.classes.size(); ++c) {
    const auto& x = a.classes[c];
    const auto& y = b.classes[c];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.comm_slots, y.comm_slots);
    ASSERT_EQ(x.streams.size(), y.streams.size());
    for (size_t s = 0; s < x.streams.size(); ++s) {
      EXPECT_EQ(x.streams[s].name, y.streams[s].name);
      ASSERT_EQ(x.streams[s].nodes.size(), y.streams[s].nodes.size());
      for (size_t i = 0; i < x.streams[s].nodes.size(); ++i) {
        const trace::Node& n = x.streams[s].nodes[i];
        const trace::Node& m = y.streams[s].nodes[i];
        const bool same = n.id == m.id && n.kind == m.kind && n.op == m.op && n.comm_slot == m.comm_slot &&
                          n.peer == m.peer && n.root == m.root && n.bytes == m.bytes && n.dtype == m.dtype &&
                          (n.dur_us == m.dur_us || (n.dur_us != n.dur_us && m.dur_us != m.dur_us)) &&
                          n.iter == m.iter && n.after == m.after && n.name == m.name;
        ASSERT_TRUE(same) << "class " << c << " stream " << s << " node " << i;
      }
    }
  }
}

// Reads `bytes` with both readers; both succeed with the same trace or both fail with the same message.
void ExpectSameRead(const std::string& bytes, const std::string& what) {
  const std::string path = TempPath("g.bin");
  WriteBytes(path, bytes);
  trace::Trace dom, sax;
  std::string dom_err, sax_err;
  const bool dom_ok = ReadTraceUncheckedDom(path, &dom, &dom_err);
  const bool sax_ok = ReadTraceUnchecked(path, &sax, &sax_err);
  ASSERT_EQ(dom_ok, sax_ok) << what << ": document reader: " << (dom_ok ? "ok" : dom_err)
                            << "; streaming reader: " << (sax_ok ? "ok" : sax_err);
  if (dom_ok) {
    ExpectSameTrace(dom, sax, what);
  } else {
    EXPECT_EQ(dom_err, sax_err) << what;
  }
}

std::vector<std::string> GraphFiles() {
  std::vector<std::string> out;
  for (const char* dir : {"/tests/data", "/examples"}) {
    for (const auto& e : fs::recursive_directory_iterator(std::string(PRISM_SOURCE_DIR) + dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file()) continue;
      const bool prism = name.size() > 6 && name.compare(name.size() - 6, 6, ".prism") == 0;
      const bool prism_json = name.find(".prism.json") != std::string::npos;
      if (prism || prism_json) out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

json DocumentOf(const std::string& path) {
  const std::string bytes = ReadBytes(path);
  return bytes.find_first_not_of(" \t\r\n") != std::string::npos && bytes[bytes.find_first_not_of(" \t\r\n")] == '{'
             ? json::parse(bytes)
             : json::from_cbor(bytes);
}

TEST(TraceSax, SameTraceForEveryGraphInTheRepositoryAsJsonAndCbor) {
  const std::vector<std::string> files = GraphFiles();
  ASSERT_GE(files.size(), 3u);
  for (const std::string& f : files) {
    ExpectSameRead(ReadBytes(f), f);
    const json j = DocumentOf(f);
    ExpectSameRead(j.dump(1), f + " as JSON");
    ExpectSameRead(Cbor(j), f + " as CBOR");
    // The streaming reader really streams these (no fall-back to the document reader).
    trace::Trace t;
    std::string err;
    EXPECT_EQ(TraceFromBytesSax(Cbor(j), false, &t, &err), SaxResult::kOk) << f << ": " << err;
  }
}

TEST(TraceSax, SameTraceForSynthesizedGraphs) {
  std::vector<SynthOptions> cases(4);
  cases[0].tp = 2, cases[0].pp = 2, cases[0].dp = 2;
  cases[1].tp = 2, cases[1].pp = 4, cases[1].dp = 2, cases[1].tp_comm = true;
  cases[2].tp = 1, cases[2].pp = 4, cases[2].dp = 2, cases[2].vpp = 2, cases[2].microbatches = 8;
  cases[3].tp = 2, cases[3].pp = 2, cases[3].dp = 4, cases[3].ep = 2, cases[3].iterations = 2;
  for (size_t i = 0; i < cases.size(); ++i) {
    trace::Trace t;
    std::string err;
    ASSERT_TRUE(Synthesize(cases[i], &t, &err)) << err;
    const json j = TraceToJson(t);
    ExpectSameRead(Cbor(j), "synth case " + std::to_string(i) + " CBOR");
    ExpectSameRead(j.dump(), "synth case " + std::to_string(i) + " JSON");
  }
}

json Tiny() {
  return json::parse(R"({
    "magic": "PRISMTRACE", "schema_version": 1, "world_size": 2,
    "layout": {"tp": 1, "pp": 1, "dp": 2}, "topology": {"name": "x", "nodes": [{"gpus": 8}]},
    "comms": [{"id": 0, "ranks": [0, 1], "desc": "world"}],
    "classes": [{"name": "c", "comm_slots": ["w"], "streams": [
      {"name": "compute", "nodes": [{"kind": "compute", "dur_us": 5, "name": "f"},
                                    {"kind": "coll", "op": "allreduce", "comm": "w", "bytes": 1024, "after": [0]}]},
      {"name": "pp", "nodes": [{"id": 7, "kind": "compute", "dur_us": 1.5, "iter": 1}]}]}],
    "rank_class": [{"class": 0, "comms": [0]}, {"class": 0, "comms": [0]}]
  })");
}

TEST(TraceSax, SameMessageForEachBrokenElement) {
  struct Edit {
    const char* what;
    std::function<void(json&)> apply;
  };
  const std::vector<Edit> edits = {
      {"no magic", [](json& j) { j.erase("magic"); }},
      {"version 2", [](json& j) { j["schema_version"] = 2; }},
      {"version a string", [](json& j) { j["schema_version"] = "1"; }},
      {"world_size missing", [](json& j) { j.erase("world_size"); }},
      {"layout an array", [](json& j) { j["layout"] = json::array(); }},
      {"layout.tp a string", [](json& j) { j["layout"]["tp"] = "2"; }},
      {"topology a number", [](json& j) { j["topology"] = 3; }},
      {"send_completion unknown", [](json& j) { j["send_completion"] = "soon"; }},
      {"comms an object", [](json& j) { j["comms"] = json::object(); }},
      {"comms[0] a number", [](json& j) { j["comms"][0] = 1; }},
      {"comms[0].ranks a string", [](json& j) { j["comms"][0]["ranks"] = "0,1"; }},
      {"comms[0].ranks holds a string", [](json& j) { j["comms"][0]["ranks"][1] = "1"; }},
      {"classes missing", [](json& j) { j.erase("classes"); }},
      {"classes null", [](json& j) { j["classes"] = nullptr; }},
      {"classes[0] a string", [](json& j) { j["classes"][0] = "c"; }},
      {"class name a number", [](json& j) { j["classes"][0]["name"] = 3; }},
      {"comm_slots a string", [](json& j) { j["classes"][0]["comm_slots"] = "w"; }},
      {"comm_slots holds a number", [](json& j) { j["classes"][0]["comm_slots"][0] = 1; }},
      {"duplicate comm slot", [](json& j) { j["classes"][0]["comm_slots"].push_back("w"); }},
      {"streams missing", [](json& j) { j["classes"][0].erase("streams"); }},
      {"streams an object", [](json& j) { j["classes"][0]["streams"] = json::object(); }},
      {"stream a number", [](json& j) { j["classes"][0]["streams"][1] = 4; }},
      {"stream name a number", [](json& j) { j["classes"][0]["streams"][1]["name"] = 4; }},
      {"nodes missing", [](json& j) { j["classes"][0]["streams"][1].erase("nodes"); }},
      {"nodes a string", [](json& j) { j["classes"][0]["streams"][0]["nodes"] = "x"; }},
      {"node an array", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1] = json::array({1}); }},
      {"kind unknown", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0]["kind"] = "comptue"; }},
      {"kind missing", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0].erase("kind"); }},
      {"kind an object", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0]["kind"] = json::object(); }},
      {"dur_us a string", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0]["dur_us"] = "5"; }},
      {"compute without dur_us", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0].erase("dur_us"); }},
      {"after an object", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["after"] = json::object(); }},
      {"after negative", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["after"][0] = -1; }},
      {"after a float", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["after"][0] = 0.5; }},
      {"comm slot unknown", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["comm"] = "tp"; }},
      {"op unknown", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["op"] = "allreduse"; }},
      {"dtype unknown", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["dtype"] = "f12"; }},
      {"bytes a bool", [](json& j) { j["classes"][0]["streams"][0]["nodes"][1]["bytes"] = true; }},
      {"id negative", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0]["id"] = -3; }},
      {"name null", [](json& j) { j["classes"][0]["streams"][0]["nodes"][0]["name"] = nullptr; }},
      {"unknown keys", [](json& j) {
         j["extra"] = {{"deep", {{"deeper", json::array({1, 2, {{"x", nullptr}}})}}}};
         j["classes"][0]["streams"][0]["nodes"][0]["note"] = {{"a", 1}};
         j["classes"][0]["x"] = json::array();
       }},
      {"send without peer", [](json& j) {
         j["classes"][0]["streams"][0]["nodes"][1] = {{"kind", "send"}, {"comm", "w"}, {"bytes", 8}};
       }},
      {"rank_class missing", [](json& j) { j.erase("rank_class"); }},
      {"rank_class[1] a string", [](json& j) { j["rank_class"][1] = "0"; }},
      {"rank_class[1] an integer", [](json& j) { j["rank_class"][1] = 0; }},
      {"rank_class[0].comms a string", [](json& j) { j["rank_class"][0]["comms"] = "0"; }},
      {"two errors: magic and a node", [](json& j) {
         j["magic"] = "X";
         j["classes"][0]["streams"][0]["nodes"][0]["kind"] = "x";
       }},
      {"two errors: comms and classes", [](json& j) {
         j["comms"][0]["ranks"] = 1;
         j["classes"][0]["comm_slots"] = 2;
       }},
      {"top level an array", [](json& j) { j = json::array({1, 2}); }},
      {"top level a number", [](json& j) { j = 7; }},
  };
  ExpectSameRead(Cbor(Tiny()), "unedited");
  for (const Edit& e : edits) {
    json j = Tiny();
    e.apply(j);
    ExpectSameRead(Cbor(j), std::string(e.what) + " (CBOR)");
    ExpectSameRead(j.dump(), std::string(e.what) + " (JSON)");
  }
}

// Keys in orders nlohmann never writes: a class's streams before its name and comm_slots, a stream's nodes
// before its name, repeated keys. The streaming reader parses such a class or stream as a document, or hands
// the file to the document reader; the result is the same.
TEST(TraceSax, KeysInAnyOrderAndRepeatedKeys) {
  const std::string base = R"({"world_size": 2, "rank_class": [{"comms": [0], "class": 0}, {"class": 0, "comms": [0]}],
    "comms": [{"ranks": [0, 1], "id": 0}], "schema_version": 1, "magic": "PRISMTRACE", "classes": [
    {"streams": [{"nodes": [{"kind": "compute", "dur_us": 1}], "name": "compute"}], "name": "late", "comm_slots": ["w"]},
    {"comm_slots": ["w"], "name": "ok", "streams": [{"nodes": [{"kind": "coll", "op": "barrier", "comm": "w"}], "name": "s"},
                                                    {"name": "t", "nodes": [{"kind": "compute", "dur_us": 2}]}]}]})";
  ExpectSameRead(base, "streams before name");
  trace::Trace t;
  std::string err;
  EXPECT_EQ(TraceFromBytesSax(base, true, &t, &err), SaxResult::kOk) << err;
  EXPECT_EQ(t.classes[0].name, "late");
  EXPECT_EQ(t.classes[1].streams[0].name, "s");

  const std::string repeated = R"({"magic": "PRISMTRACE", "schema_version": 1, "world_size": 1, "rank_class": [0],
    "classes": [{"comm_slots": [], "name": "a", "streams": [{"name": "s", "nodes": [{"kind": "compute"}]}],
                 "name": "b"}]})";
  ExpectSameRead(repeated, "class name repeated after its streams");
  EXPECT_EQ(TraceFromBytesSax(repeated, true, &t, &err), SaxResult::kIrregular);

  const std::string twice = R"({"magic": "PRISMTRACE", "schema_version": 1, "world_size": 1, "rank_class": [0],
    "classes": [{"name": "bad"}], "classes": [{"comm_slots": [], "name": "a", "streams": []}], "rank_class": [0]})";
  ExpectSameRead(twice, "classes repeated: the last one counts");
  ExpectSameRead(R"({"magic": "PRISMTRACE", "magic": "NOPE", "schema_version": 1})", "magic repeated");
}

TEST(TraceSax, SameOutcomeForTruncatedAndCorruptedFiles) {
  SynthOptions o;
  o.tp = 2, o.pp = 2, o.dp = 2, o.microbatches = 2;
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(Synthesize(o, &t, &err)) << err;
  const json j = TraceToJson(t);
  for (const std::string& bytes : {Cbor(j), j.dump()}) {
    for (size_t cut = 1; cut < bytes.size(); cut += std::max<size_t>(1, bytes.size() / 97)) {
      ExpectSameRead(bytes.substr(0, cut), "cut at " + std::to_string(cut));
    }
    std::mt19937 rng(26);
    for (int k = 0; k < 300; ++k) {
      std::string b = bytes;
      const size_t at = rng() % b.size();
      b[at] = static_cast<char>(rng() & 0xff);
      ExpectSameRead(b, "byte " + std::to_string(at) + " flipped");
    }
  }
}

TEST(TraceSax, RefusesNestingDeeperThanItsLimit) {
  json deep = Tiny();
  json* p = &deep["extra"];
  for (int i = 0; i < kSaxMaxDepth + 5; ++i) {
    (*p)["x"] = json::object();
    p = &(*p)["x"];
  }
  trace::Trace t;
  std::string err;
  EXPECT_EQ(TraceFromBytesSax(Cbor(deep), false, &t, &err), SaxResult::kError);
  EXPECT_EQ(err, "nesting deeper than " + std::to_string(kSaxMaxDepth) + " levels");
  json shallow = Tiny();
  p = &shallow["extra"];
  for (int i = 0; i < kSaxMaxDepth - 4; ++i) {
    (*p)["x"] = json::object();
    p = &(*p)["x"];
  }
  EXPECT_EQ(TraceFromBytesSax(Cbor(shallow), false, &t, &err), SaxResult::kOk) << err;
}

TEST(TraceSax, RefusesADeclaredCountLargerThanTheBytesLeft) {
  // A CBOR map whose "nodes" array (0x9b: 8-byte count) claims 2^40 elements in a file of a few hundred bytes:
  // refused as truncated before anything is reserved for it.
  json j = Tiny();
  j["classes"][0]["streams"][1]["nodes"] = json::array();
  std::string bytes = Cbor(j);
  const std::string empty_nodes = std::string("\x65nodes", 6) + std::string("\x80", 1);
  const size_t at = bytes.find(empty_nodes);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + 6, 1, std::string("\x9b\x00\x00\x01\x00\x00\x00\x00\x00", 9));
  trace::Trace t;
  std::string err;
  EXPECT_EQ(TraceFromBytesSax(bytes, false, &t, &err), SaxResult::kError);
  EXPECT_EQ(err, "not valid CBOR (truncated or not a PrismTrace)");
  ExpectSameRead(bytes, "huge declared count");
}

}  // namespace
}  // namespace prism::replay
