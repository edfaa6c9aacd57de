// Flight Recorder dumps (coordinator/hang/flight_recorder.h): a dump survives pickling; prism's dumps from the
// coordinator's operation log have torch's fields; production-like dumps (built here, and written by CPython's pickle
// from the format's description when python3 is present) give the diagnosis and the ranks to run for real: a rank
// that skipped a collective, a missing dump, a p2p send/send deadlock; and `prism-run status --flight-recorder`.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "coordinator/hang/flight_recorder.h"

namespace prism::coord {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr uint64_t kSec = 1'000'000'000ull;

fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("prism-fr-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

FrEntry Coll(int64_t id, const std::string& pg, const std::string& desc, int64_t seq, const std::string& name,
             int64_t in, int64_t out, const std::string& dtype, bool done, int64_t t) {
  FrEntry e;
  e.record_id = id;
  e.op_id = id + 1;
  e.pg_name = pg;
  e.pg_desc = desc;
  e.collective_seq_id = seq;
  e.profiling_name = name;
  e.time_created_ns = t;
  e.input_sizes = {{in}};
  e.output_sizes = {{out}};
  e.input_dtypes = {dtype};
  e.output_dtypes = {dtype};
  e.state = done ? "completed" : "started";
  e.time_started_ns = t;
  if (done) {
    e.time_completed_ns = t + 1000;
    e.retired = true;
    e.duration_ms = 0.001;
  }
  return e;
}

// World 8, one group: every rank does three all_reduces; at the fourth, rank 5 has skipped it and issues the
// all_gather that comes next in its program.
std::vector<FrDump> SkippedAllReduce() {
  std::vector<FrDump> dumps;
  for (int r = 0; r < 8; ++r) {
    FrDump d;
    d.rank = r;
    d.pg_config["0"] = FrGroup{"0", "default_pg", {0, 1, 2, 3, 4, 5, 6, 7}};
    for (int64_t s = 1; s <= 3; ++s) {
      d.entries.push_back(Coll(s - 1, "0", "default_pg", s, "nccl:all_reduce", 1 << 19, 1 << 19, "BFloat16", true,
                               static_cast<int64_t>(s * kSec)));
    }
    if (r == 5) {
      d.entries.push_back(Coll(3, "0", "default_pg", 4, "nccl:_all_gather_base", 256, 2048, "BFloat16", false,
                               static_cast<int64_t>(4 * kSec)));
    } else {
      d.entries.push_back(Coll(3, "0", "default_pg", 4, "nccl:all_reduce", 1 << 19, 1 << 19, "BFloat16", false,
                               static_cast<int64_t>(4 * kSec)));
    }
    dumps.push_back(std::move(d));
  }
  return dumps;
}

TEST(FlightRecorder, DumpSurvivesPickling) {
  FrDump d = SkippedAllReduce()[5];
  d.pg_status["0"] = {4, 4, 3};
  d.from_prism = true;
  d.world_size = 8;
  d.real_ranks = {0, 5};
  std::string bytes = pickle::Dumps(*FrDumpToPickle(d));
  std::string err;
  pickle::ValuePtr v = pickle::Loads(bytes, &err);
  ASSERT_TRUE(v) << err;
  auto back = FrDumpFromPickle(*v, &err);
  ASSERT_TRUE(back) << err;
  EXPECT_EQ(back->version, "2.10");
  EXPECT_EQ(back->pg_config.at("0").ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(back->pg_config.at("0").desc, "default_pg");
  EXPECT_EQ(back->pg_status.at("0")[2], 3);
  ASSERT_EQ(back->entries.size(), 4u);
  const FrEntry& e = back->entries[3];
  EXPECT_EQ(e.profiling_name, "nccl:_all_gather_base");
  EXPECT_EQ(e.collective_seq_id, 4);
  EXPECT_EQ(e.pg_name, "0");
  EXPECT_EQ(e.input_sizes, (std::vector<std::vector<int64_t>>{{256}}));
  EXPECT_EQ(e.output_sizes, (std::vector<std::vector<int64_t>>{{2048}}));
  EXPECT_EQ(e.input_dtypes, std::vector<std::string>{"BFloat16"});
  EXPECT_EQ(e.state, "started");
  EXPECT_FALSE(e.time_completed_ns.has_value());
  EXPECT_TRUE(back->entries[0].time_completed_ns.has_value());
  EXPECT_TRUE(back->entries[0].retired);
  EXPECT_TRUE(back->from_prism);
  EXPECT_EQ(back->real_ranks, (std::vector<int>{0, 5}));
  // The pg_config ranks are written as torch writes them: a string.
  EXPECT_NE(v->Repr().find("'ranks': '[0, 1, 2, 3, 4, 5, 6, 7]'"), std::string::npos) << v->Repr();
  EXPECT_NE(v->Repr().find("'process_group': ('0', 'default_pg')"), std::string::npos);
}

TEST(FlightRecorder, PrismDumpsFromTheCoordinatorsLog) {
  HangDetector det(60);
  HangComm dp;
  dp.name = "DATA_PARALLEL_GROUP";
  dp.pg_name = "3";
  dp.pg_desc = "DATA_PARALLEL_GROUP";
  dp.members = {1, 3, 5, 7};
  dp.real = {true, false, true, false};
  dp.pg_members = dp.members;
  det.AddComm(1, dp);
  HangComm p2p;
  p2p.pg_name = "0";
  p2p.pg_desc = "default_pg";
  p2p.members = {1, 5};
  p2p.real = {true, true};
  det.AddComm(2, p2p);
  HangOp ar;
  ar.comm_id = 1;
  ar.op = 2;  // all_gather, 4 KiB total of f32
  ar.bytes = 4096;
  ar.dtype = 1;
  det.RecordOp(1, ar, 10 * kSec, 10 * kSec + 5000, 11 * kSec);
  ar.seq = 1;
  ar.op = 1;
  ar.bytes = 1 << 20;
  ar.dtype = -1;  // arrivals carry no dtype
  det.ArriveOp(1, ar, 12 * kSec, 12 * kSec);
  HangOp send;
  send.comm_id = 2;
  send.op = 103;
  send.bytes = 64;
  send.peer = -1;  // records carry no peer
  send.dtype = 1;
  det.RecordOp(5, send, 13 * kSec, 13 * kSec + 10, 13 * kSec);  // peer learnt from the 2-rank communicator anyway

  std::vector<FrDump> dumps = FrDumpsFromDetector(det, 8, {1, 5});
  ASSERT_EQ(dumps.size(), 2u);
  const FrDump& d1 = dumps[0];
  EXPECT_EQ(d1.rank, 1);
  ASSERT_EQ(d1.entries.size(), 2u);
  EXPECT_EQ(d1.entries[0].profiling_name, "nccl:_all_gather_base");
  EXPECT_EQ(d1.entries[0].input_sizes, (std::vector<std::vector<int64_t>>{{256}}));   // 4096 B / 4 / 4 members
  EXPECT_EQ(d1.entries[0].output_sizes, (std::vector<std::vector<int64_t>>{{1024}}));
  EXPECT_EQ(d1.entries[0].input_dtypes, std::vector<std::string>{"Float"});
  EXPECT_EQ(d1.entries[0].state, "completed");
  EXPECT_EQ(d1.entries[0].collective_seq_id, 1);
  EXPECT_EQ(d1.entries[0].pg_id, 3);
  ASSERT_TRUE(d1.entries[0].duration_ms.has_value());
  EXPECT_NEAR(*d1.entries[0].duration_ms, 0.005, 1e-9);
  EXPECT_EQ(d1.entries[1].profiling_name, "nccl:all_reduce");
  EXPECT_EQ(d1.entries[1].state, "started");
  EXPECT_EQ(d1.entries[1].collective_seq_id, 2);
  EXPECT_EQ(d1.entries[1].input_dtypes, std::vector<std::string>{"Byte"});  // unknown at arrival: bytes
  EXPECT_EQ(d1.entries[1].input_sizes, (std::vector<std::vector<int64_t>>{{1 << 20}}));
  EXPECT_EQ(d1.pg_status.at("3")[0], 2);
  EXPECT_EQ(d1.pg_status.at("3")[2], 1);
  EXPECT_EQ(d1.pg_config.at("3").ranks, (std::vector<int>{1, 3, 5, 7}));
  const FrDump& d5 = dumps[1];
  ASSERT_EQ(d5.entries.size(), 1u);
  EXPECT_EQ(d5.entries[0].profiling_name, "nccl:send 5->1");  // group ranks of pg 0 (the world of 8)
  EXPECT_TRUE(d5.entries[0].is_p2p);
  EXPECT_EQ(d5.entries[0].p2p_seq_id, 1);
  EXPECT_EQ(d5.pg_config.at("0").ranks.size(), 8u);

  fs::path dir = FreshDir("write");
  std::string err;
  ASSERT_TRUE(WriteFrDumps(dumps, dir.string(), &err)) << err;
  EXPECT_TRUE(fs::exists(dir / "nccl_trace_rank_1"));
  EXPECT_TRUE(fs::exists(dir / "nccl_trace_rank_5"));
  FrReadResult r = ReadFrDir(dir.string());
  EXPECT_TRUE(r.problems.empty());
  ASSERT_EQ(r.dumps.size(), 2u);
  EXPECT_EQ(r.dumps[1].entries[0].profiling_name, "nccl:send 5->1");
  fs::remove_all(dir);
}

TEST(FlightRecorder, SkippedCollectiveIsAMismatchAndNamesTheRanks) {
  FrAnalysis a = AnalyzeFr(SkippedAllReduce());
  ASSERT_EQ(a.diagnosis.mismatches.size(), 1u) << a.Text();
  EXPECT_EQ(a.diagnosis.mismatches[0].seq, 4u);
  EXPECT_EQ(a.diagnosis.mismatches[0].what, "op, size");
  EXPECT_EQ(a.diagnosis.waits.size(), 8u);
  ASSERT_EQ(a.reproduce.size(), 2u) << a.Text();
  EXPECT_EQ(a.reproduce[0].first, 0);
  EXPECT_NE(a.reproduce[0].second.find("all_reduce 1 MiB bf16"), std::string::npos) << a.reproduce[0].second;
  EXPECT_NE(a.reproduce[0].second.find("as 7 ranks did"), std::string::npos) << a.reproduce[0].second;
  EXPECT_EQ(a.reproduce[1].first, 5);
  EXPECT_NE(a.reproduce[1].second.find("the only rank that did"), std::string::npos);
  std::string text = a.Text();
  EXPECT_NE(text.find("ranks 0-4,6,7 all_reduce 1 MiB bf16; rank 5 all_gather 4 KiB bf16"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--ranks 0,5"), std::string::npos) << text;
  EXPECT_TRUE(a.missing_dumps.empty());
}

TEST(FlightRecorder, MissingDumpNeverArrived) {
  std::vector<FrDump> dumps = SkippedAllReduce();
  // Rank 5's program is right here: every rank is at the all_reduce, except rank 3 whose dump is missing.
  dumps[5] = dumps[4];
  dumps[5].rank = 5;
  dumps.erase(dumps.begin() + 3);
  FrAnalysis a = AnalyzeFr(dumps);
  EXPECT_EQ(a.missing_dumps, std::vector<int>{3});
  EXPECT_TRUE(a.diagnosis.mismatches.empty());
  ASSERT_EQ(a.diagnosis.missing.size(), 1u) << a.Text();
  ASSERT_EQ(a.diagnosis.missing[0].missing.size(), 1u);
  EXPECT_EQ(a.diagnosis.missing[0].missing[0].first, 3);
  std::string text = a.Text();
  EXPECT_NE(text.find("no dump from 1 member(s) of those groups: 3"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 [no dump] has reported no operation"), std::string::npos) << text;
  EXPECT_NE(text.find("--ranks 0,3"), std::string::npos) << text;
}

TEST(FlightRecorder, P2pSendSendIsACycle) {
  std::vector<FrDump> dumps;
  for (int r = 0; r < 2; ++r) {
    FrDump d;
    d.rank = r;
    d.pg_config["0"] = FrGroup{"0", "default_pg", {0, 1}};
    FrEntry e = Coll(0, "0", "default_pg", 0, r == 0 ? "nccl:send 0->1" : "nccl:send 1->0", 1024, 1024, "Float",
                     false, static_cast<int64_t>(kSec));
    e.is_p2p = true;
    e.p2p_seq_id = 1;
    d.entries.push_back(e);
    dumps.push_back(std::move(d));
  }
  FrAnalysis a = AnalyzeFr(dumps);
  ASSERT_EQ(a.diagnosis.cycles.size(), 1u) << a.Text();
  EXPECT_EQ(a.diagnosis.cycles[0], (std::vector<int>{0, 1}));
  EXPECT_NE(a.Text().find("--ranks 0,1"), std::string::npos) << a.Text();
}

TEST(FlightRecorder, AllCompletedIsNoHang) {
  std::vector<FrDump> dumps = SkippedAllReduce();
  for (FrDump& d : dumps) d.entries.pop_back();
  FrAnalysis a = AnalyzeFr(dumps);
  EXPECT_TRUE(a.diagnosis.waits.empty());
  EXPECT_NE(a.Text().find("every entry completed"), std::string::npos);
}

// The issue's case 1 as production would dump it, written by CPython's pickle (default protocol) from the format's
// description, not by our writer: world 1024, tp 16 (16 data-parallel groups of 64), rank 517 skips the all_reduce
// of iteration 3 on its data-parallel group; the other groups finish the iteration and wait at a world all_reduce.
// Then `prism-run status --flight-recorder` on it.
TEST(FlightRecorder, ReadsDumpsCPythonWrites) {
  if (std::system("python3 -c 'import pickle' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  fs::path dir = FreshDir("cpython");
  std::string script = R"PY(
import os, pickle, sys
out = sys.argv[1]
W, TP = 1024, 16
def entry(rid, pg, desc, seq, name, numel_in, numel_out, state, t):
    return {'record_id': rid, 'pg_id': int(pg), 'process_group': (pg, desc), 'thread_id': '1',
            'thread_name': 'pt_main_thread', 'collective_seq_id': seq, 'p2p_seq_id': 0, 'op_id': rid + 1,
            'profiling_name': name, 'time_created_ns': t, 'input_sizes': [[numel_in]], 'input_dtypes': ['BFloat16'],
            'output_sizes': [[numel_out]], 'output_dtypes': ['BFloat16'], 'state': state,
            'time_discovered_started_ns': t if state != 'scheduled' else None,
            'time_discovered_completed_ns': t + 5000 if state == 'completed' else None,
            'retired': state == 'completed', 'timeout_ms': 600000, 'is_p2p': False, 'frames': [],
            **({'duration_ms': 0.005} if state == 'completed' else {})}
for r in range(W):
    g = r % TP
    dp = str(g + 1)
    members = list(range(g, W, TP))
    cfg = {'0': {'name': '0', 'desc': 'default_pg', 'ranks': str(list(range(W)))},
           dp: {'name': dp, 'desc': 'DATA_PARALLEL_GROUP', 'ranks': str(members)}}
    entries, rid, seq, t = [], 0, 0, 10**18
    for it in range(4):
        for name, nin, nout in (('nccl:all_reduce', 524288, 524288), ('nccl:_all_gather_base', 32, 2048)):
            if r == 517 and it == 3 and name == 'nccl:all_reduce':
                continue
            seq += 1
            stuck = g == 517 % TP and it == 3
            entries.append(entry(rid, dp, 'DATA_PARALLEL_GROUP', seq, name, nin, nout,
                                 'started' if stuck else 'completed', t))
            rid += 1; t += 1000000
            if stuck:
                break
    if g != 517 % TP:
        entries.append(entry(rid, '0', 'default_pg', 1, 'nccl:all_reduce', 1, 1, 'started', t))
    dump = {'version': '2.10', 'comm_lib_version': '2.28.9', 'pg_config': cfg,
            'pg_status': {'0': {'last_enqueued_collective': 1, 'last_started_collective': 1,
                                'last_completed_collective': 0}},
            'entries': entries}
    with open(os.path.join(out, 'nccl_trace_rank_%d' % r), 'wb') as f:
        pickle.dump(dump, f)
with open(os.path.join(out, 'README'), 'w') as f:
    f.write('not a dump: no rank number at the end of the name\n')
with open(os.path.join(out, 'nccl_trace_rank_9999'), 'wb') as f:
    f.write(b'not a pickle')
)PY";
  std::ofstream(dir / "gen.py") << script;
  fs::path dumps = dir / "dumps";
  fs::create_directories(dumps);
  ASSERT_EQ(std::system(("python3 " + (dir / "gen.py").string() + " " + dumps.string()).c_str()), 0);

  FrReadResult r = ReadFrDir(dumps.string());
  ASSERT_EQ(r.dumps.size(), 1024u);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("nccl_trace_rank_9999: not a pickle"), std::string::npos) << r.problems[0];
  FrAnalysis a = AnalyzeFr(r.dumps);
  EXPECT_EQ(a.world_size, 1024);
  EXPECT_TRUE(a.missing_dumps.empty());
  ASSERT_EQ(a.diagnosis.mismatches.size(), 1u) << a.Text();
  const HangMismatch& m = a.diagnosis.mismatches[0];
  EXPECT_EQ(m.comm_name, "DATA_PARALLEL_GROUP");
  EXPECT_EQ(m.seq, 7u);
  EXPECT_EQ(m.ops.size(), 64u);
  std::vector<int> ranks;
  for (const auto& [rank, why] : a.reproduce) ranks.push_back(rank);
  EXPECT_EQ(ranks, (std::vector<int>{5, 517})) << a.Text();
  std::string text = a.Text();
  EXPECT_NE(text.find("rank 517 all_gather 4 KiB bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("to reproduce under prism, run these ranks for real: --ranks 5,517"), std::string::npos) << text;
  // The world all_reduce: 960 ranks wait for the 64 of the stuck group, which are stuck at the mismatch.
  ASSERT_EQ(a.diagnosis.missing.size(), 1u);
  EXPECT_EQ(a.diagnosis.missing[0].arrived.size(), 960u);
  EXPECT_EQ(a.diagnosis.missing[0].missing.size(), 64u);

  const char* prism_run = std::getenv("PRISM_RUN");
  if (prism_run && fs::exists(prism_run)) {
    std::string cmd = std::string(prism_run) + " status --flight-recorder " + dumps.string() + " 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    std::string outp;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, f)) outp.append(buf, n);
    int st = pclose(f);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << outp;
    EXPECT_NE(outp.find("1024 dump(s): ranks 0-1023"), std::string::npos) << outp;
    EXPECT_NE(outp.find("op, size mismatch at comm"), std::string::npos) << outp;
    EXPECT_NE(outp.find("--ranks 5,517"), std::string::npos) << outp;
    EXPECT_NE(outp.find("nccl_trace_rank_9999: not a pickle"), std::string::npos) << outp;
    cmd = std::string(prism_run) + " status --flight-recorder " + dumps.string() + " --json 2>/dev/null";
    f = popen(cmd.c_str(), "r");
    outp.clear();
    while (size_t n = fread(buf, 1, sizeof buf, f)) outp.append(buf, n);
    pclose(f);
    json j = json::parse(outp, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << outp.substr(0, 500);
    EXPECT_EQ(j["ranks_flag"], "--ranks 5,517");
    EXPECT_EQ(j["diagnosis"]["mismatches"][0]["seq"], 7);
  }
  fs::remove_all(dir);
}


// Virtual ranks' dumps (FrVirtualDumps). World 64, tp 8: the data-parallel group of rank 5 is {5, 13, ..., 61}
// (torch pg "3"), its tensor-parallel group {0..7} (pg "2"). Real ranks: `real` (in the data-parallel group; rank 5
// also in the tp group). Each real rank did three iterations (dp_ops / 2) of (all_reduce 2 MiB bf16, all_gather 2 KiB
// bf16 per rank) on dp, and rank 5 one all_reduce on tp first; at dp sequence 6 (dp_ops) each real rank issues
// `at6[rank]` (nullopt: it never arrives) and waits.
constexpr uint32_t kDp = 1, kTp = 2, kWorld = 3;
const std::vector<int> kDpRanks = {5, 13, 21, 29, 37, 45, 53, 61};

HangDetector VirtualWorld(const std::vector<int>& real, const std::map<int, std::optional<HangOp>>& at6,
                          uint64_t dp_ops = 6, uint64_t world_ops = 0) {
  HangDetector det(60);
  if (world_ops > 0) {
    // The default group (pg "0", all 64 ranks): world_ops all_reduces of 4 bytes on each real rank, before the rest.
    HangComm w;
    w.name = "default_pg";
    w.pg_name = "0";
    w.pg_desc = "default_pg";
    for (int m = 0; m < 64; ++m) {
      w.members.push_back(m);
      w.real.push_back(std::find(real.begin(), real.end(), m) != real.end());
    }
    w.pg_members = w.members;
    det.AddComm(kWorld, w);
    for (int r : real) {
      for (uint64_t seq = 0; seq < world_ops; ++seq) {
        HangOp o;
        o.comm_id = kWorld;
        o.seq = seq;
        o.op = 1;
        o.bytes = 4;
        o.dtype = 1;
        const uint64_t t = (seq + 1) * kSec / 100 + static_cast<uint64_t>(r);
        det.RecordOp(r, o, t, t + 1000, t + 1000);
      }
    }
  }
  HangComm dp;
  dp.name = "DATA_PARALLEL_GROUP";
  dp.pg_name = "3";
  dp.pg_desc = "DATA_PARALLEL_GROUP";
  dp.members = kDpRanks;
  for (int m : dp.members) dp.real.push_back(std::find(real.begin(), real.end(), m) != real.end());
  dp.pg_members = dp.members;
  det.AddComm(kDp, dp);
  HangComm tp;
  tp.name = "TENSOR_MODEL_PARALLEL_GROUP";
  tp.pg_name = "2";
  tp.pg_desc = "TENSOR_MODEL_PARALLEL_GROUP";
  tp.members = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int m : tp.members) tp.real.push_back(std::find(real.begin(), real.end(), m) != real.end());
  tp.pg_members = tp.members;
  det.AddComm(kTp, tp);
  HangOp tp_ar;
  tp_ar.comm_id = kTp;
  tp_ar.op = 1;
  tp_ar.bytes = 4096;
  tp_ar.dtype = 1;
  if (std::find(real.begin(), real.end(), 5) != real.end()) det.RecordOp(5, tp_ar, kSec, kSec + 500, kSec + 500);
  for (int r : real) {
    for (uint64_t seq = 0; seq < dp_ops; ++seq) {
      HangOp o;
      o.comm_id = kDp;
      o.seq = seq;
      o.op = seq % 2 == 0 ? 1 : 2;
      o.bytes = seq % 2 == 0 ? 2u << 20 : 2048u * 8;
      o.dtype = 3;  // bf16
      const uint64_t t = (10 + seq) * kSec + static_cast<uint64_t>(r);
      det.RecordOp(r, o, t, t + 1000, t + 1000);
    }
    auto it = at6.find(r);
    if (it != at6.end() && it->second) {
      HangOp o = *it->second;
      o.comm_id = kDp;
      o.seq = dp_ops;
      det.ArriveOp(r, o, 20 * kSec, 20 * kSec);
    }
  }
  return det;
}

HangOp Op(uint32_t op, uint64_t bytes) {
  HangOp o;
  o.op = op;
  o.bytes = bytes;
  return o;  // dtype -1: arrivals carry none
}

const FrDump* Find(const std::vector<FrDump>& dumps, int rank) {
  for (const FrDump& d : dumps) {
    if (d.rank == rank) return &d;
  }
  return nullptr;
}

// Every member of every group named in any dump's pg_config has a dump: what torch's analyzer checks first.
std::vector<int> MembersWithoutDump(const std::vector<FrDump>& dumps) {
  std::set<int> have, need;
  for (const FrDump& d : dumps) {
    have.insert(d.rank);
    for (const auto& [name, g] : d.pg_config) need.insert(g.ranks.begin(), g.ranks.end());
  }
  std::vector<int> out;
  for (int r : need) {
    if (!have.count(r)) out.push_back(r);
  }
  return out;
}

TEST(FlightRecorderVirtual, SkippedAllReduceVirtualMembersWaitAtTheAllReduce) {
  // Rank 29 skipped the all_reduce: at sequence 6 it issues the all_gather, rank 5 the all_reduce.
  HangDetector det = VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}});
  det.Hold(kDp, 6, "op, size");
  std::vector<FrDump> real = FrDumpsFromDetector(det, 64, {5, 29});
  FrVirtualResult v = FrVirtualDumps(det, 64, {5, 29});
  ASSERT_EQ(real.size(), 2u);
  // Virtual members of dp (6) and of tp (7); the stuck group first.
  ASSERT_EQ(v.covered.size(), 2u);
  EXPECT_EQ(v.covered[0], "3 (DATA_PARALLEL_GROUP, 8 ranks)");
  EXPECT_EQ(v.covered[1], "2 (TENSOR_MODEL_PARALLEL_GROUP, 8 ranks)");
  EXPECT_TRUE(v.uncovered.empty());
  ASSERT_EQ(v.dumps.size(), 13u);

  // Written and read back by prism's reader.
  fs::path dir = FreshDir("virtual-skip");
  std::string err;
  ASSERT_TRUE(WriteFrDumps(real, dir.string(), &err)) << err;
  ASSERT_TRUE(WriteFrDumps(v.dumps, dir.string(), &err)) << err;
  FrReadResult r = ReadFrDir(dir.string());
  EXPECT_TRUE(r.problems.empty());
  ASSERT_EQ(r.dumps.size(), 15u);
  EXPECT_TRUE(MembersWithoutDump(r.dumps).empty());
  for (int m : kDpRanks) ASSERT_NE(Find(r.dumps, m), nullptr) << m;

  const FrDump* d13 = Find(r.dumps, 13);
  ASSERT_NE(d13, nullptr);
  EXPECT_TRUE(d13->synthesized);
  EXPECT_TRUE(d13->from_prism);
  EXPECT_FALSE(Find(r.dumps, 5)->synthesized);
  EXPECT_EQ(d13->real_ranks, (std::vector<int>{5, 29}));
  ASSERT_EQ(d13->pg_config.size(), 1u);
  EXPECT_EQ(d13->pg_config.at("3").ranks, kDpRanks);
  EXPECT_EQ(d13->pg_config.at("3").desc, "DATA_PARALLEL_GROUP");
  ASSERT_EQ(d13->entries.size(), 7u);
  int64_t prev = -1;
  for (size_t i = 0; i < 7; ++i) {
    const FrEntry& e = d13->entries[i];
    EXPECT_EQ(e.collective_seq_id, static_cast<int64_t>(i + 1));
    EXPECT_EQ(e.pg_name, "3");
    EXPECT_EQ(e.pg_desc, "DATA_PARALLEL_GROUP");
    EXPECT_EQ(e.pg_id, 3);
    EXPECT_GT(e.record_id, prev);
    prev = e.record_id;
    EXPECT_EQ(e.state, i < 6 ? "completed" : "started") << i;
    EXPECT_EQ(e.time_completed_ns.has_value(), i < 6);
    if (i < 6) {
      EXPECT_EQ(e.profiling_name, i % 2 == 0 ? "nccl:all_reduce" : "nccl:_all_gather_base");
      EXPECT_EQ(e.input_dtypes, std::vector<std::string>{"BFloat16"});
      // The same entries as the real member's (sizes, dtypes), so torch's analyzer matches them.
      const FrEntry& re = Find(r.dumps, 5)->entries[i + 1];  // rank 5's first entry is its tp all_reduce
      EXPECT_EQ(e.input_sizes, re.input_sizes);
      EXPECT_EQ(e.output_sizes, re.output_sizes);
      EXPECT_EQ(e.collective_seq_id, re.collective_seq_id);
      EXPECT_EQ(e.state, re.state);
    }
  }
  // At the disagreement (a tie, one real member each) the virtual members issue the smallest real rank's op.
  EXPECT_EQ(d13->entries[6].profiling_name, "nccl:all_reduce");
  EXPECT_EQ(d13->entries[6].input_sizes, (std::vector<std::vector<int64_t>>{{2 << 20}}));
  EXPECT_EQ(d13->pg_status.at("3"), (std::array<int64_t, 3>{7, 7, 6}));
  // Rank 29's entry at that sequence is the all_gather: the one that differs from its 7 peers.
  const FrDump* d29 = Find(r.dumps, 29);
  ASSERT_EQ(d29->entries.size(), 7u);
  EXPECT_EQ(d29->entries[6].profiling_name, "nccl:_all_gather_base");
  EXPECT_EQ(d29->entries[6].collective_seq_id, 7);
  EXPECT_EQ(d29->entries[6].state, "started");

  // A tp-only virtual member: rank 5's tp all_reduce, completed; tp in its config, not dp.
  const FrDump* d0 = Find(r.dumps, 0);
  ASSERT_NE(d0, nullptr);
  ASSERT_EQ(d0->entries.size(), 1u);
  EXPECT_EQ(d0->entries[0].pg_name, "2");
  EXPECT_EQ(d0->entries[0].state, "completed");
  EXPECT_EQ(d0->entries[0].collective_seq_id, 1);
  EXPECT_EQ(d0->pg_config.count("3"), 0u);

  // Prism's own reading of the directory is the diagnosis of the real dumps alone: the virtual ones add no rank.
  FrAnalysis all = AnalyzeFr(r.dumps);
  FrAnalysis only_real = AnalyzeFr(real);
  EXPECT_TRUE(all.missing_dumps.empty());
  ASSERT_EQ(all.diagnosis.mismatches.size(), 1u) << all.Text();
  EXPECT_EQ(all.diagnosis.mismatches[0].ops.size(), 2u);
  EXPECT_EQ(all.reproduce, only_real.reproduce);
  EXPECT_NE(all.Text().find("--ranks 5,29"), std::string::npos) << all.Text();
  fs::remove_all(dir);
}

TEST(FlightRecorderVirtual, SizeMismatchVirtualMembersTakeTheMajority) {
  // Three real members; rank 5 all_reduces 1 MiB, 29 and 45 2 MiB: the virtual members issue 2 MiB (the majority,
  // though rank 5 is the smallest), so rank 5 alone differs.
  HangDetector det =
      VirtualWorld({5, 29, 45}, {{5, Op(1, 1u << 20)}, {29, Op(1, 2u << 20)}, {45, Op(1, 2u << 20)}});
  det.Hold(kDp, 6, "size");
  FrVirtualOptions o;
  o.scope = FrVirtualOptions::Scope::kStuck;
  FrVirtualResult v = FrVirtualDumps(det, 64, {5, 29, 45}, o);
  ASSERT_EQ(v.dumps.size(), 5u);  // dp only: 13, 21, 37, 53, 61
  ASSERT_EQ(v.uncovered.size(), 1u);
  EXPECT_NE(v.uncovered[0].find("TENSOR_MODEL_PARALLEL_GROUP"), std::string::npos) << v.uncovered[0];
  std::vector<FrDump> all = FrDumpsFromDetector(det, 64, {5, 29, 45});
  all.insert(all.end(), v.dumps.begin(), v.dumps.end());
  // Rank 5's config names tp (it is a member), whose virtual members have no dump here: torch's analyzer then needs
  // --allow-incomplete-ranks; every dp member has one.
  EXPECT_EQ(MembersWithoutDump(all), (std::vector<int>{0, 1, 2, 3, 4, 6, 7}));
  for (const FrDump& d : v.dumps) {
    EXPECT_TRUE(d.synthesized);
    ASSERT_EQ(d.entries.size(), 7u) << d.rank;
    EXPECT_EQ(d.entries[6].state, "started");
    EXPECT_EQ(d.entries[6].collective_seq_id, 7);
    EXPECT_EQ(d.entries[6].input_sizes, (std::vector<std::vector<int64_t>>{{2 << 20}})) << d.rank;
  }
  const FrDump* d5 = Find(all, 5);
  EXPECT_EQ(d5->entries.back().input_sizes, (std::vector<std::vector<int64_t>>{{1 << 20}}));
  FrAnalysis a = AnalyzeFr(all);
  ASSERT_EQ(a.diagnosis.mismatches.size(), 1u) << a.Text();
  EXPECT_EQ(a.diagnosis.mismatches[0].what, "size");
}

TEST(FlightRecorderVirtual, NeverArrivedRealRankIsTheOneWithoutTheEntry) {
  // Rank 29 never reaches sequence 6 (it is stuck elsewhere); rank 5 waits there; the virtual members wait with it.
  HangDetector det = VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, std::nullopt}});
  FrVirtualResult v = FrVirtualDumps(det, 64, {5, 29});
  std::vector<FrDump> real = FrDumpsFromDetector(det, 64, {5, 29});
  ASSERT_EQ(Find(real, 29)->entries.size(), 6u);
  const FrDump* d61 = Find(v.dumps, 61);
  ASSERT_NE(d61, nullptr);
  ASSERT_EQ(d61->entries.size(), 7u);
  EXPECT_EQ(d61->entries[6].state, "started");
  EXPECT_EQ(d61->entries[6].profiling_name, "nccl:all_reduce");
  std::vector<FrDump> all = real;
  all.insert(all.end(), v.dumps.begin(), v.dumps.end());
  EXPECT_TRUE(MembersWithoutDump(all).empty());
  FrAnalysis a = AnalyzeFr(all);
  ASSERT_EQ(a.diagnosis.missing.size(), 1u) << a.Text();
  ASSERT_EQ(a.diagnosis.missing[0].missing.size(), 1u);
  EXPECT_EQ(a.diagnosis.missing[0].missing[0].first, 29);
}

TEST(FlightRecorderVirtual, ScopeAndBound) {
  HangDetector det = VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}});
  FrVirtualOptions o;
  o.max_dumps = 6;  // dp (stuck, 6 virtual members) fits; tp (7 more) does not
  FrVirtualResult v = FrVirtualDumps(det, 64, {5, 29}, o);
  EXPECT_EQ(v.dumps.size(), 6u);
  ASSERT_EQ(v.covered.size(), 1u);
  EXPECT_NE(v.covered[0].find("DATA_PARALLEL_GROUP"), std::string::npos);
  ASSERT_EQ(v.uncovered.size(), 1u);
  EXPECT_NE(v.uncovered[0].find("PRISM_FR_VIRTUAL_MAX=6"), std::string::npos) << v.uncovered[0];
  o.max_dumps = 5;  // a group is taken whole or not at all
  v = FrVirtualDumps(det, 64, {5, 29}, o);
  EXPECT_TRUE(v.dumps.empty());
  EXPECT_EQ(v.uncovered.size(), 2u);
  o.max_dumps = 256;
  o.scope = FrVirtualOptions::Scope::kNone;
  v = FrVirtualDumps(det, 64, {5, 29}, o);
  EXPECT_TRUE(v.dumps.empty());
  EXPECT_TRUE(v.covered.empty());

