// Replays wire captures (what store clients sent, per connection, in capture order) against our store server and
// checks that every request is answered the way a torch client expects and no connection is dropped.
//
// Captures in tests/data/torch_store_wire/ (docs/coordinator.md, "Wire captures"), two forms:
//  - raw, one file per connection: <name>_conn<N>.bin holds every byte the client sent, in order; beside it
//    <name>_conn<N>.reply.bin may hold what torch's own server answered (tests/gpu/capture_store_wire.py records
//    both through a proxy). Connections are replayed request by request, round robin, a connection blocked in WAIT
//    waiting its turn; with a .reply.bin and no virtual ranks our replies must equal torch's byte for byte.
//  - PRSMWIRE, all connections in one file in capture order, as `prism-run coordinator --record-wire FILE` writes
//    (format in src/coordinator/store/store_server.h).
// An optional <name>.json gives the emulation the capture came from: {"world_size": N, "real_ranks": [...],
// "ranks_per_root": 128, "pending_waits_at_end": 0}. Without one: a world of 1, rank 0 real.
//
// The torch capture test skips only when no .bin file is there. The same harness also replays a capture this test
// records itself, so it is exercised everywhere.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "coordinator/store/store_client.h"
#include "coordinator/store/store_server.h"
#include "coordinator/store/virtual_ranks.h"

