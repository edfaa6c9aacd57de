#include "coordinator/bus/exchange_hub.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/ipc_io.h"
#include "nccl_patch/exchange.h"
#include "prism/limits.h"

namespace prism::coord {
namespace {

using payload::OpKind;

bool IsP2p(uint16_t op) {
  return op == static_cast<uint16_t>(OpKind::kSend) || op == static_cast<uint16_t>(OpKind::kRecv);
}

// ipc.h OpArrive's op code for a payload::OpKind (coord_client.cc IpcOp; gather/scatter as hang_detector names them).
uint32_t ArriveOpCode(uint16_t op) {
  switch (static_cast<OpKind>(op)) {
    case OpKind::kAllReduce: return 1;
    case OpKind::kAllGather: return 2;
    case OpKind::kReduceScatter: return 3;
    case OpKind::kBroadcast: return 4;
    case OpKind::kReduce: return 5;
    case OpKind::kAllToAll: return 6;
    case OpKind::kGather: return 8;
    case OpKind::kScatter: return 9;
    case OpKind::kSend: return 103;
    case OpKind::kRecv: return 104;
    default: return 0;
  }
}

// Bytes as the shim counts an operation in kOpArrive (interpose/core/cost.cc OperationBytes): the hang diagnosis
// compares the sizes real ranks issued at one sequence, so both must count alike.
uint64_t ArriveBytes(const ipc::ExchangeHeader& h, size_t nranks) {
  const uint8_t dtype = h.dtype;
  if (dtype > static_cast<uint8_t>(payload::DataType::kFloat8e5m2)) return 0;
  const uint64_t b = h.count * payload::DataTypeSize(static_cast<payload::DataType>(dtype));
  switch (static_cast<OpKind>(h.op)) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
    case OpKind::kGather:
    case OpKind::kScatter: return b * std::max<uint64_t>(1, nranks);
    default: return b;
  }
}

}  // namespace

void ExchangeHub::AddComm(uint32_t comm_id, std::vector<int> members, std::vector<bool> real) {
  CommInfo c;
  c.real_count = static_cast<int>(std::count(real.begin(), real.end(), true));
  c.members = std::move(members);
  c.real = std::move(real);
  comms_[comm_id] = std::move(c);
}

void ExchangeHub::AppendResult(const ipc::ExchangeHeader& base, uint32_t flags, std::string_view bytes,
                               std::string* to) {
  ipc::ExchangeHeader head = base;
  head.flags = flags;
  // Why written in place (frame header, exchange header, bytes): one copy of the bytes, no temporary payload.
  to->reserve(to->size() + bytes.size() +
              ipc::ExchangeFrameCount(bytes.size()) * (sizeof(ipc::FrameHeader) + sizeof(head)));
  ipc::ForEachExchangeFrame(ipc::MsgType::kOpResult, head, bytes.size(),
                            [&](const ipc::FrameHeader& fh, const ipc::ExchangeHeader& h, uint64_t off, uint64_t n) {
                              to->append(reinterpret_cast<const char*>(&fh), sizeof(fh));
                              to->append(reinterpret_cast<const char*>(&h), sizeof(h));
                              if (n) to->append(bytes.data() + off, n);
                              return true;
                            });
}

uint64_t ExchangeHub::WidenSeq(int from, uint32_t comm_id, uint32_t low) {
  // Why: the header carries 32 bits; a rank's sequence on one communicator only grows, so the nearest 64-bit value
  // to the highest one seen before with these low bits is the right one.
  constexpr uint64_t kWrap = uint64_t{1} << 32, kHalf = uint64_t{1} << 31;
  auto [it, fresh] = last_seq_.try_emplace({from, comm_id}, low);
  if (fresh) return low;
  const uint64_t last = it->second;
  uint64_t seq = (last & ~(kWrap - 1)) | low;
  if (seq + kHalf < last) {
    seq += kWrap;
  } else if (seq > last + kHalf && seq >= kWrap) {
    seq -= kWrap;
  }
  it->second = std::max(last, seq);
  return seq;
}

