#!/usr/bin/env python3
"""Stands in for a training job in tests/unit/launcher_e2e_test.cc (no GPU, no torch, no libprism).

As one worker of `prism-run ... torchrun ... fake_worker.py ARGS` it:
  1. records its argv and the environment prism gave it in $PRISM_OUT_DIR/fake_rank<R>.json;
  2. joins the coordinator's store like torch's TCPStore client (VALIDATE, PING, ADD "init/" 1) and records the
     count the store answered (the virtual ranks are counted in by the coordinator);
  3. writes the rank event file libprism would write ($PRISM_OUT_DIR/rank<R>.events.jsonl: hello, comm, op,
     iter, bye) for FAKE_ITERS iterations of FAKE_ITER_MS * (1 + local rank) milliseconds;
  4. exits 3 after printing "boom" when its rank is FAKE_FAIL_RANK (after FAKE_FAIL_AFTER iterations).
With FAKE_EVENTS_FROM=DIR it instead writes DIR/rank<R>.events.jsonl as its event file (a recorded run's, e.g.
tests/data/graph/megatron_w64_collect), with every time stretched by FAKE_SCALE (default 1) from the file's first
stamp, and the payload file prism asked for (FAKE_FAIL_IF_GRAPH=1: exits 3 when given a graph; =FILE:N after N such runs) (PRISM_RECORD_PAYLOADS) with just its header: the stage driver's tests
(collect -> fill -> emulate) run on it. FAKE_ALTERNATE=FILE stretches every other run of a rank (counted in FILE.rank<R>) by 1.3.
"""
import json
import os
import socket
import struct
import sys
import time


def store_add_init():
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(struct.pack("<BI", 0, 0x3C85F7CE))  # VALIDATE
    s.sendall(struct.pack("<BI", 13, os.getpid() & 0xFFFFFFFF))  # PING
    echo = s.recv(4, socket.MSG_WAITALL)
    key = b"init/"
    s.sendall(struct.pack("<BQ", 4, len(key)) + key + struct.pack("<q", 1))  # ADD init/ 1
    count = struct.unpack("<q", s.recv(8, socket.MSG_WAITALL))[0]
    s.close()
    return struct.unpack("<I", echo)[0] == os.getpid() & 0xFFFFFFFF, count


def replay_events(rank, out):
    src = os.path.join(os.environ["FAKE_EVENTS_FROM"], "rank%d.events.jsonl" % rank)
    scale = float(os.environ.get("FAKE_SCALE", "1"))
    counter = os.environ.get("FAKE_ALTERNATE")
    if counter:
        counter += ".rank%d" % rank
        n = int(open(counter).read() or "0") if os.path.exists(counter) else 0
        with open(counter, "w") as f:
            f.write(str(n + 1))
        scale *= 1.3 if n % 2 else 1.0
    if not os.path.exists(src):
        print("fake worker: no recorded events for rank %d in %s" % (rank, src), file=sys.stderr, flush=True)
        return 5
    lines = [json.loads(l) for l in open(src) if l.strip()]
    t0 = next((l["t_ns"] for l in lines if "t_ns" in l), 0)
    with open(os.path.join(out, "rank%d.events.jsonl" % rank), "w") as ev:
        for l in lines:
            for k in ("t_ns", "arrival_ns", "release_ns", "opened_ns"):
                if isinstance(l.get(k), int) and l[k] > 0:
                    l[k] = t0 + int((l[k] - t0) * scale)
            if isinstance(l.get("dur_ns"), int):
                l["dur_ns"] = int(l["dur_ns"] * scale)
            ev.write(json.dumps(l) + "\n")
    payloads = os.environ.get("PRISM_RECORD_PAYLOADS")
    if payloads:
        with open(payloads, "wb") as f:
            f.write(b"PRSMPAY1")
    print("fake worker rank %d replayed %d event lines (x%.2f)" % (rank, len(lines), scale), flush=True)
    return 0