namespace prism::store {
namespace {

namespace fs = std::filesystem;

struct Record {
  uint32_t conn;
  uint32_t kind;
  std::string data;
};

bool ReadCapture(const std::string& path, std::vector<Record>* out, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string all = ss.str();
  if (all.size() < 16 || std::memcmp(all.data(), kWireMagic, 8) != 0) {
    *error = path + ": not a wire capture (magic PRSMWIRE missing)";
    return false;
  }
  uint32_t version;
  std::memcpy(&version, all.data() + 8, 4);
  if (version != kWireVersion) {
    *error = path + ": capture version " + std::to_string(version);
    return false;
  }
  for (size_t pos = 16; pos < all.size();) {
    if (all.size() - pos < 16) {
      *error = path + ": truncated record header at offset " + std::to_string(pos);
      return false;
    }
    Record r;
    uint64_t len;
    std::memcpy(&r.conn, all.data() + pos, 4);
    std::memcpy(&r.kind, all.data() + pos + 4, 4);
    std::memcpy(&len, all.data() + pos + 8, 8);
    if (len > all.size() - pos - 16) {
      *error = path + ": truncated record at offset " + std::to_string(pos);
      return false;
    }
    r.data = all.substr(pos + 16, len);
    pos += 16 + len;
    out->push_back(std::move(r));
  }
  return true;
}

// What a reply to one request looks like.
enum class Reply { kNone, kU8, kOptionalWait, kU32, kI64, kBytes, kMultiBytes, kQueuePop, kListKeys };

struct Expect {
  Reply kind;
  QueryType type;
  size_t n = 0;  // kMultiBytes: count
};

struct Conn {
  int fd = -1;
  std::string reply_log;  // every reply byte matched, in order
  std::string pending_requests;  // bytes sent, not yet parsed into expectations
  std::deque<Expect> expect;
  std::string in;  // reply bytes received, not yet matched
  size_t replies = 0;
  std::vector<std::string> errors;
  std::map<std::string, size_t> id_reads;  // NCCL-id-like GET replies: key -> size
  std::deque<std::string> get_keys;
};

void Plan(Conn& c) {
  for (;;) {
    Request req;
    size_t consumed = 0;
    std::string error;
    auto st = ParseRequest(reinterpret_cast<const uint8_t*>(c.pending_requests.data()), c.pending_requests.size(),
                           Limits{}, &req, &consumed, &error);
    if (st == ParseStatus::kNeedMore) return;
    if (st == ParseStatus::kError) {
      c.errors.push_back("the capture holds an unparsable request: " + error);
      c.pending_requests.clear();
      return;
    }
    Expect e{Reply::kNone, req.type};
    switch (req.type) {
      case QueryType::kPing: e.kind = Reply::kU32; break;
      case QueryType::kGet:
        e.kind = Reply::kBytes;
        c.get_keys.emplace_back(req.keys[0]);
        break;
      case QueryType::kCompareSet: e.kind = Reply::kBytes; break;
      case QueryType::kAdd:
      case QueryType::kGetNumKeys:
      case QueryType::kDeleteKey:
      case QueryType::kQueueLen: e.kind = Reply::kI64; break;
      case QueryType::kCheck:
      case QueryType::kBarrier: e.kind = Reply::kU8; break;
      case QueryType::kWait: e.kind = Reply::kOptionalWait; break;
      case QueryType::kCancelWait: e.kind = Reply::kU8; break;
      case QueryType::kMultiGet:
        e.kind = Reply::kMultiBytes;
        e.n = req.keys.size();
        break;
      case QueryType::kQueuePop: e.kind = Reply::kQueuePop; break;
      case QueryType::kListKeys: e.kind = Reply::kListKeys; break;
      default: break;
    }
    if (e.kind != Reply::kNone) c.expect.push_back(e);
    c.pending_requests.erase(0, consumed);
  }
}

// Consumes whole replies from c.in in order. A WAIT answered by nothing before a CANCEL_WAIT is skipped.
void Match(Conn& c) {
  auto have = [&](size_t n) { return c.in.size() >= n; };
  auto u64at = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, c.in.data() + off, 8);
    return v;
  };
  while (!c.expect.empty()) {
    Expect& e = c.expect.front();
    size_t need = 0;
    switch (e.kind) {
      case Reply::kNone: break;
      case Reply::kU8: need = 1; break;
      case Reply::kU32: need = 4; break;
      case Reply::kI64: need = 8; break;
      case Reply::kOptionalWait: {
        if (!have(1)) return;
        uint8_t b = static_cast<uint8_t>(c.in[0]);
        if (b == kWaitCanceled && c.expect.size() > 1) {  // this WAIT was cancelled; the byte is CANCEL's
          c.expect.pop_front();
          continue;
        }
        if (b != kStopWaiting) c.errors.push_back("WAIT answered " + std::to_string(b));
        need = 1;
        break;
      }
      case Reply::kBytes: {
        if (!have(8)) return;
        need = 8 + u64at(0);
        if (!have(need)) return;
        if (e.type == QueryType::kGet && !c.get_keys.empty()) {
          c.id_reads[c.get_keys.front()] = need - 8;
          c.get_keys.pop_front();
        }
        break;
      }
      case Reply::kMultiBytes: {
        size_t off = 0;
        for (size_t i = 0; i < e.n; ++i) {
          if (!have(off + 8)) return;
          off += 8 + u64at(off);
          if (!have(off)) return;
        }
        need = off;
        break;
      }
      case Reply::kQueuePop: {
        if (!have(8)) return;
        int64_t n;
        std::memcpy(&n, c.in.data(), 8);
        need = 8;
        if (n > 0) {
          if (!have(16)) return;
          need = 16 + u64at(8);
        }
        break;
      }
      case Reply::kListKeys: {
        if (!have(8)) return;
        int64_t n;
        std::memcpy(&n, c.in.data(), 8);
        size_t off = 8;
        for (int64_t i = 0; i < n; ++i) {
          if (!have(off + 8)) return;
          off += 8 + u64at(off);
          if (!have(off)) return;
        }
        need = off;
        break;
      }
    }
    if (!have(need)) return;
    c.reply_log.append(c.in, 0, need);
    c.in.erase(0, need);
    c.expect.pop_front();
    ++c.replies;
  }
}

void Drain(Conn& c, int timeout_ms) {
  char buf[65536];
  pollfd p{c.fd, POLLIN, 0};
  while (::poll(&p, 1, timeout_ms) > 0) {
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    c.in.append(buf, static_cast<size_t>(n));
    Match(c);
    if (c.expect.empty()) break;
  }
  Match(c);
}

struct Replayed {
  ServerStats stats;
  std::map<uint32_t, Conn> conns;
};

// One thing to send: bytes of one connection (a whole request for raw captures, a read chunk for PRSMWIRE), or
// its close.
struct Item {
  uint32_t conn;
  std::string data;
  bool close = false;
};