ExchangeHub::Wait ExchangeHub::WaitOf(const CommInfo& comm, const Posted& p, bool begin) const {
  const ipc::ExchangeHeader h = p.h;
  Wait w;
  w.begin = begin;
  w.comm_id = h.comm_id;
  w.seq = p.seq;
  w.op = ArriveOpCode(h.op);
  w.bytes = ArriveBytes(h, comm.members.size());
  auto global = [&](int32_t r) {
    return r >= 0 && static_cast<size_t>(r) < comm.members.size() ? comm.members[static_cast<size_t>(r)] : -1;
  };
  if (h.op == static_cast<uint16_t>(OpKind::kSend)) {
    w.rank = global(h.rank);
    w.peer = global(h.peer);
  } else if (h.op == static_cast<uint16_t>(OpKind::kRecv)) {
    w.rank = global(h.peer);
    w.peer = global(h.rank);
  } else {
    w.rank = global(h.rank);
  }
  return w;
}

std::vector<ExchangeHub::Wait> ExchangeHub::Waits() const {
  std::vector<Wait> out;
  auto add = [&](const Posted& p) {
    auto c = comms_.find(p.h.comm_id);
    if (c != comms_.end()) out.push_back(WaitOf(c->second, p, true));
  };
  for (const auto& [k, c] : colls_) {
    for (const auto& [r, p] : c.inputs) add(p);
  }
  for (const auto& [k, p] : sends_) add(p);
  for (const auto& [k, p] : recv_waits_) add(p);
  std::stable_sort(out.begin(), out.end(), [](const Wait& a, const Wait& b) { return a.comm_id < b.comm_id; });
  return out;
}