def main():
    rank = int(os.environ["RANK"])
    out = os.environ["PRISM_OUT_DIR"]
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
             "CUDA_VISIBLE_DEVICES", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ENABLE_MONITORING",
             "TORCH_NCCL_RANKS_PER_ROOT", "CUDA_MODULE_LOADING", "PRISM_RANK", "PRISM_WORLD_SIZE", "PRISM_LAYOUT",
             "PRISM_GPUS_PER_NODE", "PRISM_COORD_SOCKET", "LD_PRELOAD", "FAKE_USER_VAR", "PRISM_GRAPH",
             "PRISM_PAYLOAD_FILE", "PRISM_RECORD_PAYLOADS", "PRISM_LOCKSTEP_SLOTS", "TORCHINDUCTOR_CACHE_DIR",
             "TRITON_CACHE_DIR"]
    info = {"argv": sys.argv, "env": {n: os.environ.get(n) for n in names}}
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:  # as torch.compile would: the run must remove it
        os.makedirs(cache, exist_ok=True)
        open(os.path.join(cache, "compiled.py"), "w").write("# fake\n")
    if os.environ.get("FAKE_STORE", "1") == "1":
        info["ping_ok"], info["init_count"] = store_add_init()
    with open(os.path.join(out, "fake_rank%d.json" % rank), "w") as f:
        json.dump(info, f)
    if os.environ.get("FAKE_FAIL_IF_GRAPH") and os.environ.get("PRISM_GRAPH"):
        # FAKE_FAIL_IF_GRAPH=1: every run given a graph fails; =FILE:N: the first N such runs (counted in FILE) pass.
        spec = os.environ["FAKE_FAIL_IF_GRAPH"]
        fail = True
        if ":" in spec:
            path, n = spec.rsplit(":", 1)
            done = int(open(path).read() or "0") if os.path.exists(path) else 0
            with open(path, "w") as f:
                f.write(str(done + 1))
            fail = done >= int(n)
        if fail:
            print("boom: rank %d fails when given a graph" % rank, file=sys.stderr, flush=True)
            return 3
    if os.environ.get("FAKE_EVENTS_FROM"):
        return replay_events(rank, out)

    iters = int(os.environ.get("FAKE_ITERS", "4"))
    iter_ms = float(os.environ.get("FAKE_ITER_MS", "20"))
    fail_rank = int(os.environ.get("FAKE_FAIL_RANK", "-1"))
    fail_after = int(os.environ.get("FAKE_FAIL_AFTER", "1"))
    local = int(os.environ["LOCAL_RANK"])
    dur_ns = int(iter_ms * (1 + local) * 1e6)
    path = os.path.join(out, "rank%d.events.jsonl" % rank)
    with open(path, "a") as ev:
        def emit(obj):
            ev.write(json.dumps(obj) + "\n")
            ev.flush()

        emit({"type": "hello", "v": 1, "rank": rank, "world_size": int(os.environ["WORLD_SIZE"]),
              "local_rank": local, "pid": os.getpid(), "host": socket.gethostname(), "gpu": 0,
              "t_ns": time.time_ns()})
        emit({"type": "comm", "comm_id": 1, "key": "/default_pg/0//1//cuda//0", "desc": "TENSOR_MODEL_PARALLEL_GROUP",
              "nranks": 2, "rank": rank % 2})
        print("fake worker rank %d starting %d iterations" % (rank, iters), flush=True)
        for it in range(iters):
            if rank == fail_rank and it == fail_after:
                print("boom: rank %d fails on purpose" % rank, file=sys.stderr, flush=True)
                sys.exit(3)
            time.sleep(iter_ms * (1 + local) / 1000.0)
            now = time.time_ns()
            # One all-reduce per iteration: held 2 ms, of which 1.5 ms modelled transfer -> 0.5 ms waiting on rank 1.
            emit({"type": "op", "comm_id": 1, "seq": it, "op": "all_reduce", "dtype": "bf16", "bytes": 1 << 20,
                  "peer": -1, "arrival_ns": now - 2_000_000, "release_ns": now, "model_dur_ns": 1_500_000,
                  "wait_on_rank": 1})
            # The first iteration is slow (warm-up) so the report must leave it out.
            d = dur_ns * (5 if it == 0 else 1)
            emit({"type": "iter", "iteration": it, "t_ns": now, "dur_ns": d, "peak_bytes": (100 + it) * 1_000_000,
                  "torch_max_allocated": (90 + it) * 1_000_000})
            print("iteration %d done" % it, flush=True)
        emit({"type": "bye", "t_ns": time.time_ns(), "peak_bytes": 150_000_000})
    return 0


if __name__ == "__main__":
    sys.exit(main())
