#!/usr/bin/env python3
"""A worker that speaks libprism's real protocols without torch, a GPU or libprism (tests only).

Run by prism-run as the job (`prism-run ... torchrun --no-python fake_shim.py` or via python3), it does what
libprism.so and torch do in one real rank, on the wire:
  1. the store (MASTER_ADDR:MASTER_PORT, c10d TCPStore protocol): VALIDATE, then the communicator's NCCL unique id:
     the communicator's leader SETs a 128-byte id under torch's key, the others WAIT and GET it;
  2. the event bus (PRISM_COORD_SOCKET, else PRISM_COORD_ADDR=host:port; include/prism/ipc.h frames): kHello,
     kCommInit -> kCommInfo, then per operation kOpArrive, wait for kOpRelease, kOpRecord; kIteration per
     iteration; kBye at the end.

Settings (environment):
  FAKE_COMM       "world" (default: every rank, key /default_pg/0//cuda//0) or "p2p:A,B" (the 2-rank p2p
                  communicator of ranks A and B, key /default_pg/0//cuda//A:B)
  FAKE_OPS        per iteration, comma-separated OP:BYTES with OP in all_reduce, all_gather, reduce_scatter,
                  broadcast, send, recv (p2p ops go to the other rank of the communicator); default
                  "all_reduce:1048576,all_gather:4096"
  FAKE_ITERS      iterations (default 4); FAKE_ITER_MS sleep per iteration (default 10)
  FAKE_SKIP_RANK, FAKE_SKIP_ITER, FAKE_SKIP_OP: that rank leaves out op number FAKE_SKIP_OP (0-based) of
                  iteration FAKE_SKIP_ITER (a planted bug)
  FAKE_SIZE_RANK, FAKE_SIZE_ITER: that rank halves the bytes of every op of that iteration
  FAKE_EXCHANGE   1: every op moves real data through the coordinator as libprism's exchange does (kOpData ->
                  kOpResult; docs/payload.md "Exchange"): a collective posts its input (uint8, the op's bytes; an
                  all_gather's shard) and waits for its output, then kOpArrive/kOpRelease; a send posts its bytes and
                  waits for the acknowledgement that its receive was posted (kExchangeSendDone); a receive asks for
                  the send and checks the bytes (exit 3 when they are not the peer's). p2p ops send no kOpArrive.
                  Results are read as one frame (sizes up to 8 MiB).
  FAKE_RECV_FIRST_RANK: that rank issues each iteration's p2p ops in reverse order (a receive before its send)
  FAKE_STOP_RANK, FAKE_STOP_ITER: that rank says goodbye and exits 0 before iteration FAKE_STOP_ITER
  FAKE_WAIT_S     give up (exit 3) after waiting this long for any answer from the coordinator (default: never)
"""
import json
import os
import socket
import struct
import sys
import time

MAGIC = 0x4D535250


def _ipc_version():
    # Why read it from include/prism/ipc.h: the coordinator drops frames of another version; the header is the truth.
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "..", "include", "prism", "ipc.h")) as f:
        for line in f:
            if "kVersion =" in line:
                return int(line.split("=")[1].split(";")[0])
    raise SystemExit("fake_shim: no kVersion in include/prism/ipc.h")


VERSION = _ipc_version()
HELLO, COMM_INIT, OP_ARRIVE, OP_RECORD, MEMORY, ITERATION, BYE, OP_DATA = 1, 2, 3, 4, 5, 6, 7, 8
HELLO_ACK, COMM_INFO, OP_RELEASE, ERROR, OP_RESULT = 64, 65, 66, 67, 68
OPS = {"all_reduce": 1, "all_gather": 2, "reduce_scatter": 3, "broadcast": 4, "reduce": 5, "all_to_all": 6,
       "send": 103, "recv": 104}
# ipc.h ExchangeHeader: comm_id, op (payload::OpKind), dtype, redop, key, rank, peer, count, scalar_bits,
# total_bytes, offset, flags, seq (low 32 bits).
XHEADER = struct.Struct("<IHBBQiiQQQQII")
KIND = {1: 1, 2: 4, 103: 9, 104: 10}  # OPS code -> payload::OpKind (exchange supports these)
UINT8 = 1
RECV_REQUEST, X_ERROR, SEND_DONE = 1, 8, 16


def log(msg):
    print("fake_shim rank %s: %s" % (os.environ.get("RANK"), msg), flush=True)