std::string ExchangeHub::OnData(int from, const ipc::ExchangeHeader& h_in, std::string_view bytes,
                                std::vector<Outgoing>* out, std::vector<Wait>* waits, bool* over_cap) {
  const ipc::ExchangeHeader h = h_in;  // packed: copy fields out before use
  auto note = [&](const CommInfo& comm, const Posted& p, bool begin) {
    if (waits) waits->push_back(WaitOf(comm, p, begin));
  };
  // A refused frame is answered, so that its sender does not wait for an answer that never comes.
  auto refuse = [&](std::string why) {
    const bool send = h.op == static_cast<uint16_t>(OpKind::kSend) && !(h.flags & ipc::kExchangeRecvRequest);
    Outgoing o;
    o.rank = from;
    AppendResult(h, ipc::kExchangeError | (send ? ipc::kExchangeSendDone : 0u), {}, &o.frames);
    out->push_back(std::move(o));
    return why;
  };
  auto comm_it = comms_.find(h.comm_id);
  if (comm_it == comms_.end()) return refuse(fmt::format("kOpData for unknown communicator {}", h.comm_id));
  const CommInfo& comm = comm_it->second;
  const int32_t n = static_cast<int32_t>(comm.members.size());
  if (h.rank < 0 || h.rank >= n) {
    return refuse(fmt::format("kOpData rank {} outside communicator {} of {}", h.rank, h.comm_id, n));
  }
  if (h.offset + bytes.size() > h.total_bytes || h.total_bytes > limits::kMaxExchangeBytes) {
    return refuse(
        fmt::format("kOpData chunk at {} of {} bytes exceeds the total {}", h.offset, bytes.size(), h.total_bytes));
  }
  // What this frame makes the hub hold for `from`: its bytes, or the whole payload when it starts an assembly.
  const bool single = h.total_bytes <= bytes.size() && h.offset == 0;
  PartKey pk{from, h.comm_id, h.key, h.rank, h.peer, h.flags};
  auto part_it = single ? partial_.end() : partial_.find(pk);
  const uint64_t adds = single ? bytes.size() : part_it == partial_.end() ? h.total_bytes : 0;
  uint64_t& held = held_[from];
  if (held + adds > max_held_) {
    if (over_cap) *over_cap = true;
    return refuse(fmt::format("rank {} has {} bytes in exchanges, and {} more would pass the {}-byte cap", from, held,
                              adds, max_held_));
  }
  held += adds;
  bytes_in_ += bytes.size();

  // Assemble chunks.
  std::string whole;
  if (single) {
    whole = TakeBuffer(bytes.size());
    whole.assign(bytes);
  } else {
    if (part_it == partial_.end()) {
      part_it = partial_.emplace(pk, Partial{TakeBuffer(h.total_bytes), h.total_bytes}).first;
    }
    std::string& part = part_it->second.bytes;
    if (h.offset != part.size()) {
      const size_t have = part.size();
      ForgetPartial(pk);
      return refuse(fmt::format("kOpData chunk at offset {} but {} bytes assembled", h.offset, have));
    }
    part.append(bytes);
    if (part.size() < h.total_bytes) return "";
    // Held from here on: the whole payload instead of what its first chunk reserved.
    held = held - part_it->second.total + part.size();
    whole = std::move(part);
    partial_.erase(part_it);
  }
  Posted posted;
  posted.h = h;
  posted.from = from;
  posted.seq = WidenSeq(from, h.comm_id, h.seq);
  posted.bytes = std::move(whole);

  if (IsP2p(h.op)) {
    if (h.peer < 0 || h.peer >= n) {
      Release(std::move(posted));
      return refuse(fmt::format("p2p peer {} outside communicator {}", h.peer, h.comm_id));
    }
    P2pKey k{h.comm_id, h.rank, h.peer, h.key};
    const int src = comm.members[static_cast<size_t>(h.rank)], dst = comm.members[static_cast<size_t>(h.peer)];
    const bool request = (h.flags & ipc::kExchangeRecvRequest) != 0;
    // The receiver gets the bytes and the sender its acknowledgement (NCCL's rendezvous: a send completes once
    // its receive is posted).
    auto match = [&](const Posted& send, const Posted& recv) {
      Outgoing to_recv;
      to_recv.rank = dst;
      AppendResult(recv.h, 0, send.bytes, &to_recv.frames);
      out->push_back(std::move(to_recv));
      Outgoing to_send;
      to_send.rank = src;
      AppendResult(send.h, ipc::kExchangeSendDone, {}, &to_send.frames);
      out->push_back(std::move(to_send));
    };
    // A send looks for its receive request, a receive request for its send; the first of the two waits.
    std::map<P2pKey, Posted>& waiting = request ? sends_ : recv_waits_;
    auto other = waiting.find(k);
    if (other == waiting.end()) {
      note(comm, posted, true);
      Store(request ? &recv_waits_[k] : &sends_[k], std::move(posted));
      return "";
    }
    if (request) {
      match(other->second, posted);
    } else {
      match(posted, other->second);
    }
    note(comm, other->second, false);
    Release(std::move(other->second));
    waiting.erase(other);
    Release(std::move(posted));
    return "";
  }

  // Collective.
  Coll& c = colls_[{h.comm_id, h.key}];
  if (c.inputs.empty()) {
    c.first = h;
  } else if (!c.mismatch && (c.first.op != h.op || c.first.dtype != h.dtype || c.first.count != h.count ||
                             c.first.peer != h.peer || c.first.redop != h.redop)) {
    c.mismatch = true;
    c.why = fmt::format("members disagree at exchanged collective {} of communicator {}: op {} vs {}, count {} vs {}, "
                        "dtype {} vs {}, root {} vs {}",
                        h.key, h.comm_id, c.first.op, h.op, c.first.count, h.count, c.first.dtype, h.dtype,
                        c.first.peer, h.peer);
  }
  Store(&c.inputs[h.rank], std::move(posted));
  if (static_cast<int>(c.inputs.size()) < comm.real_count) {
    note(comm, c.inputs[h.rank], true);
    return "";
  }
  for (const auto& [r, p] : c.inputs) {
    if (r != h.rank) note(comm, p, false);  // the last member to post never waited
  }
  std::string why = c.why;
  std::string result_why = FinishCollective(h.comm_id, h.key, c, out);
  if (why.empty()) why = std::move(result_why);
  for (auto& [r, p] : c.inputs) Release(std::move(p));
  colls_.erase({h.comm_id, h.key});
  return why;
}

void ExchangeHub::Release(Posted&& p) {
  auto it = held_.find(p.from);
  if (it != held_.end()) it->second -= std::min<uint64_t>(it->second, p.bytes.size());
  GiveBuffer(std::move(p.bytes));
}

void ExchangeHub::Store(Posted* slot, Posted&& p) {
  if (slot->from >= 0) Release(std::move(*slot));  // a repeated post replaces the earlier one
  *slot = std::move(p);
}

void ExchangeHub::ForgetPartial(const PartKey& pk) {
  auto part = partial_.find(pk);
  if (part == partial_.end()) return;
  auto it = held_.find(std::get<0>(pk));
  if (it != held_.end()) it->second -= std::min(it->second, part->second.total);
  GiveBuffer(std::move(part->second.bytes));
  partial_.erase(part);
}

