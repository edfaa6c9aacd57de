// The exchange's fast paths against the code they replaced (docs/payload.md "Exchange", "Throughput"):
//  - ExchangeReduce (compile-time dtype/op, blocks, threads, bf16/fp16 shortcuts) against ExchangeReduceReference
//    (one element at a time through dtype_math.h), byte for byte, every dtype x every op x member counts, with
//    special values (NaN, Inf, subnormals, overflow, ties);
//  - the hub computing an all-reduce's output once: every member still gets its own header and the right bytes,
//    over several chunks;
//  - libprism's client reading a result straight into the waiter's buffer (CoordExpectResult), and falling back
//    to a string when it does not fit, against a scripted coordinator.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/ipc_io.h"
#include "coordinator/bus/exchange_hub.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/runtime.h"
#include "nccl_patch/dtype_math.h"
#include "nccl_patch/exchange.h"

namespace prism {
namespace {

using payload::DataType;
using payload::ExchangeOp;
using payload::OpKind;
using payload::RedOp;

// Random element codes of `esz` bytes, with a share of special codes per dtype: NaN, +-Inf, max finite, subnormals,
// zero and -0, and the largest values (to overflow under SUM/PROD).
std::vector<uint8_t> RandomCodes(DataType t, uint64_t count, std::mt19937_64& rng) {
  const uint32_t esz = payload::DataTypeSize(t);
  std::vector<uint8_t> b(count * esz);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v = rng();
    const uint64_t pick = rng() % 16;
    if (pick == 0) {
      switch (t) {  // specials
        case DataType::kFloat32: {
          const uint32_t s[] = {0x7FC00001u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0x00000001u, 0x80000000u, 0x00800000u};
          v = s[rng() % 7];
          break;
        }
        case DataType::kFloat64: {
          const uint64_t s[] = {0x7FF0000000000001ull, 0x7FF0000000000000ull, 0x7FEFFFFFFFFFFFFFull, 1ull,
                                0x8000000000000000ull};
          v = s[rng() % 5];
          break;
        }
        case DataType::kBfloat16: {
          const uint16_t s[] = {0x7FC1, 0x7F80, 0xFF80, 0x7F7F, 0x0001, 0x8000, 0x0080, 0x007F};
          v = s[rng() % 8];
          break;
        }
        case DataType::kFloat16: {
          const uint16_t s[] = {0x7E01, 0x7C00, 0xFC00, 0x7BFF, 0x0001, 0x8000, 0x0400, 0x03FF};
          v = s[rng() % 8];
          break;
        }
        default:
          v = (rng() & 1) ? ~uint64_t{0} : (uint64_t{1} << (esz * 8 - 1));
      }
    } else if (pick < 6 && (t == DataType::kBfloat16 || t == DataType::kFloat16 || t == DataType::kFloat32)) {
      // Values near 1 whose sums and products round (ties included).
      const double x = 1.0 + static_cast<double>(rng() % 256) / 256.0;
      if (t == DataType::kFloat32) {
        float f = static_cast<float>(x);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        v = u;
      } else {
        v = payload::math::EncodeSmallFloat(x, t == DataType::kBfloat16 ? payload::math::FormatBf16()
                                                                        : payload::math::FormatF16());
      }
    }
    std::memcpy(b.data() + i * esz, &v, esz);
  }
  return b;
}

const DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,       DataType::kUint32,
                           DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,     DataType::kFloat32,
                           DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
const RedOp kOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg, RedOp::kPreMulSum};