class Store:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port), timeout=None)
        self.s.sendall(struct.pack("<BI", 0, 0x3C85F7CE))  # VALIDATE

    @staticmethod
    def _bytes(b):
        return struct.pack("<Q", len(b)) + b

    def set(self, key, value):
        self.s.sendall(struct.pack("<B", 1) + self._bytes(key.encode()) + self._bytes(value))

    def wait_get(self, key):
        self.s.sendall(struct.pack("<BQ", 6, 1) + self._bytes(key.encode()))  # WAIT
        self._recv(1)
        self.s.sendall(struct.pack("<B", 3) + self._bytes(key.encode()))  # GET
        n = struct.unpack("<Q", self._recv(8))[0]
        return self._recv(n)

    def _recv(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise EOFError("store closed")
            out += chunk
        return out


class Bus:
    def __init__(self):
        path = os.environ.get("PRISM_COORD_SOCKET", "")
        addr = os.environ.get("PRISM_COORD_ADDR", "")
        if path:
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.connect(path)
        elif addr:
            host, port = addr.rsplit(":", 1)
            self.s = socket.create_connection((host, int(port)), timeout=None)
        else:
            raise SystemExit("fake_shim: neither PRISM_COORD_SOCKET nor PRISM_COORD_ADDR is set")
        wait_s = os.environ.get("FAKE_WAIT_S", "")
        if wait_s:
            self.s.settimeout(float(wait_s))
        self.releases = {}
        self.replies = []
        self.results = []  # kOpResult frames not taken yet: (header tuple, bytes)

    def send(self, typ, payload):
        self.s.sendall(struct.pack("<IHHI", MAGIC, VERSION, typ, len(payload)) + payload)

    def send_json(self, typ, obj):
        self.send(typ, json.dumps(obj).encode())

    def _recv(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise EOFError("coordinator closed the bus")
            out += chunk
        return out

    def next_frame(self):
        try:
            magic, ver, typ, length = struct.unpack("<IHHI", self._recv(12))
            if magic != MAGIC or ver != VERSION:
                raise SystemExit("fake_shim: bad frame from the coordinator")
            payload = self._recv(length)
        except socket.timeout:
            log("no answer from the coordinator within FAKE_WAIT_S")
            sys.exit(3)
        if typ == OP_RESULT:
            self.results.append((XHEADER.unpack(payload[:XHEADER.size]), payload[XHEADER.size:]))
            return None, None
        return typ, payload

    def reply(self):
        while not self.replies:
            typ, payload = self.next_frame()
            if typ is None:
                continue
            if typ == OP_RELEASE:
                comm, _, seq, rel, last, _ = struct.unpack("<IIQQiI", payload)
                self.releases[(comm, seq)] = (rel, last)
            else:
                self.replies.append((typ, payload))
        return self.replies.pop(0)

    def result(self, match):
        """The first kOpResult whose header satisfies match(header tuple): (header, bytes)."""
        while True:
            for i, (h, b) in enumerate(self.results):
                if match(h):
                    return self.results.pop(i)
            typ, payload = self.next_frame()
            if typ == OP_RELEASE:
                c, _, s, rel, last, _ = struct.unpack("<IIQQiI", payload)
                self.releases[(c, s)] = (rel, last)
            elif typ == ERROR:
                raise SystemExit("fake_shim: coordinator error: %s" % payload.decode())
            elif typ is not None:
                self.replies.append((typ, payload))

    def release(self, comm, seq):
        while (comm, seq) not in self.releases:
            typ, payload = self.next_frame()
            if typ is None:
                continue
            if typ == OP_RELEASE:
                c, _, s, rel, last, _ = struct.unpack("<IIQQiI", payload)
                self.releases[(c, s)] = (rel, last)
            elif typ == ERROR:
                raise SystemExit("fake_shim: coordinator error: %s" % payload.decode())
            else:
                self.replies.append((typ, payload))
        return self.releases.pop((comm, seq))


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    comm_spec = os.environ.get("FAKE_COMM", "world")
    if comm_spec == "world":
        members = list(range(world))
        key = "/default_pg/0//cuda//0"
    elif comm_spec.startswith("p2p:"):
        a, b = sorted(int(x) for x in comm_spec[4:].split(","))
        members = [a, b]
        key = "/default_pg/0//cuda//%d:%d" % (a, b)
    else:
        raise SystemExit("fake_shim: FAKE_COMM=%s" % comm_spec)
    if rank not in members:
        raise SystemExit("fake_shim: rank %d is not in %s" % (rank, members))
    my = members.index(rank)

    store = Store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if my == 0:
        uid = (b"FAKEID%02d" % (len(members) % 100)) + bytes(range(120))
        store.set(key, uid)
    else:
        uid = store.wait_get(key)

    bus = Bus()
    bus.send_json(HELLO, {"rank": rank, "world_size": world, "local_rank": 0, "pid": os.getpid(),
                          "host": socket.gethostname(), "gpu": 0, "version": 1})
    typ, payload = bus.reply()
    if typ != HELLO_ACK:
        raise SystemExit("fake_shim: hello refused: %s" % payload.decode())
    bus.send_json(COMM_INIT, {"key": uid.hex(), "nranks": len(members), "rank": my, "desc": "", "name": "0"})
    typ, payload = bus.reply()
    info = json.loads(payload)
    comm = info.get("comm_id", 0)
    if typ != COMM_INFO or comm == 0:
        raise SystemExit("fake_shim: comm init failed: %s" % payload.decode())
    log("comm %d with members %d..%d" % (comm, members[0], members[-1]))

    ops = []
    for part in os.environ.get("FAKE_OPS", "all_reduce:1048576,all_gather:4096").split(","):
        name, size = part.split(":")
        ops.append((OPS[name], int(size)))
    iters = int(os.environ.get("FAKE_ITERS", "4"))
    iter_s = float(os.environ.get("FAKE_ITER_MS", "10")) / 1000.0
    skip = (int(os.environ.get("FAKE_SKIP_RANK", "-1")), int(os.environ.get("FAKE_SKIP_ITER", "-1")),
            int(os.environ.get("FAKE_SKIP_OP", "0")))
    halve = (int(os.environ.get("FAKE_SIZE_RANK", "-1")), int(os.environ.get("FAKE_SIZE_ITER", "-1")))
    exchange = os.environ.get("FAKE_EXCHANGE", "") == "1"
    recv_first = int(os.environ.get("FAKE_RECV_FIRST_RANK", "-1")) == rank
    stop = (int(os.environ.get("FAKE_STOP_RANK", "-1")), int(os.environ.get("FAKE_STOP_ITER", "-1")))
    peer = 1 - my if len(members) == 2 else -1
    xkeys = {"coll": 0, "send": 0, "recv": 0}  # exchange keys (ipc.h): per communicator, per peer for p2p
    seq = 0
    last = time.time_ns()

    def exchange_op(op, size, seq):
        """libprism's RunExchange for one operation; True when the op still needs kOpArrive (collectives)."""
        kind = KIND.get(op)
        if kind is None:
            raise SystemExit("fake_shim: FAKE_EXCHANGE supports all_reduce, all_gather, send, recv")
        if op == OPS["send"]:
            key = xkeys["send"]
            xkeys["send"] += 1
            data = bytes([(rank + key) % 256]) * size
            bus.send(OP_DATA, XHEADER.pack(comm, kind, UINT8, 0, key, my, peer, size, 0, size, 0, 0, seq) + data)
            bus.result(lambda h: h[11] & SEND_DONE and (h[0], h[4], h[6]) == (comm, key, peer))
            return False
        if op == OPS["recv"]:
            key = xkeys["recv"]
            xkeys["recv"] += 1
            bus.send(OP_DATA, XHEADER.pack(comm, kind, UINT8, 0, key, peer, my, size, 0, 0, 0, RECV_REQUEST, seq))
            h, data = bus.result(
                lambda h: h[1] == kind and not h[11] & SEND_DONE and (h[0], h[4], h[5]) == (comm, key, peer))
            want = bytes([(members[peer] + key) % 256]) * size
            if h[11] & X_ERROR or data != want:
                log("received %d bytes (flags %d) that are not rank %d's send %d"
                    % (len(data), h[11], members[peer], key))
                sys.exit(3)
            return False
        key = xkeys["coll"]
        xkeys["coll"] += 1
        count = size // len(members) if op == OPS["all_gather"] else size
        bus.send(OP_DATA, XHEADER.pack(comm, kind, UINT8, 0, key, my, -1, count, 0, count, 0, 0, seq) + bytes(count))
        bus.result(lambda h: (h[0], h[4]) == (comm, key) and h[1] not in (KIND[103], KIND[104]))
        return True

    for it in range(iters):
        if (rank, it) == stop:
            log("stops before iteration %d (planted bug)" % it)
            break
        order = list(enumerate(ops))
        if recv_first:
            order.reverse()
        for k, (op, size) in order:
            if (rank, it, k) == skip:
                log("skips op %d of iteration %d (planted bug)" % (k, it))
                continue
            if (rank, it) == halve:
                size //= 2
            now = time.time_ns()
            p = peer if op >= 100 else -1
            if exchange and not exchange_op(op, size, seq):
                rel, last_rank = time.time_ns(), -1
            else:
                bus.send(OP_ARRIVE, struct.pack("<IIQQQQiI", comm, op, seq, size, now, 100000, p, 0))
                rel, last_rank = bus.release(comm, seq)
            bus.send(OP_RECORD, struct.pack("<IIQQQQQiBBBBI", comm, op, seq, size, now, rel, 100000, last_rank,
                                            1, 0, 0, 0, 0))
            seq += 1
        time.sleep(iter_s)
        now = time.time_ns()
        bus.send(ITERATION, struct.pack("<IIQQQQ", it, 0, now, now - last, 100 << 20, 90 << 20))
        last = now
        log("iteration %d done" % it)
    bus.send_json(BYE, {"reason": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
