#include "interpose/core/unit_exchange.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/recorded.h"
#include "interpose/core/unit_stats.h"
#include "nccl_patch/exchange.h"
#include "prism/ipc.h"

namespace prism::interpose {

using payload::OpKind;

bool RealDataOn(const Comm* comm, uint64_t count) {
  return Cfg().exchange && comm->use_coordinator && comm->coord_comm_id != 0 && count != 0 && comm->real_members >= 2;
}

XKind ExchangeKindOf(const OpCall& c) {
  const Comm* comm = c.comm;
  if (!RealDataOn(comm, c.count) || IsSelf(c)) return XKind::kNone;
  if (IsP2p(c.op)) {
    if (c.peer < 0 || static_cast<size_t>(c.peer) >= comm->member_real.size() || !comm->member_real[c.peer]) {
      return XKind::kNone;
    }
    return c.op == OpKind::kSend ? XKind::kSend : XKind::kRecv;
  }
  return XKind::kColl;
}

payload::ExchangeOp ExchangeOpOf(const Prepared& p) {
  payload::ExchangeOp x;
  x.op = p.call.op;
  x.dtype = p.desc.dtype;
  x.redop = p.desc.redop;
  x.premul_scalar_bits = p.desc.premul_scalar_bits;
  x.nranks = p.call.comm->nranks;
  x.root = p.call.root;
  x.count = p.call.count;
  return x;
}

void WaitSendsDone(ThreadState& t) {
  static std::atomic<bool> warned_lost{false}, warned_refused{false};
  if (!Cfg().send_rendezvous) {
    // PRISM_SEND_RENDEZVOUS=0: sends complete when posted (the acknowledgements are dropped by the reader).
    t.send_done.clear();
    return;
  }
  for (const auto& [comm_id, key, dst] : t.send_done) {
    uint32_t flags = 0;
    if (!CoordWaitSendDone(comm_id, key, dst, &flags)) {
      LogOnce(&warned_lost, "the coordinator is gone: real data between real ranks falls back to the local policy");
      break;
    }
    if (flags & ipc::kExchangeError) {
      LogOnce(&warned_refused, "the coordinator refused a send to a real rank (see its log): the receiver gets the "
                               "local policy");
    }
  }
  t.send_done.clear();
}

CUresult RunExchange(ThreadState& t, Gpu& gpu, CUstream stream, std::vector<Prepared>& prep) {
  static std::atomic<bool> warned_lost{false}, warned_error{false}, warned_staging{false};
  // Host staging (page-locked) for every input, every output (the coordinator's bytes land there straight from
  // the socket, and go to the GPU from there) and device-resident PreMulSum scalars.
  uint64_t total = 0;
  std::vector<uint64_t> in_bytes(prep.size(), 0), out_bytes(prep.size(), 0);
  for (size_t i = 0; i < prep.size(); ++i) {
    const Prepared& p = prep[i];
    if (p.xkind == XKind::kColl) {
      in_bytes[i] = payload::ExchangeInputBytes(ExchangeOpOf(p), p.call.comm->rank);
      out_bytes[i] = payload::ExchangeOutputBytes(ExchangeOpOf(p), p.call.comm->rank);
    }
    if (p.xkind == XKind::kSend) in_bytes[i] = p.bytes;
    if (p.xkind == XKind::kRecv) out_bytes[i] = p.bytes;
    total += in_bytes[i] + out_bytes[i] + 8;
  }
  uint8_t* stage = gpu.HostStaging(total);
  if (stage == nullptr) {
    LogOnce(&warned_staging, "no page-locked host memory for real data between real ranks: local policy used");
    for (Prepared& p : prep) p.xkind = XKind::kNone;
    return CUDA_SUCCESS;
  }
  std::vector<uint8_t*> host(prep.size(), nullptr), host_out(prep.size(), nullptr);
  uint64_t off = 0;
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < prep.size() && r == CUDA_SUCCESS; ++i) {
    Prepared& p = prep[i];
    if (p.xkind == XKind::kNone) continue;
    host[i] = stage + off;
    off += in_bytes[i];
    host_out[i] = stage + off;
    off += out_bytes[i];
    if (in_bytes[i]) {
      r = DriverCall([&] {
        return gpu.CopyAsync(stream, reinterpret_cast<uint64_t>(host[i]), p.desc.send_addr, in_bytes[i]);
      });
    }
    if (r == CUDA_SUCCESS && p.desc.redop == payload::RedOp::kPreMulSum && p.desc.premul_scalar_addr != 0) {
      uint8_t* sc = stage + off;
      off += 8;
      std::memset(sc, 0, 8);
      r = DriverCall([&] {
        return gpu.CopyAsync(stream, reinterpret_cast<uint64_t>(sc), p.desc.premul_scalar_addr,
                             payload::DataTypeSize(p.desc.dtype));
      });
      if (r == CUDA_SUCCESS) r = DriverCall([&] { return gpu.Synchronize(stream); });
      if (r == CUDA_SUCCESS) std::memcpy(&p.desc.premul_scalar_bits, sc, 8);
    }
  }
  if (r == CUDA_SUCCESS) r = DriverCall([&] { return gpu.Synchronize(stream); });
  if (r != CUDA_SUCCESS) return r;
  // Post every input and send first, then wait: a group's send/recv pairs must not wait on each other. A send
  // completes when the coordinator acknowledges it (its receive was posted, as NCCL's rendezvous), so two real
  // ranks that both send first outside a group deadlock here as they would in NCCL, and the coordinator's hang
  // diagnosis sees both waiting.
  std::vector<uint64_t> keys(prep.size(), 0);
  for (size_t i = 0; i < prep.size(); ++i) {
    Prepared& p = prep[i];
    if (p.xkind == XKind::kNone) continue;
    Comm* c = p.call.comm;
    ipc::ExchangeHeader h{};
    h.comm_id = c->coord_comm_id;
    h.op = static_cast<uint16_t>(p.call.op);
    h.dtype = static_cast<uint8_t>(p.desc.dtype);
    h.redop = static_cast<uint8_t>(p.desc.redop);
    h.count = p.call.count;
    h.scalar_bits = p.desc.premul_scalar_bits;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (p.xkind == XKind::kColl) keys[i] = c->xcoll++;
      else if (p.xkind == XKind::kSend) keys[i] = c->xsend[p.call.peer]++;
      else keys[i] = c->xrecv[p.call.peer]++;
    }
    h.key = keys[i];
    h.seq = static_cast<uint32_t>(p.seq);  // low bits (ipc.h): the hang diagnosis names where this rank waits
    if (p.xkind == XKind::kColl) {
      h.rank = c->rank;
      h.peer = p.call.root;
    } else if (p.xkind == XKind::kSend) {
      h.rank = c->rank;
      h.peer = p.call.peer;
    } else {
      h.rank = p.call.peer;
      h.peer = c->rank;
      h.flags = ipc::kExchangeRecvRequest;
    }
    const int32_t src = p.xkind == XKind::kRecv ? p.call.peer : -1;
    const bool answered = p.xkind == XKind::kColl || p.xkind == XKind::kRecv;
    if (answered) CoordExpectResult(c->coord_comm_id, keys[i], src, host_out[i], out_bytes[i]);
    if (!CoordSendData(h, host[i], in_bytes[i])) {
      if (answered) CoordForgetResult(c->coord_comm_id, keys[i], src);
      LogOnce(&warned_lost, "the coordinator is gone: real data between real ranks falls back to the local policy");
      for (Prepared& q : prep) q.xkind = XKind::kNone;
      return CUDA_SUCCESS;
    }
  }
  std::vector<std::string> results(prep.size());
  for (size_t i = 0; i < prep.size(); ++i) {
    Prepared& p = prep[i];
    if (p.xkind != XKind::kColl && p.xkind != XKind::kRecv) {
      if (p.xkind == XKind::kSend) p.local = false;  // a send writes nothing
      continue;
    }
    uint32_t flags = 0;
    const int32_t src = p.xkind == XKind::kRecv ? p.call.peer : -1;
    uint64_t size = 0;
    bool in_place = false;
    if (!CoordWaitResultAt(p.call.comm->coord_comm_id, keys[i], src, &flags, &size, &in_place, &results[i])) {
      LogOnce(&warned_lost, "the coordinator is gone: real data between real ranks falls back to the local policy");
      continue;
    }
    if (flags & ipc::kExchangeError) {
      LogOnce(&warned_error, "real members of a communicator disagreed on an operation (see the coordinator's log): "
                             "its output follows the local policy");
      continue;
    }
    if (flags & (ipc::kExchangeLocal)) continue;
    p.local = false;
    if (flags & ipc::kExchangeNothing) continue;
    const uint64_t want = p.xkind == XKind::kRecv ? p.bytes : payload::ExchangeOutputBytes(ExchangeOpOf(p), p.call.comm->rank);
    const uint8_t* data = in_place ? host_out[i] : reinterpret_cast<const uint8_t*>(results[i].data());
    if (size != want || (!in_place && results[i].size() != want)) {
      LogOnce(&warned_error, "real data of the wrong size came back for an operation: local policy used");
      p.local = true;
      continue;
    }
    r = DriverCall([&] {
      return gpu.CopyAsync(stream, p.desc.recv_addr, reinterpret_cast<uint64_t>(data), want);
    });
    if (r != CUDA_SUCCESS) return r;
    RecordPayload(p.call.comm->id, p.seq, static_cast<uint16_t>(p.call.op), static_cast<uint8_t>(p.desc.dtype),
                  data, want);
  }
  for (size_t i = 0; i < prep.size(); ++i) {
    const Prepared& p = prep[i];
    if (p.xkind != XKind::kSend) continue;
    t.send_done.emplace_back(p.call.comm->coord_comm_id, keys[i], p.call.peer);
  }
  if (!t.defer_send_done) WaitSendsDone(t);
  // Why wait: the results live in host staging reused by the next unit (or host strings freed on return).
  return DriverCall([&] { return gpu.Synchronize(stream); });
}

}  // namespace prism::interpose