bool OnlyWaitsOutstanding(const Conn& c) {
  return std::all_of(c.expect.begin(), c.expect.end(), [](const Expect& e) { return e.kind == Reply::kOptionalWait; });
}

// Sends `items` in their order as far as the clients' synchrony allows: torch's client sends its next request only
// once the previous one is answered (SET and friends have no answer), so an item goes out only when its connection
// owes nothing, except a CANCEL_WAIT, which torch sends while its WAIT is unanswered. Among the items that may go,
// the earliest goes first; when none may, the blocked connections are drained until a reply frees one.
Replayed ReplayItems(const std::vector<Item>& items, const nlohmann::json& meta) {
  coord::VirtualRanksOptions vo;
  vo.world_size = meta.value("world_size", 1);
  vo.real_ranks = meta.value("real_ranks", std::vector<int>{0});
  vo.ranks_per_root = meta.value("ranks_per_root", 128);
  coord::VirtualRanks vr(vo);
  StoreServerOptions so;
  so.stand_in = &vr;
  StoreServer server;
  std::string error;
  Replayed out;
  EXPECT_TRUE(server.Start(so, &error)) << error;
  std::map<uint32_t, std::deque<size_t>> queue;
  for (size_t i = 0; i < items.size(); ++i) queue[items[i].conn].push_back(i);
  int stalls = 0;
  while (stalls < 40) {  // 40 x 50 ms without any reply or send: what is left cannot go
    size_t best = items.size();
    for (auto& [id, q] : queue) {
      if (q.empty()) continue;
      Conn& c = out.conns[id];
      if (c.fd >= 0 && !c.expect.empty()) Drain(c, 0);
      const Item& it = items[q.front()];
      bool cancel = !it.close && c.pending_requests.empty() && !it.data.empty() &&
                    it.data[0] == static_cast<char>(QueryType::kCancelWait);
      bool may = c.expect.empty() || (cancel && OnlyWaitsOutstanding(c));
      if (may && q.front() < best) best = q.front();
    }
    if (best == items.size()) {
      bool any_left = false, matched = false;
      for (auto& [id, q] : queue) {
        if (q.empty()) continue;
        any_left = true;
        Conn& c = out.conns[id];
        size_t before = c.replies;
        if (c.fd >= 0) Drain(c, 50);
        matched = matched || c.replies != before;
      }
      if (!any_left) break;
      stalls = matched ? 0 : stalls + 1;
      continue;
    }
    stalls = 0;
    const Item& it = items[best];
    queue[it.conn].pop_front();
    Conn& c = out.conns[it.conn];
    if (c.fd == -1) {
      c.fd = ipc::ConnectTcp("127.0.0.1", server.port(), 5000, &error);
      EXPECT_GE(c.fd, 0) << error;
    }
    if (c.fd < 0) continue;
    if (it.close) {
      Drain(c, c.expect.empty() ? 0 : 2000);
      ::close(c.fd);
      c.fd = -2;
      continue;
    }
    EXPECT_EQ(ipc::WriteAll(c.fd, it.data.data(), it.data.size(), &error), ipc::IoStatus::kOk) << error;
    c.pending_requests += it.data;
    Plan(c);
    Drain(c, c.expect.empty() ? 0 : 20);
  }
  for (auto& [id, q] : queue) {
    if (!q.empty()) ADD_FAILURE() << "connection " << id << ": " << q.size() << " requests could not be sent";
  }
  for (auto& [id, c] : out.conns) {
    if (c.fd >= 0) Drain(c, c.expect.empty() ? 0 : 500);
  }
  out.stats = server.Stats();
  for (auto& [id, c] : out.conns) {
    if (c.fd >= 0) ::close(c.fd);
  }
  server.Stop();
  return out;
}

Replayed Replay(const std::vector<Record>& records, const nlohmann::json& meta) {
  std::vector<Item> items;
  for (const Record& r : records) items.push_back(Item{r.conn, r.data, r.kind == kWireClosed});
  return ReplayItems(items, meta);
}