  ::setenv("PRISM_FR_VIRTUAL", "stuck", 1);
  ::setenv("PRISM_FR_VIRTUAL_MAX", "12", 1);
  std::string warn;
  FrVirtualOptions e = FrVirtualOptionsFromEnv(&warn);
  EXPECT_EQ(e.scope, FrVirtualOptions::Scope::kStuck);
  EXPECT_EQ(e.max_dumps, 12u);
  EXPECT_TRUE(warn.empty()) << warn;
  ::setenv("PRISM_FR_VIRTUAL", "everything", 1);
  ::setenv("PRISM_FR_VIRTUAL_MAX", "-3", 1);
  e = FrVirtualOptionsFromEnv(&warn);
  EXPECT_EQ(e.scope, FrVirtualOptions::Scope::kGroups);
  EXPECT_EQ(e.max_dumps, 256u);
  EXPECT_NE(warn.find("PRISM_FR_VIRTUAL=everything"), std::string::npos) << warn;
  EXPECT_NE(warn.find("PRISM_FR_VIRTUAL_MAX=-3"), std::string::npos) << warn;
  ::unsetenv("PRISM_FR_VIRTUAL");
  ::unsetenv("PRISM_FR_VIRTUAL_MAX");
}


// What torch's analyzer needs, checked from CPython on the written directory (torch itself is not here; the GPU suite
// runs it): every file loads with pickle and has the keys and entry fields its loader and matcher read, every member
// of every group in any pg_config has a dump, and per group (after torch's alignment of the dumps by record_id) the
// first collective_seq_id where the members' entries (op, sizes, state) are not all alike shows the odd real rank: the
// one differing from the majority, or the absent one.
std::string FirstDisagreements(const fs::path& dir) {
  std::string script = R"PY(
import ast, os, pickle, re, sys
d = sys.argv[1]
dumps = {}
for f in os.listdir(d):
    m = re.fullmatch(r'nccl_trace_rank_(\d+)', f)
    assert m, f
    with open(os.path.join(d, f), 'rb') as fh:
        dumps[int(m.group(1))] = pickle.load(fh)
groups = {}
for r, x in dumps.items():
    assert x['version'] == '2.10' and isinstance(x['entries'], list)
    for name, g in x['pg_config'].items():
        ranks = set(ast.literal_eval(g['ranks']))
        assert groups.setdefault(name, (g['desc'], ranks)) == (g['desc'], ranks), name
need = set().union(*(rs for _, rs in groups.values()))
assert not need - set(dumps), 'missing dumps: %s' % sorted(need - set(dumps))
# torch's align_trace_from_beginning: every entry below the largest first record_id of any dump is dropped.
start = max([x['entries'][0]['record_id'] for x in dumps.values() if x['entries']] + [0])
at = {}
for r, x in dumps.items():
    last = -1
    for e in [e for e in x['entries'] if e['record_id'] >= start]:
        backend, name = e['profiling_name'].split(':')
        assert backend == 'nccl'
        pg, desc = e['process_group']
        assert desc == groups[pg][0]
        assert e['record_id'] > last
        last = e['record_id']
        for k in ('p2p_seq_id', 'time_created_ns', 'is_p2p', 'input_dtypes', 'output_dtypes'):
            assert k in e, k
        at.setdefault(pg, {}).setdefault(e['collective_seq_id'], {})[r] = (name, e['input_sizes'], e['output_sizes'], e['state'])
for pg in sorted(at):
    for seq in sorted(at[pg]):
        ops = at[pg][seq]
        kinds = {}
        for r, o in sorted(ops.items()):
            kinds.setdefault(repr(o), []).append(r)
        absent = sorted(groups[pg][1] - set(ops))
        if len(kinds) > 1 or absent:
            major = max(kinds.values(), key=len)
            odd = sorted(r for v in kinds.values() if v is not major for r in v)
            print('pg %s seq %d odd %s absent %s' % (pg, seq, odd, absent))
            break
)PY";
  fs::path py = dir.parent_path() / (dir.filename().string() + ".py");
  std::ofstream(py) << script;
  std::string cmd = "python3 " + py.string() + " " + dir.string() + " 2>&1";
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int st = f ? pclose(f) : -1;
  fs::remove(py);
  if (st != 0) out = "FAILED: " + out;
  return out;
}

