// Throughput of the host exchange (docs/payload.md "Exchange"): real data between real members of a communicator
// through a real coordinator over its Unix socket. k forked processes each run libprism's own path (Submit() ->
// RunExchange -> CoordSendData / CoordWaitResult) with the GPU boundary faked (tests/unit/shim_fake_gpu.h: the
// device<->host copies become memcpy, stream synchronisation is free), so what is measured is the CPU side:
// staging, framing, the socket, the coordinator's assembly and reduction, the result's way back.
//
//   build/bin/exchange_bench [--reps N] [--sizes-mib 1,16,256] [--ranks 2,4] [--virtual]
//
// First the reduction alone (ExchangeReduce vs ExchangeReduceReference, 2 inputs, in this process, threads as
// PRISM_EXCHANGE_THREADS or the default), then the whole path.
// Cases: all-reduce fp32 SUM, all-reduce bf16 SUM (S bytes per rank), all-gather fp32 (S bytes of output, S/k per
// rank). Per case: one warm-up, then N timed repetitions; a repetition's time is the slowest rank's Submit() time.
// Prints the median, the algorithm bandwidth S/t and NCCL's bus bandwidth (all-reduce x 2(k-1)/k, all-gather x
// (k-1)/k), and two baselines measured in the same run over the same bytes: memcpy, and a Unix socket round trip
// (S bytes to an echo thread and back, 8 MiB writes: what moving one rank's input in and its output out costs at
// least). --virtual: the communicator has 8 members of which k are real (the rest stand in, docs/payload.md).
// The output is checked (fp32: every element of the sum; bf16 and all-gather: every element), so a fast wrong
// answer fails the run (exit 1).
#include <nccl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../tests/unit/shim_fake_gpu.h"
#include "coordinator/coordinator.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/progress.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"
#include "nccl_patch/dtype_math.h"
#include "nccl_patch/exchange.h"

using namespace prism;
using namespace prism::interpose;
using prism::payload::DataType;

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Case {
  const char* name;
  payload::OpKind op;
  ncclDataType_t dtype;
  uint64_t bytes;  // S: all-reduce input/output, all-gather output
};

