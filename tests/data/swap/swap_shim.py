#!/usr/bin/env python3
"""A rank of a job that holds GPU memory, for `prism-run collect --swap` tests without a GPU (swap_e2e_test.cc).

It speaks what torch and libprism.so send (reusing tests/data/launcher/fake_shim.py's wire code): the store (the
world communicator's NCCL unique id), then the event bus: kHello with its pid and gpu_id, kMemory (its footprint),
kCommInit, and per iteration collectives on the world communicator whose real data goes through the coordinator's
exchange (kOpData -> kOpResult), as libprism does under collect.

Its GPU memory lives on the fake GPU of tests/unit/swap_fake_cuda.cc (FAKE_GPU_DIR, FAKE_GPU_BYTES): at start it
"allocates" FAKE_RANK_BYTES there and dies with exit 5 ("out of memory") when the GPU has no room, as a real rank
would; after every exchange it waits until its memory is on the GPU (state running), as a CUDA call of a locked process
blocks, and exits 6 when it never comes back (FAKE_WAIT_S). The fake driver SIGSTOPs it while it is locked or checkpointed, so it
makes no progress while swapped out.

Settings: FAKE_ITERS (default 3), FAKE_OPS (default "all_reduce:4096,all_gather:4096"), FAKE_RANK_BYTES,
FAKE_COMPUTE_MS (default 20), FAKE_WAIT_S (give up after this long without an answer, default 60).
FAKE_GATED=1: after each exchange (once its memory is back on the GPU, as libprism's progress thread learns of the
unit only after the exchange's CUDA calls) send kOpArrive and wait for kOpRelease before the next op, as a rank's
stream waits at the gate and torch's host thread at the next synchronisation (`.item()`).
FAKE_STORE_BARRIERS=1: before each iteration a store barrier as torch's (ADD to a counter, the last one SETs a key,
everyone WAITs for it): a rank waiting there is blocked on the store, not in an exchange.
"""
import fcntl
import importlib.util
import json
import os
import socket
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fake_shim", os.path.join(HERE, "..", "launcher", "fake_shim.py"))
fs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fs)


def log(msg):
    print("swap_shim rank %s (pid %d): %s" % (os.environ.get("RANK"), os.getpid(), msg), flush=True)


class Gpu:
    """This process's memory on the fake GPU (one file per pid, flock-serialised with the fake driver)."""

    def __init__(self, nbytes):
        self.dir = os.environ["FAKE_GPU_DIR"]
        self.cap = int(os.environ.get("FAKE_GPU_BYTES", str(80 << 30)))
        self.path = os.path.join(self.dir, str(os.getpid()))
        with self._lock():
            used = self._resident()
            if used + nbytes > self.cap:
                log("out of memory: %d bytes on the GPU, %d more do not fit in %d" % (used, nbytes, self.cap))
                sys.exit(5)
            with open(self.path + ".tmp", "w") as f:
                f.write("%d running\n" % nbytes)
            os.rename(self.path + ".tmp", self.path)

    def _lock(self):
        class L:
            def __enter__(s):
                s.f = open(os.path.join(self.dir, "lock"), "a+")
                fcntl.flock(s.f, fcntl.LOCK_EX)

            def __exit__(s, *a):
                fcntl.flock(s.f, fcntl.LOCK_UN)
                s.f.close()
        return L()

    def _resident(self):
        total = 0
        for name in os.listdir(self.dir):
            if not name.isdigit():
                continue
            try:
                with open(os.path.join(self.dir, name)) as f:
                    b, st = f.read().split()
            except (OSError, ValueError):
                continue
            if st in ("running", "locked"):
                total += int(b)
        return total

    def check_running(self, what):
        """A CUDA call of a locked process blocks until it is unlocked: wait (FAKE_WAIT_S at most, then exit 6)."""
        deadline = time.time() + float(os.environ.get("FAKE_WAIT_S", "60"))
        while True:
            with self._lock():
                with open(self.path) as f:
                    st = f.read().split()[1]
            if st == "running":
                return
            if time.time() > deadline:
                log("its memory stayed %s (%s): never swapped back in" % (st, what))
                sys.exit(6)
            time.sleep(0.01)

    def free(self):
        with self._lock():
            os.unlink(self.path)


def store_add(store, key, value):
    """c10d ADD (query 4): the counter's new value."""
    store.s.sendall(struct.pack("<B", 4) + store._bytes(key.encode()) + struct.pack("<q", value))
    return struct.unpack("<q", store._recv(8))[0]


