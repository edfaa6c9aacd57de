// Every NCCL operation x dtype x reduction op x policy, in place and out of place, odd counts: the planner plus
// the CPU executor (what the GPU kernels compute, bit for bit) against an independent reference that simulates
// the n member buffers explicitly and runs the whole collective (semantics_reference.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "nccl_patch/semantics.h"
#include "semantics_reference.h"

namespace prism::payload {
namespace {

constexpr uint64_t kSeed = 42;
constexpr uint64_t kComm = 0xC0FFEE;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint8_t kRecvByte = 0x5A;  // what the output holds before the operation ("untouched" is checkable)
constexpr size_t kGuard = 64;

struct Case {
  OpKind op = OpKind::kAllReduce;
  DataType dt = DataType::kFloat32;
  RedOp redop = RedOp::kSum;
  Policy policy = Policy::kMirror;
  int n = 1;
  int rank = 0;
  int root = 0;
  uint64_t count = 1;
  bool in_place = false;
  bool has_mirror_send = false;  // recv: a prior send of the same size exists
  double scalar = 0;             // PreMulSum
  uint64_t seq = 0;

  std::string Name() const {
    std::ostringstream s;
    s << OpKindName(op) << " " << DataTypeName(dt) << " " << RedOpName(redop) << " " << PolicyName(policy) << " n=" << n
      << " rank=" << rank << " root=" << root << " count=" << count << (in_place ? " in-place" : " out-of-place")
      << (has_mirror_send ? " +send" : "") << " scalar=" << scalar;
    return s.str();
  }
};

bool IsReduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}

// Element counts of the send and recv buffers, as NCCL defines them.
void Shapes(const Case& c, uint64_t* send, uint64_t* recv) {
  const uint64_t n = static_cast<uint64_t>(c.n);
  *send = *recv = c.count;
  switch (c.op) {
    case OpKind::kReduceScatter: case OpKind::kScatter: *send = n * c.count; break;
    case OpKind::kAllGather: case OpKind::kGather: *recv = n * c.count; break;
    case OpKind::kAllToAll: *send = *recv = n * c.count; break;
    default: break;
  }
}

// Offset (elements) of the send buffer inside the recv buffer (or recv inside send) for in-place operation.
// Returns true when the send buffer is the larger region.
bool InPlaceLayout(const Case& c, uint64_t* offset) {
  const uint64_t r = static_cast<uint64_t>(c.rank);
  const uint64_t root = static_cast<uint64_t>(c.root);
  switch (c.op) {
    case OpKind::kReduceScatter: *offset = r * c.count; return true;        // recv = send + rank*count
    case OpKind::kScatter: *offset = root * c.count; return true;           // recv = send + root*count
    case OpKind::kAllGather: *offset = r * c.count; return false;           // send = recv + rank*count
    case OpKind::kGather: *offset = root * c.count; return false;           // send = recv + root*count
    default: *offset = 0; return false;
  }
}

// Interesting values per type: written through the reference rounding, so each is representable.
std::vector<long double> FloatValues(const Case& c, std::mt19937_64& gen) {
  const long double inf = std::numeric_limits<long double>::infinity();
  const long double nan = std::numeric_limits<long double>::quiet_NaN();
  if (c.redop == RedOp::kProd && IsReduction(c.op)) {
    // Few significant bits: x^n (n <= 5) is exact in double, so the reference's product is the exact one.
    return {0.0L, -0.0L, 1, -1, 1.5L, -0.75L, 2, 0.5L, -3, 1.25L, 100, -0.125L, inf, nan};
  }
  std::vector<long double> v = {0.0L, -0.0L, 1, -1, 1.0078125L, 1 + 0x1p-10L, 3.14159265358979L, -2.718281828L,
                                1e-3L, 65000, 400, -300, 1e-30L, 0x1p-24L, 0x1p-9L, inf, -inf, nan};
  for (int i = 0; i < 40; ++i) {
    v.push_back(std::ldexp(static_cast<long double>(static_cast<int64_t>(gen() >> 11) - (int64_t{1} << 52)),
                           -50 - static_cast<int>(gen() % 4)));
  }
  return v;
}
std::vector<__int128> IntValues(std::mt19937_64& gen) {
  std::vector<__int128> v = {0, 1, -1, 2, -2, 127, -128, 255, 3, 1000, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
  for (int i = 0; i < 20; ++i) v.push_back(static_cast<int64_t>(gen()));
  return v;
}

void StoreValue(void* p, const Case& c, long double fv, __int128 iv) {
  if (ref::IsFloat(c.dt)) {
    ref::StoreFloat(p, fv, c.dt);
  } else {
    ref::StoreInt(p, iv, c.dt);
  }
}

// The reduction of the n members' element (all `member_elem`, by the mirror model), into `out`.
void RefReduce(const Case& c, const std::vector<const uint8_t*>& member_elem, void* out) {
  const size_t es = DataTypeSize(c.dt);
  const int n = static_cast<int>(member_elem.size());
  if (ref::IsFloat(c.dt)) {
    std::vector<long double> vals(member_elem.size());
    for (int j = 0; j < n; ++j) vals[j] = ref::LoadFloat(member_elem[j], c.dt);
    std::vector<uint8_t> tmp(es);
    switch (c.redop) {
      case RedOp::kSum: case RedOp::kProd: case RedOp::kAvg: {
        if (n == 1 || (c.redop == RedOp::kAvg && !std::isfinite(vals[0]))) {
          // One member: NCCL copies. Avg of non-finite values: the rule is "output = input", bit for bit.
          std::memcpy(out, member_elem[0], es);
          return;
        }
        long double acc = vals[0];
        for (int j = 1; j < n; ++j) acc = c.redop == RedOp::kProd ? acc * vals[j] : acc + vals[j];
        if (c.redop == RedOp::kAvg) acc /= n;
        ref::StoreFloat(out, acc, c.dt);
        return;
      }
      case RedOp::kMax: case RedOp::kMin: {
        int best = 0;
        for (int j = 1; j < n; ++j) {
          if (c.redop == RedOp::kMax ? vals[j] > vals[best] : vals[j] < vals[best]) best = j;
        }
        std::memcpy(out, member_elem[best], es);
        return;
      }
      case RedOp::kPreMulSum: {
        std::vector<uint8_t> s(es);
        ref::StoreFloat(s.data(), c.scalar, c.dt);
        const long double sv = ref::LoadFloat(s.data(), c.dt);
        long double acc = 0;
        for (int j = 0; j < n; ++j) {
          ref::StoreFloat(tmp.data(), sv * vals[j], c.dt);  // each member pre-multiplies, rounded to T
          const long double m = ref::LoadFloat(tmp.data(), c.dt);
          acc = j == 0 ? m : acc + m;
        }
        if (n == 1) {
          std::memcpy(out, tmp.data(), es);  // the pre-multiplied value itself (NaN/Inf kept as rounded)
        } else {
          ref::StoreFloat(out, acc, c.dt);
        }
        return;
      }
    }
    return;
  }
  std::vector<__int128> vals(member_elem.size());
  for (int j = 0; j < n; ++j) vals[j] = ref::LoadInt(member_elem[j], c.dt);
  switch (c.redop) {
    case RedOp::kSum: {
      unsigned __int128 acc = 0;
      for (int j = 0; j < n; ++j) acc += static_cast<unsigned __int128>(vals[j]);
      ref::StoreInt(out, static_cast<__int128>(acc), c.dt);
      return;
    }
    case RedOp::kProd: {
      uint64_t acc = 1;
      for (int j = 0; j < n; ++j) acc *= static_cast<uint64_t>(vals[j]);
      ref::StoreInt(out, acc, c.dt);
      return;
    }
    case RedOp::kAvg: {
      __int128 acc = 0;
      for (int j = 0; j < n; ++j) acc += vals[j];
      ref::StoreInt(out, acc / n, c.dt);
      return;
    }
    case RedOp::kMax: case RedOp::kMin: {
      int best = 0;
      for (int j = 1; j < n; ++j) {
        if (c.redop == RedOp::kMax ? vals[j] > vals[best] : vals[j] < vals[best]) best = j;
      }
      std::memcpy(out, member_elem[best], es);
      return;
    }
    case RedOp::kPreMulSum: {
      std::vector<uint8_t> s(es);
      ref::StoreInt(s.data(), static_cast<__int128>(c.scalar), c.dt);
      const __int128 sv = ref::LoadInt(s.data(), c.dt);
      unsigned __int128 acc = 0;
      std::vector<uint8_t> tmp(es);
      for (int j = 0; j < n; ++j) {
        ref::StoreInt(tmp.data(), static_cast<__int128>(static_cast<uint64_t>(sv) * static_cast<uint64_t>(vals[j])),
                      c.dt);
        acc += static_cast<unsigned __int128>(ref::LoadInt(tmp.data(), c.dt));
      }
      ref::StoreInt(out, static_cast<__int128>(acc), c.dt);
      return;
    }
  }
}

// Runs one case through RunCpu and through the reference; compares every byte of memory involved.
void RunCase(const Case& c) {
  SCOPED_TRACE(c.Name());
  const size_t es = DataTypeSize(c.dt);
  const uint64_t n = static_cast<uint64_t>(c.n);
  const uint64_t r = static_cast<uint64_t>(c.rank);
  uint64_t send_elems = 0;
  uint64_t recv_elems = 0;
  Shapes(c, &send_elems, &recv_elems);

  // Memory: [guard][region A][guard][region B][guard][mirror send][guard].
  uint64_t inplace_off = 0;
  const bool send_is_outer = InPlaceLayout(c, &inplace_off);
  const size_t a_bytes = c.in_place ? std::max(send_elems, recv_elems) * es : send_elems * es;
  const size_t b_bytes = c.in_place ? 0 : recv_elems * es;
  const size_t m_bytes = c.count * es;
  std::vector<uint8_t> mem(4 * kGuard + a_bytes + b_bytes + m_bytes + kGuard, kGuardByte);
  uint8_t* a = mem.data() + kGuard;
  uint8_t* b = a + a_bytes + kGuard;
  uint8_t* mirror = b + b_bytes + kGuard;
  uint8_t* send = a;
  uint8_t* recv = b;
  if (c.in_place) {
    if (send_is_outer) {
      recv = a + inplace_off * es;
    } else {
      recv = a;
      send = a + inplace_off * es;
    }
  }
  std::memset(recv, kRecvByte, recv_elems * es);
  if (c.in_place && send_is_outer) std::memset(a, kRecvByte, a_bytes);

  // Inputs.
  std::mt19937_64 gen(c.seq * 7919 + 1);
  const std::vector<long double> fvals = FloatValues(c, gen);
  const std::vector<__int128> ivals = IntValues(gen);
  for (uint64_t i = 0; i < send_elems; ++i) {
    StoreValue(send + i * es, c, fvals[gen() % fvals.size()], ivals[gen() % ivals.size()]);
  }
  for (uint64_t i = 0; i < c.count; ++i) {
    StoreValue(mirror + i * es, c, fvals[gen() % fvals.size()], ivals[gen() % ivals.size()]);
  }
  const std::vector<uint8_t> input(send, send + send_elems * es);

  // Reference: expected memory = memory now, with the outputs the collective gives this rank.
  std::vector<uint8_t> want = mem;
  uint8_t* want_recv = want.data() + (recv - mem.data());
  // Member j's send buffer under mirror: identical to this rank's, except all-to-all, where member j sends this
  // rank what this rank sends j (member j's buffer is this rank's with chunks `rank` and j swapped). Returned as a
  // pointer to element `e` of member j's buffer (no copies: n reaches 8192).
  auto member = [&](uint64_t j, uint64_t e) -> const uint8_t* {
    if (c.op == OpKind::kAllToAll && j != r) {
      const uint64_t chunk = e / c.count;
      const uint64_t within = e % c.count;
      if (chunk == r) return input.data() + (j * c.count + within) * es;
      if (chunk == j) return input.data() + (r * c.count + within) * es;
    }
    return input.data() + e * es;
  };
  const bool mirror_policy = c.policy == Policy::kMirror;
  const uint64_t key = ref::RefKey(kSeed, kComm, c.seq);
  auto fill = [&](uint64_t first, uint64_t elems, Policy p) {  // output elements [first, first+elems) are virtual
    for (uint64_t i = first; i < first + elems; ++i) {
      if (p == Policy::kZeros) {
        std::memset(want_recv + i * es, 0, es);
      } else {
        ref::RefRandomElement(want_recv + i * es, c.dt, key, i);
      }
    }
  };
  const bool is_root = c.rank == c.root;
  auto reduce_into = [&](uint64_t src_first) {
    if (!mirror_policy) return fill(0, c.count, c.policy);
    for (uint64_t i = 0; i < c.count; ++i) {
      std::vector<const uint8_t*> elems;
      for (uint64_t j = 0; j < n; ++j) elems.push_back(member(j, src_first + i));
      RefReduce(c, elems, want_recv + i * es);
    }
  };
  // Chunk k of the output comes from member k's chunk `from_chunk` (or its whole buffer when from_chunk < 0).
  auto gather_into = [&](int64_t from_chunk) {
    for (uint64_t k = 0; k < n; ++k) {
      if (k != r && !mirror_policy) {
        fill(k * c.count, c.count, c.policy);
        continue;
      }
      const uint64_t first = from_chunk < 0 ? 0 : static_cast<uint64_t>(from_chunk) * c.count;
      for (uint64_t i = 0; i < c.count; ++i) std::memcpy(want_recv + (k * c.count + i) * es, member(k, first + i), es);
    }
  };
  switch (c.op) {
    case OpKind::kAllReduce: reduce_into(0); break;
    case OpKind::kReduce: if (is_root) reduce_into(0); break;
    case OpKind::kReduceScatter: reduce_into(r * c.count); break;
    case OpKind::kAllGather: gather_into(-1); break;
    case OpKind::kGather: if (is_root) gather_into(-1); break;
    case OpKind::kAllToAll: gather_into(static_cast<int64_t>(r)); break;
    case OpKind::kBroadcast:
      if (is_root || mirror_policy) {
        for (uint64_t i = 0; i < c.count; ++i) std::memcpy(want_recv + i * es, member(static_cast<uint64_t>(c.root), i), es);
      } else {
        fill(0, c.count, c.policy);
      }
      break;
    case OpKind::kScatter:
      if (is_root) {
        std::memcpy(want_recv, input.data() + r * c.count * es, c.count * es);
      } else if (!mirror_policy) {
        fill(0, c.count, c.policy);
      }
      // mirror, virtual root: recv unchanged (docs/payload.md).
      break;
    case OpKind::kRecv:
      if (mirror_policy && c.has_mirror_send) {
        std::memcpy(want_recv, mirror, c.count * es);
      } else {
        fill(0, c.count, mirror_policy ? Policy::kRandom : c.policy);
      }
      break;
    case OpKind::kSend: case OpKind::kInvalid: break;
  }

  // Under test.
  OpDesc d;
  d.op = c.op;
  d.dtype = c.dt;
  d.redop = c.redop;
  d.policy = c.policy;
  d.nranks = c.n;
  d.rank = c.rank;
  d.root = c.root;
  d.peer = (c.rank + 1) % c.n;
  d.count = c.count;
  d.send_addr = reinterpret_cast<uint64_t>(send);
  d.recv_addr = reinterpret_cast<uint64_t>(recv);
  d.seed = kSeed;
  d.comm_id = kComm;
  d.seq = c.seq;
  d.mirror_send_addr = c.has_mirror_send ? reinterpret_cast<uint64_t>(mirror) : 0;
  if (c.redop == RedOp::kPreMulSum) {
    uint64_t bits = 0;
    if (ref::IsFloat(c.dt)) {
      ref::StoreFloat(&bits, c.scalar, c.dt);
    } else {
      ref::StoreInt(&bits, static_cast<__int128>(c.scalar), c.dt);
    }
    d.premul_scalar_bits = bits;
  }
  StepList steps;
  ASSERT_EQ(Plan(d, &steps), Status::kOk);
  ASSERT_LE(steps.size, kMaxSteps);
  for (uint32_t i = 0; i < steps.size; ++i) {
    const Step& s = steps.steps[i];
    ASSERT_NE(s.kind, StepKind::kNoop);
    if (s.kind != StepKind::kCopy && s.kind != StepKind::kTile && s.kind != StepKind::kFillZero) {
      ASSERT_EQ(s.bytes, s.count * es);
    }
    if (s.kind == StepKind::kCopy) {
      ASSERT_NE(StepAddr(d, s.dst_buf, s.dst_offset), StepAddr(d, s.src_buf, s.src_offset));
    }
  }
  ASSERT_EQ(RunCpu(d), Status::kOk);

  for (size_t i = 0; i < mem.size(); ++i) {
    if (mem[i] != want[i]) {
      const uint8_t* p = mem.data() + i;
      std::ostringstream where;
      if (p >= recv && p < recv + recv_elems * es) where << "recv element " << (p - recv) / es;
      else if (p >= send && p < send + send_elems * es) where << "send element " << (p - send) / es;
      else where << "byte " << i << " outside the outputs";
      ADD_FAILURE() << "first difference at " << where.str() << ": got 0x" << std::hex << int{mem[i]} << " want 0x"
                    << int{want[i]};
      return;
    }
  }
}

const DataType kAllTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
                              DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
                              DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
const RedOp kAllRedOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg, RedOp::kPreMulSum};
const Policy kPolicies[] = {Policy::kMirror, Policy::kZeros, Policy::kRandom};
const int kSizes[] = {1, 2, 3, 5};
const uint64_t kCounts[] = {1, 7, 33};

std::vector<int> RanksFor(int n) {
  std::vector<int> v = {0};
  if (n > 1) v.push_back(n - 1);
  if (n > 2) v.push_back(1);
  return v;
}

// All cases of one op; `scalars` for PreMulSum.
int RunOp(OpKind op) {
  int cases = 0;
  uint64_t seq = static_cast<uint64_t>(op) * 1000003;
  const bool reduction = IsReduction(op);
  const bool rooted = op == OpKind::kBroadcast || op == OpKind::kReduce || op == OpKind::kGather ||
                      op == OpKind::kScatter;
  for (Policy policy : kPolicies) {
    for (DataType dt : kAllTypes) {
      for (RedOp redop : kAllRedOps) {
        if (!reduction && redop != RedOp::kSum) continue;
        std::vector<double> scalars = {0};
        if (redop == RedOp::kPreMulSum) {
          scalars = ref::IsFloat(dt) ? std::vector<double>{0.5, 3, -1.25} : std::vector<double>{3, -2};
          if (ref::IsFloat(dt) && dt != DataType::kFloat64) scalars.push_back(1.0 / 3.0);
        }
        for (double scalar : scalars) {
          for (int n : kSizes) {
            for (int rank : RanksFor(n)) {
              std::vector<int> roots = {0};
              if (rooted && n > 1) roots = {0, n - 1};
              for (int root : roots) {
                for (uint64_t count : kCounts) {
                  for (int in_place = 0; in_place < 2; ++in_place) {
                    for (int has_send = 0; has_send < (op == OpKind::kRecv ? 2 : 1); ++has_send) {
                      Case c;
                      c.op = op;
                      c.dt = dt;
                      c.redop = redop;
                      c.policy = policy;
                      c.n = n;
                      c.rank = rank;
                      c.root = root;
                      c.count = count;
                      c.in_place = in_place != 0;
                      c.has_mirror_send = has_send != 0;
                      c.scalar = scalar;
                      c.seq = ++seq;
                      RunCase(c);
                      ++cases;
                      if (::testing::Test::HasFailure()) return cases;
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return cases;
}

TEST(SemanticsCollective, AllReduce) { EXPECT_GT(RunOp(OpKind::kAllReduce), 1000); }
TEST(SemanticsCollective, Reduce) { EXPECT_GT(RunOp(OpKind::kReduce), 1000); }
TEST(SemanticsCollective, ReduceScatter) { EXPECT_GT(RunOp(OpKind::kReduceScatter), 1000); }
TEST(SemanticsCollective, AllGather) { EXPECT_GT(RunOp(OpKind::kAllGather), 100); }
TEST(SemanticsCollective, Gather) { EXPECT_GT(RunOp(OpKind::kGather), 100); }
TEST(SemanticsCollective, AllToAll) { EXPECT_GT(RunOp(OpKind::kAllToAll), 100); }
TEST(SemanticsCollective, Broadcast) { EXPECT_GT(RunOp(OpKind::kBroadcast), 100); }
TEST(SemanticsCollective, Scatter) { EXPECT_GT(RunOp(OpKind::kScatter), 100); }
TEST(SemanticsCollective, Recv) { EXPECT_GT(RunOp(OpKind::kRecv), 100); }
TEST(SemanticsCollective, SendWritesNothing) { EXPECT_GT(RunOp(OpKind::kSend), 100); }

// Communicators of the size Prism emulates: the reference really sums 8192 member buffers.
TEST(SemanticsCollective, LargeCommunicators) {
  uint64_t seq = 1u << 30;
  for (DataType dt : kAllTypes) {
    for (int n : {1024, 8192}) {
      if (dt == DataType::kFloat64 && n > 1024) continue;  // the reference's long double sum is exact to 2^11 copies
      for (OpKind op : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather, OpKind::kAllToAll}) {
        for (RedOp redop : {RedOp::kSum, RedOp::kAvg, RedOp::kPreMulSum}) {
          if (!IsReduction(op) && redop != RedOp::kSum) continue;
          for (Policy policy : {Policy::kMirror, Policy::kRandom}) {
            Case c;
            c.op = op;
            c.dt = dt;
            c.redop = redop;
            c.policy = policy;
            c.n = n;
            c.rank = n / 2 + 1;
            c.count = 3;
            c.in_place = (seq % 2) == 0;
            c.scalar = ref::IsFloat(dt) ? 0.5 : 3;
            c.seq = ++seq;
            RunCase(c);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace prism::payload