void ExchangeHub::ForgetRank(int rank) {
  std::vector<PartKey> gone;
  for (const auto& [pk, part] : partial_) {
    if (std::get<0>(pk) == rank) gone.push_back(pk);
  }
  for (const PartKey& pk : gone) ForgetPartial(pk);
}

uint64_t ExchangeHub::HeldBytes(int rank) const {
  auto it = held_.find(rank);
  return it == held_.end() ? 0 : it->second;
}

std::string ExchangeHub::FinishCollective(uint32_t comm_id, uint64_t key, Coll& c, std::vector<Outgoing>* out) {
  std::string why;
  const CommInfo& comm = comms_[comm_id];
  const ipc::ExchangeHeader first = c.first;
  payload::ExchangeOp op;
  op.op = static_cast<OpKind>(first.op);
  op.dtype = static_cast<payload::DataType>(first.dtype);
  op.redop = static_cast<payload::RedOp>(first.redop);
  op.premul_scalar_bits = first.scalar_bits;
  op.nranks = static_cast<int32_t>(comm.members.size());
  op.root = first.peer < 0 ? 0 : first.peer;
  op.count = first.count;
  bool sizes_ok = !c.mismatch;
  std::vector<const uint8_t*> inputs(static_cast<size_t>(op.nranks), nullptr);
  static const uint8_t kEmpty = 0;
  for (auto& [r, p] : c.inputs) {
    const std::string& bytes = p.bytes;
    if (bytes.size() != payload::ExchangeInputBytes(op, r)) sizes_ok = false;
    inputs[static_cast<size_t>(r)] = bytes.empty() ? &kEmpty : reinterpret_cast<const uint8_t*>(bytes.data());
  }
  // All-reduce, all-gather, broadcast: every member gets the same bytes, computed once into the first member's
  // frames and copied (headers patched) for the others.
  const bool shared = payload::ExchangeOutputIsShared(op);
  size_t shared_at = SIZE_MAX;  // index in *out of the member whose frames hold the shared output
  for (auto& [r, p] : c.inputs) {
    ipc::ExchangeHeader h = first;
    h.comm_id = comm_id;
    h.key = key;
    h.rank = r;
    h.seq = p.h.seq;
    Outgoing o;
    o.rank = comm.members[static_cast<size_t>(r)];
    uint64_t bytes = 0;
    const payload::ExchangeResult res =
        sizes_ok ? payload::ExchangePlanOutput(op, inputs, r, &bytes) : payload::ExchangeResult::kInvalid;
    switch (res) {
      case payload::ExchangeResult::kData:
        // Why refused before it is computed: a result is queued whole for its member, and the bus drops a client
        // with more than this unread (a world-sized all-gather of a small input can ask for any amount).
        if (bytes > max_result_) {
          why = fmt::format("exchanged collective {} of communicator {}: a {}-byte result is over the {}-byte cap",
                            key, comm_id, bytes, max_result_);
          AppendResult(h, ipc::kExchangeError, {}, &o.frames);
        } else if (shared && shared_at != SIZE_MAX) {
          o.frames = TakeBuffer((*out)[shared_at].frames.size());
          o.frames.assign((*out)[shared_at].frames);
          PatchResultHeaders(r, p.h.seq, &o.frames);
        } else if (AppendComputed(h, op, inputs, r, bytes, &o.frames)) {
          if (shared) shared_at = out->size();
        } else {
          o.frames.clear();
          AppendResult(h, ipc::kExchangeError, {}, &o.frames);
        }
        break;
      case payload::ExchangeResult::kLocal:
        AppendResult(h, ipc::kExchangeLocal, {}, &o.frames);
        break;
      case payload::ExchangeResult::kNothing:
        AppendResult(h, ipc::kExchangeNothing, {}, &o.frames);
        break;
      case payload::ExchangeResult::kInvalid:
        AppendResult(h, ipc::kExchangeError, {}, &o.frames);
        break;
    }
    out->push_back(std::move(o));
  }
  return why;
}