TEST(FlightRecorderVirtual, CPythonSeesWhatTorchsAnalyzerNeeds) {
  if (std::system("python3 -c 'import pickle' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  {
    HangDetector det = VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}});
    fs::path dir = FreshDir("virtual-py-skip");
    std::string err;
    ASSERT_TRUE(WriteFrDumps(FrDumpsFromDetector(det, 64, {5, 29}), dir.string(), &err)) << err;
    ASSERT_TRUE(WriteFrDumps(FrVirtualDumps(det, 64, {5, 29}).dumps, dir.string(), &err)) << err;
    EXPECT_EQ(FirstDisagreements(dir), "pg 3 seq 7 odd [29] absent []\n");
    // Without the virtual dumps torch's analyzer has too few: the check fails as torch's does.
    for (int v : {13, 21, 37, 45, 53, 61}) fs::remove(dir / ("nccl_trace_rank_" + std::to_string(v)));
    EXPECT_NE(FirstDisagreements(dir).find("missing dumps: [13, 21, 37, 45, 53, 61]"), std::string::npos);
    fs::remove_all(dir);
  }
  {
    HangDetector det = VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, std::nullopt}});
    fs::path dir = FreshDir("virtual-py-absent");
    std::string err;
    ASSERT_TRUE(WriteFrDumps(FrDumpsFromDetector(det, 64, {5, 29}), dir.string(), &err)) << err;
    ASSERT_TRUE(WriteFrDumps(FrVirtualDumps(det, 64, {5, 29}).dumps, dir.string(), &err)) << err;
    EXPECT_EQ(FirstDisagreements(dir), "pg 3 seq 7 odd [] absent [29]\n");
    fs::remove_all(dir);
  }
}


