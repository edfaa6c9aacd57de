#!/usr/bin/env python3
"""Where a rank's peak of allocated GPU memory comes from, read from torch memory snapshots.

  tests/gpu/mem_snapshot.py SNAPSHOT.pickle [...]      (torch.cuda.memory._dump_snapshot files)
  tests/gpu/mem_snapshot.py --self-test

For each file: replays its allocation trace (device 0) from the allocated bytes at the trace's start (the live
blocks at the dump minus the trace's net change), finds the peak, and prints the blocks live at the peak grouped by
the innermost frame in the job's code (megatron/, pretrain_gpt) and the innermost frame of all. torch counts a block
as allocated until its free is requested (free_requested), so that is when it leaves the sum here too; bytes whose
free was requested but not completed at the peak (a tensor recorded on another stream) are printed apart.
Used by the megatron suite's MEM_SNAPSHOT=1 (it placed the MoE collect's 63.5 MB transient: a cold torch.compile; docs/cli.md "Environment").
"""
import collections
import pickle
import sys

MB = 1e6


def frame_key(frames, job=True):
    for f in frames or []:
        name = f.get("filename", "")
        if not job or "megatron/" in name or "pretrain_gpt" in name:
            return "%s:%s %s" % (name.split("site-packages/")[-1].split("megatron/")[-1], f.get("line"), f.get("name"))
    return "(no %sframe)" % ("job " if job else "")


def analyse(snap, top=12):
    traces = snap.get("device_traces") or []
    trace = traces[0] if traces else []
    live_now = sum(b["size"] for seg in snap.get("segments", []) if seg.get("device", 0) == 0
                   for b in seg.get("blocks", []) if b.get("state") == "active_allocated")
    net = 0
    for e in trace:
        if e["action"] == "alloc":
            net += e["size"]
        elif e["action"] == "free_requested":
            net -= e["size"]
    base = live_now - net
    cur, peak, peak_at = base, base, -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            cur += e["size"]
            if cur > peak:
                peak, peak_at = cur, i
        elif e["action"] == "free_requested":
            cur -= e["size"]
    live, pending = {}, {}
    for e in trace[:peak_at + 1]:
        a = e.get("addr")
        if e["action"] == "alloc":
            live[a] = e
        elif e["action"] == "free_requested":
            pending[a] = live.pop(a, e)
        elif e["action"] == "free_completed":
            pending.pop(a, None)
    lines = ["entries %d, allocated at the trace's start %.2f MB, peak %.2f MB at entry %d, at the dump %.2f MB"
             % (len(trace), base / MB, peak / MB, peak_at, live_now / MB)]
    if peak_at < 0:
        return lines
    allocated_in_trace = sum(e["size"] for e in live.values())
    lines.append("live at the peak and allocated within the trace: %.2f MB in %d blocks; free requested, not completed:"
                 " %.2f MB" % (allocated_in_trace / MB, len(live), sum(e["size"] for e in pending.values()) / MB))
    for job in (True, False):
        by = collections.Counter()
        count = collections.Counter()
        for e in live.values():
            k = frame_key(e.get("frames"), job)
            by[k] += e["size"]
            count[k] += 1
        lines.append("  by %s frame:" % ("job" if job else "innermost"))
        for k, b in by.most_common(top):
            lines.append("    %9.2f MB %5d  %s" % (b / MB, count[k], k))
    return lines


def self_test():
    f = [{"filename": "/x/megatron/core/a.py", "line": 3, "name": "fwd"}]
    g = [{"filename": "/x/torch/b.py", "line": 9, "name": "op"}] + f
    snap = {"segments": [{"device": 0, "blocks": [{"size": 100, "state": "active_allocated"},
                                                  {"size": 7, "state": "inactive"}]}],
            "device_traces": [[
                {"action": "alloc", "addr": 1, "size": 50, "frames": f},
                {"action": "alloc", "addr": 2, "size": 30, "frames": g},
                {"action": "free_requested", "addr": 2, "size": 30, "frames": g},
                {"action": "alloc", "addr": 3, "size": 40, "frames": g},
                {"action": "free_requested", "addr": 1, "size": 50, "frames": f},
                {"action": "free_requested", "addr": 3, "size": 40, "frames": g},
                {"action": "alloc", "addr": 4, "size": 60, "frames": f}]]}
    # net = 50+30-30+40-50-40+60 = 60, base = 100-60 = 40; peak 40+50+40 = 130 at entry 3.
    out = analyse(snap)
    assert "at entry 3" in out[0], out
    assert "%.2f MB" % (40 / MB) in out[0], out
    assert "in 2 blocks" in out[1] and "%.2f MB" % (30 / MB) in out[1].split("completed:")[1], out
    assert any("core/a.py:3 fwd" in l for l in out), out
    assert any("torch/b.py:9 op" in l for l in out), out
    print("mem_snapshot self-test: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    for path in sys.argv[1:]:
        print("== %s" % path)
        try:
            with open(path, "rb") as fh:
                snap = pickle.load(fh)
        except Exception as e:  # a snapshot cut short by the poller's copy: say so and go on
            print("  unreadable: %s" % e)
            continue
        for l in analyse(snap):
            print("  " + l)