def store_barrier(store, name, world):
    if store_add(store, name, 1) == world:
        store.set(name + "/last", b"1")
    store.wait_get(name + "/last")


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    nbytes = int(os.environ.get("FAKE_RANK_BYTES", str(1 << 30)))
    gpu = Gpu(nbytes)
    members = list(range(world))
    key = "/default_pg/0//cuda//0"
    store = fs.Store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if rank == 0:
        uid = b"SWAPID00" + bytes(range(120))
        store.set(key, uid)
    else:
        uid = store.wait_get(key)
    bus = fs.Bus()
    bus.s.settimeout(float(os.environ.get("FAKE_WAIT_S", "60")))
    gpu_id = "%s/%s" % (socket.gethostname(), os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    bus.send_json(fs.HELLO, {"rank": rank, "world_size": world, "local_rank": 0, "pid": os.getpid(),
                             "host": socket.gethostname(), "gpu": 0, "gpu_id": gpu_id, "version": fs.VERSION})
    typ, payload = bus.reply()
    if typ != fs.HELLO_ACK:
        raise SystemExit("swap_shim: hello refused: %s" % payload.decode())
    now = time.time_ns()
    bus.send(fs.MEMORY, struct.pack("<QQQ", now, nbytes, nbytes))
    bus.send_json(fs.COMM_INIT, {"key": uid.hex(), "nranks": world, "rank": rank, "desc": "", "name": "0"})
    typ, payload = bus.reply()
    info = json.loads(payload)
    comm = info.get("comm_id", 0)
    if typ != fs.COMM_INFO or comm == 0:
        raise SystemExit("swap_shim: comm init failed: %s" % payload.decode())

    ops = []
    for part in os.environ.get("FAKE_OPS", "all_reduce:4096,all_gather:4096").split(","):
        name, size = part.split(":")
        ops.append((fs.OPS[name], int(size)))
    iters = int(os.environ.get("FAKE_ITERS", "3"))
    compute_s = float(os.environ.get("FAKE_COMPUTE_MS", "20")) / 1000.0
    xkey = 0
    seq = 0
    last = time.time_ns()
    gated = os.environ.get("FAKE_GATED", "0") == "1"
    barriers = os.environ.get("FAKE_STORE_BARRIERS", "0") == "1"
    for it in range(iters):
        if barriers:
            gpu.check_running("before barrier %d" % it)
            store_barrier(store, "fake_barrier/%d" % it, world)
        for op, size in ops:
            gpu.check_running("before op %d" % seq)
            time.sleep(compute_s)  # the compute before the collective, on the GPU
            kind = fs.KIND[op]
            count = size // world if op == fs.OPS["all_gather"] else size
            data = bytes([(rank + xkey) % 256]) * count
            t0 = time.time_ns()
            bus.send(fs.OP_DATA, fs.XHEADER.pack(comm, kind, fs.UINT8, 0, xkey, rank, -1, count, 0, count, 0, 0, seq)
                     + data)
            h, out = bus.result(lambda h, k=xkey: (h[0], h[4]) == (comm, k) and h[1] not in (9, 10))
            if h[11] & fs.X_ERROR:
                log("exchange error at op %d" % seq)
                sys.exit(3)
            if op == fs.OPS["all_reduce"]:
                want = bytes([sum((r + xkey) % 256 for r in members) % 256]) * count
            else:
                want = b"".join(bytes([(r + xkey) % 256]) * count for r in members)
            if out != want:
                log("wrong result of op %d (%d bytes)" % (seq, len(out)))
                sys.exit(4)
            gpu.check_running("after op %d" % seq)  # copying the output back to the GPU
            t1 = time.time_ns()
            if gated:
                bus.send(fs.OP_ARRIVE, struct.pack("<IIQQQQiI", comm, op, seq, size, t0, 100000, -1, 1))
                t1, _ = bus.release(comm, seq)
                gpu.check_running("after the gate of op %d" % seq)
            bus.send(fs.OP_RECORD, struct.pack("<IIQQQQQiBBBBI", comm, op, seq, size, t0, t1, 0, -1, 1, 0, 0, 0, 0))
            xkey += 1
            seq += 1
        now = time.time_ns()
        bus.send(fs.ITERATION, struct.pack("<IIQQQQ", it, 0, now, now - last, nbytes, nbytes))
        last = now
        log("iteration %d done" % it)
    bus.send_json(fs.BYE, {"reason": "done"})
    gpu.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