// torch's analyzer first drops, in every dump, each entry whose record_id is below the largest first record_id of any
// dump (align_trace_from_beginning: for ring buffers that wrapped at different points). A record id counts every
// operation of its rank, so a virtual member's entries cannot keep their models' ids: its first modelled entry is
// rarely its model's first operation (here rank 5's first is on tp, which the dp-only virtual members are not in), and
// that id would become the bound and drop the real ranks' first entries (torch: "Not all ranks joining collective").
int64_t TorchStart(const std::vector<FrDump>& dumps) {
  int64_t start = 0;
  for (const FrDump& d : dumps) {
    if (!d.entries.empty()) start = std::max(start, d.entries.front().record_id);
  }
  return start;
}

TEST(FlightRecorderVirtual, VirtualDumpsKeepTorchsAlignment) {
  HangDetector det = VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}});
  std::vector<FrDump> real = FrDumpsFromDetector(det, 64, {5, 29});
  FrVirtualResult v = FrVirtualDumps(det, 64, {5, 29});
  ASSERT_EQ(v.dumps.size(), 13u);
  EXPECT_EQ(TorchStart(real), 0);
  std::vector<FrDump> all = real;
  all.insert(all.end(), v.dumps.begin(), v.dumps.end());
  EXPECT_EQ(TorchStart(all), 0);
  // As torch numbers a rank's entries: from the start, one by one.
  for (const FrDump& d : v.dumps) {
    for (size_t i = 0; i < d.entries.size(); ++i) EXPECT_EQ(d.entries[i].record_id, static_cast<int64_t>(i)) << d.rank;
  }

  // Logs that wrapped (prism keeps a rank's last kLogSize operations, as FR's buffer): rank 5 did 2101 operations
  // (ids 101..2100 kept), rank 29 2100 (ids 100..2099). The bound stays the real dumps' (101); a virtual member holds
  // what its model (rank 5, the smallest real rank) kept, numbered from the bound, so the alignment drops none of it.
  HangDetector wrapped = VirtualWorld({5, 29}, {}, 2100);
  real = FrDumpsFromDetector(wrapped, 64, {5, 29});
  ASSERT_EQ(real.size(), 2u);
  EXPECT_EQ(Find(real, 5)->entries.front().record_id, 101);
  EXPECT_EQ(Find(real, 29)->entries.front().record_id, 100);
  v = FrVirtualDumps(wrapped, 64, {5, 29});
  all = real;
  all.insert(all.end(), v.dumps.begin(), v.dumps.end());
  EXPECT_EQ(TorchStart(all), 101);
  const FrDump* d13 = Find(v.dumps, 13);
  ASSERT_NE(d13, nullptr);
  ASSERT_EQ(d13->entries.size(), 2000u);
  EXPECT_EQ(d13->entries.front().record_id, 101);
  EXPECT_EQ(d13->entries.front().collective_seq_id, 101);
  EXPECT_EQ(d13->entries.back().record_id, 2100);
  EXPECT_EQ(d13->entries.back().collective_seq_id, 2100);
  // tp-only virtual members: rank 5's tp all_reduce (id 0) fell out of its log, so theirs are empty.
  ASSERT_NE(Find(v.dumps, 0), nullptr);
  EXPECT_TRUE(Find(v.dumps, 0)->entries.empty());
}