// Raw per-connection captures: no order across connections is known; requests are interleaved round robin.
Replayed ReplayRaw(const std::vector<std::string>& streams, const nlohmann::json& meta) {
  std::vector<std::vector<std::string>> requests(streams.size());
  std::string error;
  for (size_t i = 0; i < streams.size(); ++i) {
    size_t pos = 0;
    while (pos < streams[i].size()) {
      Request req;
      size_t consumed = 0;
      auto st = ParseRequest(reinterpret_cast<const uint8_t*>(streams[i].data()) + pos, streams[i].size() - pos,
                             Limits{}, &req, &consumed, &error);
      if (st != ParseStatus::kOk) {
        ADD_FAILURE() << "connection " << i << ": capture ends in a "
                      << (st == ParseStatus::kNeedMore ? "partial" : "bad") << " request at byte " << pos << " "
                      << error;
        break;
      }
      requests[i].push_back(streams[i].substr(pos, consumed));
      pos += consumed;
    }
  }
  std::vector<Item> items;
  for (size_t round = 0;; ++round) {
    bool any = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (round < requests[i].size()) {
        items.push_back(Item{static_cast<uint32_t>(i), requests[i][round]});
        any = true;
      }
    }
    if (!any) break;
  }
  return ReplayItems(items, meta);
}

void CheckReplayed(Replayed& r, const nlohmann::json& meta) {
  EXPECT_EQ(r.stats.dropped, 0u) << "the server dropped a connection of a real torch client";
  size_t pending_waits = meta.value("pending_waits_at_end", 0);
  size_t replies = 0;
  for (auto& [id, c] : r.conns) {
    for (const auto& e : c.errors) ADD_FAILURE() << "connection " << id << ": " << e;
    size_t open_waits = 0;
    for (const auto& e : c.expect) {
      if (e.kind == Reply::kOptionalWait) {
        ++open_waits;
      } else {
        ADD_FAILURE() << "connection " << id << ": no reply to " << QueryTypeName(e.type);
      }
    }
    EXPECT_LE(open_waits, pending_waits) << "connection " << id << " still waits";
    EXPECT_TRUE(c.in.empty()) << "connection " << id << ": " << c.in.size() << " reply bytes nobody asked for";
    for (const auto& [key, size] : c.id_reads) {
      if (coord::SplitStandardIdKey(key)) {
        EXPECT_EQ(size, 128u) << "NCCL id key " << key << " read back with " << size << " bytes";
      }
    }
    replies += c.replies;
  }
  EXPECT_GT(replies, 0u);
}

void CheckReplay(const std::string& name, const std::vector<Record>& records, const nlohmann::json& meta) {
  SCOPED_TRACE(name);
  Replayed r = Replay(records, meta);
  CheckReplayed(r, meta);
}

TEST(StoreWireReplay, OwnRecordingOfATorchLikeSession) {
  // Record: three "ranks" of a world of 8 (two real) doing what torch 2.11 did on the wire, then replay.
  std::string path = ::testing::TempDir() + "/self_capture.bin";
  {
    coord::VirtualRanksOptions vo;
    vo.world_size = 8;
    vo.real_ranks = {0, 5};
    coord::VirtualRanks vr(vo);
    StoreServerOptions so;
    so.stand_in = &vr;
    so.record_path = path;
    StoreServer server;
    std::string error;
    ASSERT_TRUE(server.Start(so, &error)) << error;
    StoreClient r0, r5, hb;
    ASSERT_TRUE(r0.Connect("127.0.0.1", server.port()));
    ASSERT_TRUE(r5.Connect("127.0.0.1", server.port()));
    ASSERT_TRUE(hb.Connect("127.0.0.1", server.port()));
    int64_t v;
    ASSERT_TRUE(r0.Add("init/", 1, &v));
    ASSERT_TRUE(r5.Add("init/", 1, &v));
    ASSERT_TRUE(r0.Set("/default_pg/0//__prism_group__", R"({"name":"0","ranks":[]})"));
    ASSERT_TRUE(r0.Set("/default_pg/0//cuda//0", std::string(128, 'i')));
    std::string got;
    ASSERT_TRUE(r5.WaitGet("/default_pg/0//cuda//0", 5000, &got));
    ASSERT_TRUE(r5.Set("/default_pg/0//1//__prism_group__", R"({"name":"1","ranks":[4,5]})"));
    ASSERT_TRUE(r5.WaitGet("/default_pg/0//1//cuda//0", 5000, &got));  // virtual leader 4
    bool ready, timed_out;
    ASSERT_TRUE(hb.Check({"/exception_dump"}, &ready));
    ASSERT_TRUE(r5.Wait({"/never"}, 50, &timed_out));  // a torch wait timeout: CANCEL_WAIT
    ASSERT_TRUE(r0.Add("/default_pg/store_based_barrier_key:0", 1, &v));
    ASSERT_TRUE(r5.Add("/default_pg/store_based_barrier_key:0", 1, &v));
    ASSERT_TRUE(r5.Set("/default_pg/store_based_barrier_key:0:last_worker", "1"));
    ASSERT_TRUE(r0.WaitGet("/default_pg/store_based_barrier_key:0:last_worker", 5000, &got));
    std::vector<std::string> ids;
    ASSERT_TRUE(r5.MultiGet({"/default_pg/0//cuda//0"}, &ids));
    server.Stop();
  }
  std::vector<Record> records;
  std::string error;
  ASSERT_TRUE(ReadCapture(path, &records, &error)) << error;
  EXPECT_GT(records.size(), 10u);
  CheckReplay("self capture", records, {{"world_size", 8}, {"real_ranks", {0, 5}}});
}

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json ReadMeta(const fs::path& p) {
  if (!fs::exists(p)) return nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::parse(ReadAll(p), nullptr, false);
  EXPECT_FALSE(meta.is_discarded()) << p << " is not JSON";
  return meta.is_discarded() ? nlohmann::json::object() : meta;
}

