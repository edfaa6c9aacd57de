#include "coordinator/exchange_hub.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/ipc_io.h"
#include "nccl_patch/exchange.h"

namespace prism::coord {
namespace {

using payload::OpKind;

bool IsP2p(uint16_t op) {
  return op == static_cast<uint16_t>(OpKind::kSend) || op == static_cast<uint16_t>(OpKind::kRecv);
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
  ipc::ExchangeHeader h = base;
  h.flags = flags;
  h.total_bytes = bytes.size();
  uint64_t off = 0;
  do {
    const uint64_t n = std::min<uint64_t>(ipc::kExchangeChunkBytes, bytes.size() - off);
    h.offset = off;
    std::string payload(sizeof(h) + n, '\0');
    std::memcpy(payload.data(), &h, sizeof(h));
    if (n) std::memcpy(payload.data() + sizeof(h), bytes.data() + off, n);
    ipc::AppendFrame(to, ipc::MsgType::kOpResult, payload.data(), payload.size());
    off += n;
  } while (off < bytes.size());
}

std::string ExchangeHub::OnData(int from, const ipc::ExchangeHeader& h_in, std::string_view bytes,
                                std::vector<Outgoing>* out) {
  const ipc::ExchangeHeader h = h_in;  // packed: copy fields out before use
  auto comm_it = comms_.find(h.comm_id);
  if (comm_it == comms_.end()) return fmt::format("kOpData for unknown communicator {}", h.comm_id);
  const CommInfo& comm = comm_it->second;
  const int32_t n = static_cast<int32_t>(comm.members.size());
  if (h.rank < 0 || h.rank >= n) return fmt::format("kOpData rank {} outside communicator {} of {}", h.rank, h.comm_id, n);
  if (h.offset + bytes.size() > h.total_bytes || h.total_bytes > (uint64_t{64} << 30)) {
    return fmt::format("kOpData chunk at {} of {} bytes exceeds the total {}", h.offset, bytes.size(), h.total_bytes);
  }
  bytes_in_ += bytes.size();

  // Assemble chunks.
  std::string whole;
  if (h.total_bytes <= bytes.size() && h.offset == 0) {
    whole.assign(bytes);
  } else {
    PartKey pk{from, h.comm_id, h.key, h.rank, h.peer, h.flags};
    std::string& part = partial_[pk];
    if (h.offset != part.size()) {
      partial_.erase(pk);
      return fmt::format("kOpData chunk at offset {} but {} bytes assembled", h.offset, part.size());
    }
    part.append(bytes);
    if (part.size() < h.total_bytes) return "";
    whole = std::move(part);
    partial_.erase(pk);
  }

  if (IsP2p(h.op)) {
    if (h.peer < 0 || h.peer >= n) return fmt::format("p2p peer {} outside communicator {}", h.peer, h.comm_id);
    P2pKey k{h.comm_id, h.rank, h.peer, h.key};
    const bool request = (h.flags & ipc::kExchangeRecvRequest) != 0;
    if (!request) {
      auto w = recv_waits_.find(k);
      if (w != recv_waits_.end()) {
        Outgoing o;
        o.rank = comm.members[static_cast<size_t>(h.peer)];
        AppendResult(w->second, 0, whole, &o.frames);
        out->push_back(std::move(o));
        recv_waits_.erase(w);
      } else {
        sends_[k] = std::move(whole);
      }
      return "";
    }
    auto s = sends_.find(k);
    if (s != sends_.end()) {
      Outgoing o;
      o.rank = from;
      AppendResult(h, 0, s->second, &o.frames);
      out->push_back(std::move(o));
      sends_.erase(s);
    } else {
      recv_waits_[k] = h;
    }
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
  c.inputs[h.rank] = std::move(whole);
  if (static_cast<int>(c.inputs.size()) < comm.real_count) return "";
  std::string why = c.why;
  FinishCollective(h.comm_id, h.key, c, out);
  colls_.erase({h.comm_id, h.key});
  return why;
}

void ExchangeHub::FinishCollective(uint32_t comm_id, uint64_t key, Coll& c, std::vector<Outgoing>* out) {
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
  for (auto& [r, bytes] : c.inputs) {
    if (bytes.size() != payload::ExchangeInputBytes(op, r)) sizes_ok = false;
    inputs[static_cast<size_t>(r)] = bytes.empty() ? &kEmpty : reinterpret_cast<const uint8_t*>(bytes.data());
  }
  std::vector<uint8_t> result;
  for (auto& [r, bytes] : c.inputs) {
    ipc::ExchangeHeader h = first;
    h.comm_id = comm_id;
    h.key = key;
    h.rank = r;
    Outgoing o;
    o.rank = comm.members[static_cast<size_t>(r)];
    if (!sizes_ok) {
      AppendResult(h, ipc::kExchangeError, {}, &o.frames);
    } else {
      switch (payload::ExchangeOutput(op, inputs, r, &result)) {
        case payload::ExchangeResult::kData:
          AppendResult(h, 0, std::string_view(reinterpret_cast<const char*>(result.data()), result.size()), &o.frames);
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
    }
    out->push_back(std::move(o));
  }
}

}  // namespace prism::coord