// torch's own analyzer on prism's dumps, when PRISM_FR_TRACE is a command that runs it (torch is not on CI's machine;
// docs/hang.md, "Checked with torch's analyzer"):
//   PRISM_FR_TRACE="python3 -m torch.distributed.flight_recorder.fr_trace"   (where torch is installed)
//   PRISM_FR_TRACE="env PYTHONPATH=DIR python3 -m torchfr.fr_trace"          (its Python sources in DIR/torchfr)
// PRISM_FR_KEEP=1 keeps the dump directories (printed).
struct FrTraceRun {
  int rc = -1;
  std::string out;
  // The ranks torch's analyzer names in "Culprit rank N;" (in its first error message).
  std::set<int> Culprits() const {
    std::set<int> r;
    size_t at = out.find("error msg:");
    if (at == std::string::npos) return r;
    std::string line = out.substr(at, out.find('\n', at) - at);
    for (size_t p = line.find("Culprit rank "); p != std::string::npos; p = line.find("Culprit rank ", p + 1))
      r.insert(std::atoi(line.c_str() + p + 13));
    return r;
  }
  bool Has(const std::string& s) const { return out.find(s) != std::string::npos; }
};

FrTraceRun RunFrTrace(const char* cmd, const fs::path& dir, const std::string& args) {
  FrTraceRun r;
  std::string c = std::string(cmd) + " " + args + " " + dir.string() + " 2>&1";
  FILE* f = popen(c.c_str(), "r");
  char buf[4096];
  size_t n;
  while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int st = f ? pclose(f) : -1;
  r.rc = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

fs::path WriteScenario(const std::string& name, const HangDetector& det, const std::vector<int>& real,
                       const FrVirtualOptions& o = {}) {
  fs::path dir = FreshDir("torch-" + name);
  std::string err;
  EXPECT_TRUE(WriteFrDumps(FrDumpsFromDetector(det, 64, real), dir.string(), &err)) << err;
  EXPECT_TRUE(WriteFrDumps(FrVirtualDumps(det, 64, real, o).dumps, dir.string(), &err)) << err;
  return dir;
}

void Done(const fs::path& dir) {
  const char* keep = std::getenv("PRISM_FR_KEEP");
  if (keep && std::string(keep) == "1") {
    std::printf("kept %s\n", dir.c_str());
  } else {
    fs::remove_all(dir);
  }
}

std::set<int> DpWithout(int r) {
  std::set<int> s(kDpRanks.begin(), kDpRanks.end());
  s.erase(r);
  return s;
}

TEST(FlightRecorderTorchAnalyzer, FindsTheMismatchInPrismsDumps) {
  const char* cmd = std::getenv("PRISM_FR_TRACE");
  if (!cmd || !*cmd) GTEST_SKIP() << "PRISM_FR_TRACE is not set (a command running torch's fr_trace)";
  {
    // Rank 29 skipped the all_reduce: dp (pg 3) sequence 7 (FR counts from 1) has an all_gather on 29.
    fs::path dir = WriteScenario("skip", VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}}),
                                 {5, 29});
    FrTraceRun r = RunFrTrace(cmd, dir, "");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Collective sequence number: 7 has errors")) << r.out;
    EXPECT_TRUE(r.Has("group info: 3:DATA_PARALLEL_GROUP")) << r.out;
    EXPECT_TRUE(r.Has("Error type: COLLECTIVE_TYPE_MISMATCH")) << r.out;
    // Which rank it calls the culprit depends on the dump it loaded first: 29, or (29 first) every other member.
    std::set<int> c = r.Culprits();
    EXPECT_TRUE(c == std::set<int>{29} || c == DpWithout(29)) << r.out;
    EXPECT_FALSE(r.Has("Not all ranks joining")) << r.out;
    EXPECT_FALSE(r.Has("cannot decide")) << r.out;
    EXPECT_FALSE(r.Has("Culprit rank 0;")) << r.out;  // nothing on tp
    Done(dir);
  }
  {
    // Rank 5 all_reduces 1 MiB, 29 and 45 2 MiB.
    fs::path dir = WriteScenario(
        "size", VirtualWorld({5, 29, 45}, {{5, Op(1, 1u << 20)}, {29, Op(1, 2u << 20)}, {45, Op(1, 2u << 20)}}),
        {5, 29, 45});
    FrTraceRun r = RunFrTrace(cmd, dir, "");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Collective sequence number: 7 has errors")) << r.out;
    EXPECT_TRUE(r.Has("Error type: SIZE_OR_SYNTAX_MISMATCH")) << r.out;
    std::set<int> c = r.Culprits();
    EXPECT_TRUE(c == std::set<int>{5} || c == DpWithout(5)) << r.out;
    EXPECT_FALSE(r.Has("Not all ranks joining")) << r.out;
    Done(dir);
  }
  {
    // Rank 29 never arrives at dp sequence 7.
    fs::path dir = WriteScenario("absent", VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, std::nullopt}}), {5, 29});
    FrTraceRun r = RunFrTrace(cmd, dir, "");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Not all ranks joining collective, sequence number: 7")) << r.out;
    EXPECT_TRUE(r.Has("missing ranks: {29}")) << r.out;
    EXPECT_FALSE(r.Has("Error type")) << r.out;
    Done(dir);
  }
  {
    // A run without a bug: every collective matched, nothing reported.
    fs::path dir = WriteScenario("healthy", VirtualWorld({5, 29}, {}), {5, 29});
    FrTraceRun r = RunFrTrace(cmd, dir, "");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_FALSE(r.Has("Error type")) << r.out;
    EXPECT_FALSE(r.Has("Not all ranks joining")) << r.out;
    EXPECT_FALSE(r.Has("cannot decide")) << r.out;
    EXPECT_FALSE(r.Has("No errors found")) << r.out;
    Done(dir);
  }
  {
    // PRISM_FR_VIRTUAL=stuck: tp's virtual members have no dump. torch's analyzer refuses the directory, and with
    // --allow-incomplete-ranks finds the dp mismatch and cannot decide tp's all_reduce.
    FrVirtualOptions o;
    o.scope = FrVirtualOptions::Scope::kStuck;
    fs::path dir = WriteScenario("stuck", VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}}),
                                 {5, 29}, o);
    FrTraceRun r = RunFrTrace(cmd, dir, "");
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Missing dump files from ranks {0, 1, 2, 3, 4, 6, 7}")) << r.out;
    r = RunFrTrace(cmd, dir, "--allow-incomplete-ranks");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Collective sequence number: 7 has errors")) << r.out;
    EXPECT_TRUE(r.Has("Error type: COLLECTIVE_TYPE_MISMATCH")) << r.out;
    EXPECT_TRUE(r.Has("We cannot decide what's wrong with this collective entry")) << r.out;
    Done(dir);
  }
  {
    // The default group (64 ranks, 12 all_reduces first) left out by PRISM_FR_VIRTUAL_MAX=13 (dp and tp fit). torch's
    // analyzer counts each of its entries as a mismatch it "cannot decide", and past --mismatch_cap (10) of one group
    // it stops the whole analysis before dp's sequence 7; a larger cap lets it get there (docs/hang.md).
    FrVirtualOptions o;
    o.max_dumps = 13;
    fs::path dir = WriteScenario(
        "world", VirtualWorld({5, 29}, {{5, Op(1, 2u << 20)}, {29, Op(2, 2048u * 8)}}, 6, 12), {5, 29}, o);
    FrTraceRun r = RunFrTrace(cmd, dir, "--allow-incomplete-ranks");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Too many mismatches for process_group")) << r.out;
    EXPECT_FALSE(r.Has("Collective sequence number: 7 has errors")) << r.out;
    r = RunFrTrace(cmd, dir, "--allow-incomplete-ranks --mismatch_cap 1000000");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Collective sequence number: 7 has errors")) << r.out;
    EXPECT_TRUE(r.Has("group info: 3:DATA_PARALLEL_GROUP")) << r.out;
    std::set<int> c = r.Culprits();
    EXPECT_TRUE(c == std::set<int>{29} || c == DpWithout(29)) << r.out;
    EXPECT_FALSE(r.Has("Not all ranks joining")) << r.out;
    Done(dir);
  }
}