bool WriteFull(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadFull(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

uint16_t Bf16(float f) { return static_cast<uint16_t>(payload::math::EncodeSmallFloat(f, payload::math::FormatBf16())); }

// One real rank: libprism's exchange path in this process. Writes its per-repetition seconds to `out_fd`.
int RankMain(int rank, int world, const std::vector<int>& real, const std::string& socket, const ncclUniqueId& id,
             const std::vector<Case>& cases, int reps, int out_fd) {
  static testing::FakeGpu gpu;
  Config c;
  c.rank = rank;
  c.world_size = world;
  c.real_ranks = real;
  c.fixed_dur_us = 1;
  c.coord_socket = socket;
  // Why static: the forked rank _exits with the result while the progress thread may still read the runtime.
  static std::optional<ScopedRuntime> rt;
  rt.emplace(Runtime::Parts{.config = c, .gpu = &gpu});
  InitArgs a;
  a.nranks = world;
  a.rank = rank;
  a.ids = &id;
  Comm* comm = nullptr;
  if (CommInit(a, &comm) != ncclSuccess || comm->real_members != static_cast<int>(real.size())) {
    std::fprintf(stderr, "rank %d: communicator init failed (real members %d)\n", rank, comm ? comm->real_members : -1);
    return 1;
  }
  const int k = static_cast<int>(real.size());
  int bad = 0;
  for (const Case& cs : cases) {
    const size_t esz = cs.dtype == ncclBfloat16 ? 2 : 4;
    const bool gather = cs.op == payload::OpKind::kAllGather;
    const uint64_t count = gather ? cs.bytes / esz / static_cast<uint64_t>(world) : cs.bytes / esz;
    const uint64_t in_bytes = count * esz, out_bytes = gather ? in_bytes * static_cast<uint64_t>(world) : in_bytes;
    std::vector<uint8_t> send(in_bytes), recv(out_bytes);
    // Rank r's element i: (r + 1) + (i % 8) / 8, exact in bf16 and fp32, so every sum is exact.
    for (uint64_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(rank + 1) + static_cast<float>(i % 8) / 8.0f;
      if (esz == 2) {
        const uint16_t b = Bf16(v);
        std::memcpy(send.data() + i * 2, &b, 2);
      } else {
        std::memcpy(send.data() + i * 4, &v, 4);
      }
    }
    std::vector<double> t;
    for (int rep = 0; rep <= reps; ++rep) {
      OpCall call;
      call.op = cs.op;
      call.comm = comm;
      call.dtype = cs.dtype;
      call.redop = ncclSum;
      call.count = count;
      call.send = send.data();
      call.recv = recv.data();
      std::memset(recv.data(), 0, recv.size());
      auto t0 = Clock::now();
      if (Submit(call) != ncclSuccess) return 1;
      auto t1 = Clock::now();
      ProgressDrain(5000000000ull);
      if (rep > 0) t.push_back(Seconds(t0, t1));
      {
        std::lock_guard<std::mutex> l(gpu.mu);
        gpu.steps.clear();
        gpu.descs.clear();
        gpu.gates.clear();
        gpu.copies.clear();
      }
    }
    // Check: all-reduce: sum over the world of member inputs (virtual member j stands in with real j mod k).
    double rank_sum = 0;
    for (int j = 0; j < world; ++j) rank_sum += static_cast<double>(real[static_cast<size_t>(j % k)] + 1);
    for (uint64_t i = 0; i < out_bytes / esz && !bad; ++i) {
      double want;
      if (gather) {
        const uint64_t block = i / count, e = i % count;
        // Member j's input: its own (j real) or real[v mod k] for the v-th virtual member; here members are
        // 0..world-1 and the real ones 0..k-1, so the v-th virtual member is j - k.
        const int j = static_cast<int>(block);
        const int src = j < k ? j : real[static_cast<size_t>((j - k) % k)];
        want = static_cast<double>(src + 1) + static_cast<double>(e % 8) / 8.0;
      } else {
        want = rank_sum + static_cast<double>(world) * static_cast<double>(i % 8) / 8.0;
      }
      double got;
      if (esz == 2) {
        uint16_t b;
        std::memcpy(&b, recv.data() + i * 2, 2);
        got = payload::math::DecodeSmallFloat(b, payload::math::FormatBf16());
        want = payload::math::DecodeSmallFloat(Bf16(static_cast<float>(want)), payload::math::FormatBf16());
      } else {
        float f;
        std::memcpy(&f, recv.data() + i * 4, 4);
        got = f;
      }
      if (got != want) {
        std::fprintf(stderr, "rank %d: %s element %llu is %g, expected %g\n", rank, cs.name,
                     static_cast<unsigned long long>(i), got, want);
        bad = 1;
      }
    }
    if (!WriteFull(out_fd, t.data(), t.size() * sizeof(double))) return 1;
  }
  return bad;
}

// Baseline: S bytes through a Unix socket to an echo thread and back (8 MiB writes), seconds.
double SocketRoundTrip(uint64_t bytes) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
  std::vector<char> src(bytes, 1), dst(bytes);
  constexpr size_t kChunk = 8u << 20;
  auto t0 = Clock::now();
  std::thread echo([&] {
    std::vector<char> buf(kChunk);
    for (uint64_t off = 0; off < bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, bytes - off));
      if (!ReadFull(sv[1], buf.data(), n) || !WriteFull(sv[1], buf.data(), n)) return;
      off += n;
    }
  });
  std::thread writer([&] { WriteFull(sv[0], src.data(), bytes); });
  ReadFull(sv[0], dst.data(), bytes);
  auto t1 = Clock::now();
  writer.join();
  echo.join();
  ::close(sv[0]);
  ::close(sv[1]);
  return Seconds(t0, t1);
}