// Every dtype x op x member count, counts that cross the block size, an offset (reduce-scatter's chunk).
TEST(ExchangeFast, ReduceMatchesTheReferenceByteForByte) {
  std::mt19937_64 rng(42);
  int cases = 0;
  for (DataType t : kTypes) {
    const uint32_t esz = payload::DataTypeSize(t);
    for (RedOp r : kOps) {
      for (int n : {1, 2, 3, 5}) {
        for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{1500}, uint64_t{3000}}) {
          const uint64_t first = count == 1500 ? 11 : 0;
          std::vector<std::vector<uint8_t>> bufs;
          std::vector<const uint8_t*> in;
          for (int j = 0; j < n; ++j) bufs.push_back(RandomCodes(t, first + count, rng));
          for (auto& b : bufs) in.push_back(b.data());
          ExchangeOp op;
          op.op = OpKind::kAllReduce;
          op.dtype = t;
          op.redop = r;
          op.nranks = n;
          op.count = count;
          const auto sc = RandomCodes(t, 1, rng);
          std::memcpy(&op.premul_scalar_bits, sc.data(), esz);
          std::vector<uint8_t> fast(count * esz, 0xAB), ref(count * esz, 0xCD);
          ASSERT_TRUE(payload::ExchangeReduce(op, in, first, count, fast.data()));
          ASSERT_TRUE(payload::ExchangeReduceReference(op, in, first, count, ref.data()));
          for (uint64_t i = 0; i < count * esz; ++i) {
            ASSERT_EQ(fast[i], ref[i]) << "dtype " << static_cast<int>(t) << " op " << static_cast<int>(r) << " n "
                                       << n << " count " << count << " byte " << i;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 12 * 6 * 4 * 4);
}

// The bf16/fp16 rounding shortcut, on many sums and scaled values whose exact results need rounding: ties to even,
// carries into the exponent, overflow to Inf, results that are subnormal (the shortcut hands those over).
TEST(ExchangeFast, NarrowFloatRoundingMatchesTheReference) {
  std::mt19937_64 rng(7);
  for (DataType t : {DataType::kBfloat16, DataType::kFloat16}) {
    for (RedOp r : {RedOp::kSum, RedOp::kAvg, RedOp::kPreMulSum, RedOp::kProd}) {
      const uint64_t count = 200000;
      std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(count * 2));
      for (auto& b : bufs) {
        for (uint64_t i = 0; i < count; ++i) {
          const uint16_t c = static_cast<uint16_t>(rng());
          std::memcpy(b.data() + i * 2, &c, 2);
        }
      }
      std::vector<const uint8_t*> in = {bufs[0].data(), bufs[1].data(), bufs[2].data()};
      ExchangeOp op;
      op.op = OpKind::kAllReduce;
      op.dtype = t;
      op.redop = r;
      op.nranks = 3;
      op.count = count;
      op.premul_scalar_bits = t == DataType::kBfloat16 ? 0x3EAB : 0x3555;  // ~1/3
      std::vector<uint8_t> fast(count * 2), ref(count * 2);
      ASSERT_TRUE(payload::ExchangeReduce(op, in, 0, count, fast.data()));
      ASSERT_TRUE(payload::ExchangeReduceReference(op, in, 0, count, ref.data()));
      ASSERT_EQ(fast, ref) << "dtype " << static_cast<int>(t) << " op " << static_cast<int>(r);
    }
  }
}

// A reduction split over threads writes the same bytes as the reference.
TEST(ExchangeFast, ThreadedReduceMatchesTheReference) {
  std::mt19937_64 rng(3);
  payload::SetExchangeReduceThreadsForTest(3);
  for (DataType t : {DataType::kFloat32, DataType::kBfloat16, DataType::kInt32, DataType::kFloat8e4m3}) {
    const uint32_t esz = payload::DataTypeSize(t);
    const uint64_t count = 100003;
    std::vector<std::vector<uint8_t>> bufs = {RandomCodes(t, count, rng), RandomCodes(t, count, rng)};
    std::vector<const uint8_t*> in = {bufs[0].data(), bufs[1].data()};
    ExchangeOp op;
    op.op = OpKind::kAllReduce;
    op.dtype = t;
    op.nranks = 2;
    op.count = count;
    std::vector<uint8_t> fast(count * esz), ref(count * esz);
    ASSERT_TRUE(payload::ExchangeReduce(op, in, 0, count, fast.data()));
    ASSERT_TRUE(payload::ExchangeReduceReference(op, in, 0, count, ref.data()));
    EXPECT_EQ(fast, ref) << "dtype " << static_cast<int>(t);
  }
  payload::SetExchangeReduceThreadsForTest(0);
}

// ---- the hub: an all-reduce's output computed once, sent to every member with its own header -----------------

ipc::ExchangeHeader Header(OpKind op, uint64_t key, int rank, uint64_t count, uint64_t total, uint64_t offset,
                           uint32_t seq) {
  ipc::ExchangeHeader h{};
  h.comm_id = 3;
  h.op = static_cast<uint16_t>(op);
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.key = key;
  h.rank = rank;
  h.peer = -1;
  h.count = count;
  h.total_bytes = total;
  h.offset = offset;
  h.seq = seq;
  return h;
}

struct Decoded {
  std::vector<ipc::ExchangeHeader> headers;
  std::string bytes;
};
Decoded DecodeFrames(const std::string& frames) {
  ipc::FrameDecoder d(ipc::kMaxFrameBytes);
  d.Feed(frames.data(), frames.size());
  ipc::Frame f;
  Decoded out;
  while (d.Next(&f) == ipc::DecodeStatus::kFrame) {
    EXPECT_EQ(f.type, ipc::MsgType::kOpResult);
    ipc::ExchangeHeader h{};
    std::memcpy(&h, f.payload.data(), sizeof(h));
    out.headers.push_back(h);
    out.bytes += f.payload.substr(sizeof(h));
  }
  EXPECT_EQ(d.buffered(), 0u);
  return out;
}

// 3 real members of 4 (member 3 virtual: it stands in with member 0's input), 10 MiB each in two chunks.
TEST(ExchangeFast, HubSendsOneAllReduceResultToEveryMemberWithItsOwnHeader) {
  coord::ExchangeHub hub;
  hub.AddComm(3, {10, 11, 12, 13}, {true, true, true, false});
  const uint64_t count = (10u << 20) / 4, total = count * 4;
  std::vector<std::string> inputs;
  for (int r = 0; r < 3; ++r) {
    std::vector<float> v(count);
    for (uint64_t i = 0; i < count; ++i) v[i] = static_cast<float>(r * 1000) + static_cast<float>(i % 97);
    inputs.emplace_back(reinterpret_cast<const char*>(v.data()), total);
  }
  std::vector<coord::ExchangeHub::Outgoing> out;
  for (int r = 0; r < 3; ++r) {
    for (uint64_t off = 0; off < total; off += ipc::kExchangeChunkBytes) {
      const uint64_t n = std::min<uint64_t>(ipc::kExchangeChunkBytes, total - off);
      EXPECT_EQ(hub.OnData(10 + r, Header(OpKind::kAllReduce, 5, r, count, total, off, 100 + r),
                           std::string_view(inputs[r]).substr(off, n), &out),
                "");
    }
  }
  ASSERT_EQ(out.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r].rank, 10 + r);
    Decoded d = DecodeFrames(out[r].frames);
    ASSERT_EQ(d.headers.size(), 2u);
    EXPECT_EQ(d.headers[0].offset, 0u);
    EXPECT_EQ(d.headers[1].offset, ipc::kExchangeChunkBytes);
    for (const auto& h : d.headers) {
      EXPECT_EQ(h.rank, r);
      EXPECT_EQ(h.seq, 100u + r);
      EXPECT_EQ(h.key, 5u);
      EXPECT_EQ(h.total_bytes, total);
      EXPECT_EQ(h.flags, 0u);
    }
    ASSERT_EQ(d.bytes.size(), total);
    std::vector<float> got(count);
    std::memcpy(got.data(), d.bytes.data(), total);
    for (uint64_t i = 0; i < count; i += 4099) {
      // inputs 0, 1, 2 and member 3 = member 0's: 0 + 1000 + 2000 + 0 + 4 * (i % 97)
      ASSERT_EQ(got[i], 3000.0f + 4.0f * static_cast<float>(i % 97)) << i;
    }
  }
}