TEST(StoreWireReplay, CapturedFromTorch) {
  fs::path dir = fs::path(PRISM_SOURCE_DIR) / "tests/data/torch_store_wire";
  std::map<std::string, std::map<int, fs::path>> raw;  // name -> connection number -> file
  std::vector<fs::path> recorded;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string f = it->path().filename().string();
    if (f.size() < 4 || f.substr(f.size() - 4) != ".bin" || f.find(".reply.bin") != std::string::npos) continue;
    if (ReadAll(it->path()).substr(0, 8) == std::string(kWireMagic, 8)) {
      recorded.push_back(it->path());
      continue;
    }
    size_t at = f.rfind("_conn");
    if (at == std::string::npos) {
      ADD_FAILURE() << f << ": neither a PRSMWIRE capture nor <name>_conn<N>.bin";
      continue;
    }
    raw[f.substr(0, at)][std::atoi(f.c_str() + at + 5)] = it->path();
  }
  if (raw.empty() && recorded.empty()) {
    GTEST_SKIP() << "no capture in " << dir << " (record one on the GPU machine: docs/coordinator.md)";
  }
  for (const auto& f : recorded) {
    std::vector<Record> records;
    std::string error;
    ASSERT_TRUE(ReadCapture(f.string(), &records, &error)) << error;
    fs::path side = f;
    CheckReplay(f.filename().string(), records, ReadMeta(side.replace_extension(".json")));
  }
  for (const auto& [name, files] : raw) {
    SCOPED_TRACE(name);
    nlohmann::json meta = ReadMeta(dir / (name + ".json"));
    std::vector<std::string> streams;
    std::vector<fs::path> paths;
    for (const auto& [n, p] : files) {
      streams.push_back(ReadAll(p));
      paths.push_back(p);
    }
    Replayed r = ReplayRaw(streams, meta);
    CheckReplayed(r, meta);
    int world = meta.value("world_size", 1);
    bool all_real = meta.value("real_ranks", std::vector<int>{0}).size() == static_cast<size_t>(world);
    for (size_t i = 0; i < paths.size(); ++i) {
      fs::path reply = paths[i];
      reply.replace_extension(".reply.bin");
      if (!all_real || !fs::exists(reply)) continue;
      std::string torch = ReadAll(reply);
      const std::string& ours = r.conns[static_cast<uint32_t>(i)].reply_log;
      EXPECT_EQ(ipc::HexEncode(ours), ipc::HexEncode(torch))
          << paths[i].filename() << ": our replies differ from torch's own server's";
    }
  }
}

}  // namespace
}  // namespace prism::store