double MemcpyTime(uint64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  auto t0 = Clock::now();
  std::memcpy(b.data(), a.data(), bytes);
  auto t1 = Clock::now();
  if (b[bytes / 2] != 1) std::abort();
  return Seconds(t0, t1);
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  std::vector<int> sizes_mib = {1, 16, 256}, ranks_list = {2, 4};
  bool with_virtual = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--sizes-mib" && i + 1 < argc) sizes_mib = ParseList(argv[++i]);
    else if (a == "--ranks" && i + 1 < argc) ranks_list = ParseList(argv[++i]);
    else if (a == "--virtual") with_virtual = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--sizes-mib 1,16,256] [--ranks 2,4] [--virtual]\n", argv[0]);
      return 2;
    }
  }
  std::vector<Case> cases;
  for (int mib : sizes_mib) {
    const uint64_t s = static_cast<uint64_t>(mib) << 20;
    cases.push_back({"all_reduce fp32 sum", payload::OpKind::kAllReduce, ncclFloat32, s});
    cases.push_back({"all_reduce bf16 sum", payload::OpKind::kAllReduce, ncclBfloat16, s});
    cases.push_back({"all_gather fp32    ", payload::OpKind::kAllGather, ncclFloat32, s});
  }
  std::printf("exchange_bench: %d repetitions per case (median), %u cores; libprism path with a faked GPU, real "
              "coordinator over its Unix socket\n",
              reps, std::thread::hardware_concurrency());

  // Baselines, same bytes, same run.
  std::printf("\n%10s %14s %14s %18s %14s\n", "size", "memcpy ms", "memcpy GB/s", "socket rtt ms", "socket GB/s");
  std::vector<double> base_rtt;
  for (int mib : sizes_mib) {
    const uint64_t s = static_cast<uint64_t>(mib) << 20;
    std::vector<double> m, r;
    for (int rep = 0; rep < reps; ++rep) {
      m.push_back(MemcpyTime(s));
      r.push_back(SocketRoundTrip(s));
    }
    const double mm = Median(m), rr = Median(r);
    base_rtt.push_back(rr);
    std::printf("%7d MiB %14.3f %14.2f %18.3f %14.2f\n", mib, mm * 1e3, s / mm / 1e9, rr * 1e3, s / rr / 1e9);
  }

  // The reduction alone (in this process, 2 inputs): the fast path against the reference it replaced.
  {
    const uint64_t s = std::min<uint64_t>(static_cast<uint64_t>(*std::max_element(sizes_mib.begin(), sizes_mib.end())) << 20,
                                          uint64_t{64} << 20);
    std::printf("\n%-28s %8s %14s %14s %10s\n", "reduction alone, 2 inputs", "size", "fast ms", "reference ms",
                "speed-up");
    for (DataType t : {DataType::kFloat32, DataType::kBfloat16}) {
      const uint64_t esz = payload::DataTypeSize(t), count = s / esz;
      std::vector<uint8_t> a(s, 0x3F), b(s, 0x40), out(s);
      std::vector<const uint8_t*> in = {a.data(), b.data()};
      payload::ExchangeOp op;
      op.op = payload::OpKind::kAllReduce;
      op.dtype = t;
      op.nranks = 2;
      op.count = count;
      std::vector<double> tf, tr;
      for (int rep = 0; rep < std::min(reps, 3); ++rep) {
        auto t0 = Clock::now();
        payload::ExchangeReduce(op, in, 0, count, out.data());
        auto t1 = Clock::now();
        payload::ExchangeReduceReference(op, in, 0, count, out.data());
        auto t2 = Clock::now();
        tf.push_back(Seconds(t0, t1));
        tr.push_back(Seconds(t1, t2));
      }
      std::printf("%-28s %4llu MiB %14.3f %14.3f %10.2f\n", t == DataType::kFloat32 ? "  fp32 sum" : "  bf16 sum",
                  static_cast<unsigned long long>(s >> 20), Median(tf) * 1e3, Median(tr) * 1e3, Median(tr) / Median(tf));
    }
  }

  int failed = 0;
  for (int k : ranks_list) {
    const int world = with_virtual ? std::max(8, k) : k;
    std::vector<int> real;
    for (int r = 0; r < k; ++r) real.push_back(r);
    ncclUniqueId id{};
    std::memcpy(id.internal, "PRISMRID", 8);
    std::mt19937_64 rng(static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    for (int b = 8; b < 32; b += 8) {
      const uint64_t x = rng();
      std::memcpy(id.internal + b, &x, 8);
    }
    // Children first (before the coordinator's threads exist), told the socket through a pipe.
    std::vector<pid_t> pids;
    std::vector<int> go_w, res_r;
    for (int r = 0; r < k; ++r) {
      int go[2], res[2];
      if (::pipe(go) != 0 || ::pipe(res) != 0) return 1;
      pid_t pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        ::close(res[0]);
        char path[512] = {0};
        uint32_t len = 0;
        if (!ReadFull(go[0], &len, 4) || len >= sizeof(path) || !ReadFull(go[0], path, len)) _exit(1);
        _exit(RankMain(r, world, real, path, id, cases, reps, res[1]));
      }
      ::close(go[0]);
      ::close(res[1]);
      pids.push_back(pid);
      go_w.push_back(go[1]);
      res_r.push_back(res[0]);
    }
    coord::CoordinatorOptions o;
    o.world_size = world;
    o.real_ranks = real;
    o.passthrough = false;
    o.hang_timeout_s = 0;
    o.status_interval_ms = 1000;
    char tmpl[] = "/tmp/prism_xbench_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    o.out_dir = tmpl;
    std::string error;
    auto coord = coord::Coordinator::Start(o, &error);
    if (!coord) {
      std::fprintf(stderr, "coordinator: %s\n", error.c_str());
      return 1;
    }
    const std::string& sock = coord->endpoints().socket_path;
    for (int w : go_w) {
      uint32_t len = static_cast<uint32_t>(sock.size());
      WriteFull(w, &len, 4);
      WriteFull(w, sock.data(), len);
      ::close(w);
    }
    std::printf("\n%d real ranks, communicator of %d members (%s)\n", k, world,
                world == k ? "all real" : "the others virtual");
    std::printf("%-21s %8s %12s %10s %10s %14s %12s\n", "case", "size", "median ms", "algbw GB/s", "busbw GB/s",
                "x socket rtt", "ms/rep all");
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& cs = cases[ci];
      std::vector<std::vector<double>> per_rank(static_cast<size_t>(k), std::vector<double>(static_cast<size_t>(reps)));
      bool ok = true;
      for (int r = 0; r < k; ++r) ok = ok && ReadFull(res_r[static_cast<size_t>(r)], per_rank[static_cast<size_t>(r)].data(), reps * sizeof(double));
      if (!ok) {
        std::printf("%-21s a rank failed\n", cs.name);
        failed = 1;
        break;
      }
      std::vector<double> slowest(static_cast<size_t>(reps), 0);
      for (int rep = 0; rep < reps; ++rep) {
        for (int r = 0; r < k; ++r) slowest[static_cast<size_t>(rep)] = std::max(slowest[static_cast<size_t>(rep)], per_rank[static_cast<size_t>(r)][static_cast<size_t>(rep)]);
      }
      const double t = Median(slowest);
      const double alg = static_cast<double>(cs.bytes) / t / 1e9;
      const double factor = cs.op == payload::OpKind::kAllGather ? (world - 1.0) / world : 2.0 * (world - 1.0) / world;
      const double rtt = base_rtt[ci / 3];
      std::string all;
      for (double x : slowest) all += (all.empty() ? "" : ",") + std::to_string(static_cast<int>(std::lround(x * 1e3)));
      std::printf("%-21s %4llu MiB %12.3f %10.3f %10.3f %14.2f  %s\n", cs.name,
                  static_cast<unsigned long long>(cs.bytes >> 20), t * 1e3, alg, alg * factor, t / rtt, all.c_str());
      std::fflush(stdout);
    }
    for (size_t r = 0; r < pids.size(); ++r) {
      int st = 0;
      ::waitpid(pids[r], &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        std::printf("rank %zu exited with %d (wrong output or failure; see stderr)\n", r, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        failed = 1;
      }
      ::close(res_r[r]);
    }
    coord->Stop();
    coord.reset();
    std::string rm = std::string("rm -rf ") + tmpl;
    if (std::system(rm.c_str()) != 0) {}
  }
  return failed;
}