bool ExchangeHub::AppendComputed(const ipc::ExchangeHeader& base, const payload::ExchangeOp& op,
                                 const std::vector<const uint8_t*>& inputs, int32_t rank, uint64_t bytes,
                                 std::string* to) {
  // Frames as AppendResult lays them out; each chunk's bytes computed in place (no result buffer, no copy).
  constexpr uint64_t kHead = sizeof(ipc::FrameHeader) + sizeof(ipc::ExchangeHeader);
  const uint64_t chunks = ipc::ExchangeFrameCount(bytes);
  const size_t start = to->size();
  if (to->capacity() < start + bytes + chunks * kHead) {
    std::string grown = TakeBuffer(start + bytes + chunks * kHead);
    grown.assign(*to);
    to->swap(grown);
  }
  to->resize(start + bytes + chunks * kHead);
  char* w = to->data() + start;
  ipc::ExchangeHeader head = base;
  head.flags = 0;
  const bool ok = ipc::ForEachExchangeFrame(
      ipc::MsgType::kOpResult, head, bytes,
      [&](const ipc::FrameHeader& fh, const ipc::ExchangeHeader& h, uint64_t off, uint64_t n) {
        std::memcpy(w, &fh, sizeof(fh));
        std::memcpy(w + sizeof(fh), &h, sizeof(h));
        if (n && !payload::ExchangeOutputRange(op, inputs, rank, off, n, reinterpret_cast<uint8_t*>(w + kHead))) {
          return false;
        }
        w += kHead + n;
        return true;
      });
  if (!ok) to->resize(start);
  return ok;
}

void ExchangeHub::PatchResultHeaders(int32_t rank, uint32_t seq, std::string* frames) {
  size_t pos = 0;
  while (pos + sizeof(ipc::FrameHeader) + sizeof(ipc::ExchangeHeader) <= frames->size()) {
    ipc::FrameHeader fh;
    std::memcpy(&fh, frames->data() + pos, sizeof(fh));
    ipc::ExchangeHeader h;
    char* at = frames->data() + pos + sizeof(fh);
    std::memcpy(&h, at, sizeof(h));
    h.rank = rank;
    h.seq = seq;
    std::memcpy(at, &h, sizeof(h));
    pos += sizeof(fh) + fh.length;
  }
}

std::string ExchangeHub::TakeBuffer(uint64_t bytes) {
  std::string s;
  if (bytes >= kPooledMin) {
    // The smallest spare that fits.
    size_t best = spare_.size();
    for (size_t i = 0; i < spare_.size(); ++i) {
      if (spare_[i].capacity() >= bytes && (best == spare_.size() || spare_[i].capacity() < spare_[best].capacity())) {
        best = i;
      }
    }
    if (best != spare_.size()) {
      s = std::move(spare_[best]);
      spare_bytes_ -= s.capacity();
      spare_.erase(spare_.begin() + static_cast<long>(best));
      s.clear();
    }
  }
  const bool fresh = s.capacity() < bytes;
  s.reserve(bytes);
#ifdef MADV_HUGEPAGE
  // Why: a fresh large buffer is faulted in page by page on first write (measured: half of all samples before the
  // buffers were reused); 2 MiB pages take 512 times fewer faults. Advisory: nothing changes when it is refused.
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (fresh && bytes >= 4 * kHuge) {
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(s.data()) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(s.data()) + s.capacity()) & ~(kHuge - 1);
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#else
  (void)fresh;
#endif
  return s;
}

void ExchangeHub::GiveBuffer(std::string&& s) {
  if (s.capacity() < kPooledMin) return;
  // Keep the largest buffers up to the bound: drop smaller spares to make room, or drop this one.
  while (spare_bytes_ + s.capacity() > kPooledMaxBytes && !spare_.empty()) {
    auto smallest = std::min_element(spare_.begin(), spare_.end(),
                                     [](const std::string& a, const std::string& b) { return a.capacity() < b.capacity(); });
    if (smallest->capacity() >= s.capacity()) return;
    spare_bytes_ -= smallest->capacity();
    spare_.erase(smallest);
  }
  if (spare_bytes_ + s.capacity() > kPooledMaxBytes) return;
  spare_bytes_ += s.capacity();
  s.clear();
  spare_.push_back(std::move(s));
}

void ExchangeHub::Recycle(std::string&& frames) { GiveBuffer(std::move(frames)); }

}  // namespace prism::coord