// A reduce-scatter's output differs per member: each still gets its own chunk.
TEST(ExchangeFast, HubReduceScatterGivesEachMemberItsChunk) {
  coord::ExchangeHub hub;
  hub.AddComm(3, {0, 1}, {true, true});
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  std::vector<coord::ExchangeHub::Outgoing> out;
  hub.OnData(0, Header(OpKind::kReduceScatter, 0, 0, 2, 16, 0, 0),
             std::string_view(reinterpret_cast<const char*>(a.data()), 16), &out);
  hub.OnData(1, Header(OpKind::kReduceScatter, 0, 1, 2, 16, 0, 0),
             std::string_view(reinterpret_cast<const char*>(b.data()), 16), &out);
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    Decoded d = DecodeFrames(out[r].frames);
    std::vector<float> got(2);
    ASSERT_EQ(d.bytes.size(), 8u);
    std::memcpy(got.data(), d.bytes.data(), 8);
    EXPECT_EQ(got, r == 0 ? (std::vector<float>{11, 22}) : (std::vector<float>{33, 44}));
  }
}

// ---- libprism's client: results straight into the waiter's buffer ----------------------------------------------

int ListenUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0) return -1;
  return fd;
}

// The scripted coordinator answers each kOpData (assembled from its chunks) with its bytes + 1, in 8 MiB chunks.
// Key 0 fits the registered buffer (in place); key 1 is larger than its buffer (a string); key 2 has no buffer.
TEST(ExchangeFast, ClientReadsResultsIntoTheRegisteredBuffer) {
  std::string path = "/tmp/prism_xfast_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0);
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err, assembled;
    for (int answered = 0; answered < 3;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 10000, &err) != ipc::IoStatus::kOk) break;
      if (f.type != ipc::MsgType::kOpData) continue;
      ipc::ExchangeHeader h{};
      std::memcpy(&h, f.payload.data(), sizeof(h));
      assembled += f.payload.substr(sizeof(h));
      if (assembled.size() < h.total_bytes) continue;
      for (char& ch : assembled) ch = static_cast<char>(ch + 1);
      for (uint64_t off = 0; off < assembled.size(); off += ipc::kExchangeChunkBytes) {
        const uint64_t n = std::min<uint64_t>(ipc::kExchangeChunkBytes, assembled.size() - off);
        ipc::ExchangeHeader r = h;
        r.offset = off;
        std::string payload(reinterpret_cast<const char*>(&r), sizeof(r));
        payload.append(assembled, off, n);
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, payload.data(), payload.size(), &err);
      }
      assembled.clear();
      ++answered;
    }
    usleep(100000);
    close(fd);
  });
  interpose::Config c;
  c.rank = 0;
  c.world_size = 2;
  c.real_ranks = {0, 1};
  c.coord_socket = path;
  interpose::ScopedRuntime rt({.config = c});
  ASSERT_TRUE(interpose::CoordConnect());

  const uint64_t big = (9u << 20) + 3;  // two chunks each way
  std::string input(big, '\0');
  for (uint64_t i = 0; i < big; ++i) input[i] = static_cast<char>(i * 7);
  auto header = [&](uint64_t key) {
    ipc::ExchangeHeader h{};
    h.comm_id = 4;
    h.op = static_cast<uint16_t>(OpKind::kAllReduce);
    h.dtype = static_cast<uint8_t>(DataType::kUint8);
    h.key = key;
    h.rank = 0;
    h.peer = -1;
    h.count = big;
    return h;
  };
  std::vector<uint8_t> dst0(big), dst1(big - 1);
  interpose::CoordExpectResult(4, 0, -1, dst0.data(), dst0.size());
  interpose::CoordExpectResult(4, 1, -1, dst1.data(), dst1.size());
  for (uint64_t key = 0; key < 3; ++key) ASSERT_TRUE(interpose::CoordSendData(header(key), input.data(), big));
  std::string want = input;
  for (char& ch : want) ch = static_cast<char>(ch + 1);

  uint32_t flags = 99;
  uint64_t size = 0;
  bool in_place = false;
  std::string bytes = "stale";
  ASSERT_TRUE(interpose::CoordWaitResultAt(4, 0, -1, &flags, &size, &in_place, &bytes));
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(size, big);
  EXPECT_TRUE(in_place);
  EXPECT_TRUE(bytes.empty());
  EXPECT_EQ(std::memcmp(dst0.data(), want.data(), big), 0);

  ASSERT_TRUE(interpose::CoordWaitResultAt(4, 1, -1, &flags, &size, &in_place, &bytes));
  EXPECT_EQ(size, big);
  EXPECT_FALSE(in_place);
  EXPECT_EQ(bytes, want);

  ASSERT_TRUE(interpose::CoordWaitResult(4, 2, -1, &flags, &bytes));
  EXPECT_EQ(bytes, want);

  server.join();
  close(lfd);
  unlink(path.c_str());
}

}  // namespace
}  // namespace prism