// The same on a run's dumps as a user gets them: prism-run with fake shims (tests/data/launcher/fake_shim.py, the
// real store and bus protocols) in a world of 8, real ranks 0 and 5, the default group covered by 6 virtual dumps.
TEST(FlightRecorderTorchAnalyzer, ReadsAPrismRunsDumps) {
  const char* cmd = std::getenv("PRISM_FR_TRACE");
  if (!cmd || !*cmd) GTEST_SKIP() << "PRISM_FR_TRACE is not set (a command running torch's fr_trace)";
  const char* prism_run = std::getenv("PRISM_RUN");
  ASSERT_NE(prism_run, nullptr) << "PRISM_RUN is not set (ctest sets it)";
  auto run = [&](const std::string& name, const std::string& env) {
    fs::path out = FreshDir("torch-run-" + name);
    std::string c = "env " + env + " PRISM_FR_VIRTUAL=groups PYTHON_EXEC=python3 " + prism_run + " --out " +
                    out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun --nnodes 2 " +
                    "--nproc-per-node 4 " + PRISM_SOURCE_DIR + "/tests/data/launcher/fake_shim.py >" + out.string() +
                    ".log 2>&1";
    int st = std::system(c.c_str());
    return std::make_pair(out, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  };
  {
    // Rank 5 skips the all_reduce of iteration 2: prism's seq 4, FR's collective_seq_id 5.
    auto [out, rc] = run("skip", "FAKE_ITERS=50 FAKE_SKIP_RANK=5 FAKE_SKIP_ITER=2 FAKE_SKIP_OP=0");
    EXPECT_EQ(rc, 4);
    ASSERT_TRUE(fs::exists(out / "flight_recorder" / "nccl_trace_rank_7"));
    FrTraceRun r = RunFrTrace(cmd, out / "flight_recorder", "");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.Has("Collective sequence number: 5 has errors")) << r.out;
    EXPECT_TRUE(r.Has("group info: 0:default_pg")) << r.out;
    EXPECT_TRUE(r.Has("Error type: COLLECTIVE_TYPE_MISMATCH")) << r.out;
    std::set<int> c = r.Culprits();
    const std::set<int> others = {0, 1, 2, 3, 4, 6, 7};
    EXPECT_TRUE(c == std::set<int>{5} || c == others) << r.out;
    EXPECT_FALSE(r.Has("Not all ranks joining")) << r.out;
    Done(out);
    fs::remove(out.string() + ".log");
  }
  {
    auto [out, rc] = run("healthy", "FAKE_ITERS=3");
    EXPECT_EQ(rc, 0);
    ASSERT_TRUE(fs::exists(out / "flight_recorder" / "nccl_trace_rank_7"));
    FrTraceRun r = RunFrTrace(cmd, out / "flight_recorder", "");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(r.out.empty()) << r.out;
    Done(out);
    fs::remove(out.string() + ".log");
  }
}

}  // namespace
}  // namespace prism::coord
