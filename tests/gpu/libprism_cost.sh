#!/usr/bin/env bash
# libprism's added time on a real rank, bottom-up (issue 27; docs/libprism.md "Cost on a real rank"):
#  1. libprism_cost_bench (ns per call of the CUDA runtime entry points a step makes often) natively, with libprism
#     preloaded (plain), and with libprism preloaded as a virtualised rank (PRISM_GPUS_PER_NODE=8, as under
#     prism-run), alternating, COST_REPS times; the median of each.
#  2. How many of each call one iteration of Megatron's medium GPT (world 1) makes: libprism_call_count.so preloaded
#     natively at COST_ITERS and 2 x COST_ITERS iterations; the difference over the extra iterations.
#  3. The estimate: sum over ops of (virtualised - native ns) x calls per iteration, over the native iteration time
#     (Megatron's own "elapsed time per iteration", median after the first 3).
#  4. World 64 (COST_W64=1, the default; 0 skips it): rank 0 of the medium GPT at world 64 (8 x 8, tp 2, pp 2, global
#     batch 64) under `prism-run --policy mirror --ranks 0`, its communicators emulated, at COST_ITERS and
#     2 x COST_ITERS iterations, with the counter preloaded before libprism (prism-run --no-preload and the two
#     libraries and the Python hook set by hand, since prism-run puts libprism first): the runtime calls per
#     iteration, the units (collectives and groups) per iteration and libprism's host time per unit (the event
#     file's bye host_ns: whole, and less its driver calls), over rank 0's iteration (report.json). The whole host
#     time is counted although it replaces NCCL's own enqueue (an upper bound), and a launch into a full stream queue
#     blocks for time the job's next launch would have waited anyway (docs/libprism.md "Cost on a real rank").
# Needs: PRISM_BUILD with bin/libprism_cost_bench, lib/libprism_call_count.so, lib/libcudart.so.13 (the bench's),
# lib/libprism.so. Writes OUT/cost.txt (the table) and the logs.
#   tests/gpu/libprism_cost.sh OUT
set -uo pipefail
out=$(realpath -m "${1:?usage: libprism_cost.sh OUT}"); mkdir -p "$out"
PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
source tests/gpu/megatron_env.sh
bench=$PRISM_BUILD/bin/libprism_cost_bench lib=$PRISM_BUILD/lib/libprism.so count=$PRISM_BUILD/lib/libprism_call_count.so
reps=${COST_REPS:-3} iters=${COST_ITERS:-10} calls=${COST_CALLS:-50000}
export LD_LIBRARY_PATH=$PRISM_BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
virt=(PRISM_GPUS_PER_NODE=8 PRISM_LOCAL_RANK=0 PRISM_PHYS_DEVICE=0 PRISM_RANK=0 PRISM_WORLD_SIZE=64
      PRISM_OUT_DIR=$out/virt)
# The real libnccl the job loads (PyTorch's wheel), for the bench's native collective rows.
nccl_lib=$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
for ((k = 1; k <= reps; k++)); do
  COST_NCCL_RANKS=1 COST_NCCL_LIB=$nccl_lib timeout 120 "$bench" "$calls" 5 > "$out/bench.native.$k.log" 2>&1
  LD_PRELOAD=$lib timeout 120 "$bench" "$calls" 5 > "$out/bench.preload.$k.log" 2>&1
  env "${virt[@]}" COST_NCCL_RANKS=8 LD_PRELOAD=$lib timeout 120 "$bench" "$calls" 5 > "$out/bench.virtual.$k.log" 2>&1
done
# COST_MODEL=tiny runs the launch-bound tiny GPT instead of the GPU-bound medium one: its host is behind the GPU, so
# its units' driver calls show whether the medium model's (14 us against 6 us alone) wait on a full stream queue.
if [ "${COST_MODEL:-medium}" = tiny ]; then model=("${MEGATRON_TINY_ARGS[@]}"); else model=("${MEGATRON_MEDIUM_ARGS[@]}"); fi
job=(pretrain_gpt.py "${model[@]}" --global-batch-size 8)
for n in "$iters" $((2 * iters)); do
  [ "${COST_W1:-1}" = 1 ] || break  # COST_W1=0: world 64 only
  rm -f "$out/calls.$n.txt"
  (cd "$MEGATRON" && PRISM_CALL_COUNT_OUT=$out/calls.$n.txt LD_PRELOAD=$count timeout 200 "$PYTHON" \
     -m torch.distributed.run --nproc-per-node 1 "${job[@]}" --train-iters "$n") > "$out/megatron.$n.log" 2>&1
done
if [ "${COST_W64:-1}" = 1 ]; then
  w64=(torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py "${model[@]}" --tensor-model-parallel-size 2
       --pipeline-model-parallel-size 2 --global-batch-size 64)
  for n in "$iters" $((2 * iters)); do
    rm -rf "$out/w64.$n" "$out/w64calls.$n.txt"
    (cd "$MEGATRON" && PRISM_CALL_COUNT_OUT=$out/w64calls.$n.txt LD_PRELOAD=$count:$lib \
       PYTHONPATH=$PRISM_BUILD/lib/python${PYTHONPATH:+:$PYTHONPATH} timeout 240 "$PRISM_BUILD/bin/prism-run" \
       --policy mirror --ranks 0 --no-preload --out "$out/w64.$n" --quiet "${w64[@]}" --train-iters "$n") > "$out/w64.$n.log" 2>&1
    cat "$out/w64.$n/logs/rank0.log" >> "$out/w64.$n.log" 2>/dev/null
  done
fi
"$PYTHON" - "$out" "$reps" "$iters" > "$out/cost.txt" <<'EOF'
import os, re, statistics, sys
out, reps, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
woken = {}  # op -> [calls that woke libprism's progress thread, calls], over the virtualised runs
def bench(kind):
    per = {}
    for k in range(1, reps + 1):
        try:
            for l in open(f"{out}/bench.{kind}.{k}.log"):
                m = re.match(r"COST op=(\S+) calls=\d+ median_ns=([\d.]+).*?(?: wakes=(\d+) of (\d+))?$", l)
                if not m: continue
                per.setdefault(m.group(1), []).append(float(m.group(2)))
                if kind == "virtual" and m.group(3):
                    w = woken.setdefault(m.group(1), [0, 0]); w[0] += int(m.group(3)); w[1] += int(m.group(4))
        except OSError:
            pass
    return {op: statistics.median(v) for op, v in per.items()}
def calls(n, prefix="calls"):  # the process that made the most calls (the rank, not its launcher)
    best, most = {}, -1
    try:
        for l in open(f"{out}/{prefix}.{n}.txt"):
            d = {k: int(v) for k, v in (kv.split("=") for kv in l.split()[1:]) if k != "pid"}
            if sum(d.values()) > most: best, most = d, sum(d.values())
    except OSError:
        pass
    return best
def per_iter(op, c1, c2):
    if not (c1 and c2): return float("nan")
    if op == "cudaMalloc+cudaFree": return (c2.get("cudaMalloc", 0) - c1.get("cudaMalloc", 0)) / iters
    n = (c2.get(op, 0) - c1.get(op, 0)) / iters
    if op == "cudaEventRecord": n += (c2.get("cudaEventRecordWithFlags", 0) - c1.get("cudaEventRecordWithFlags", 0)) / iters
    return n
def iter_ms(n):
    try:
        t = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", open(f"{out}/megatron.{n}.log").read())]
    except OSError:
        return None
    return statistics.median(t[3:]) if len(t) > 4 else None
nat, pre, vir = bench("native"), bench("preload"), bench("virtual")
c1, c2 = calls(iters), calls(2 * iters)
it = iter_ms(2 * iters)
print(f"{'op':26s} {'native ns':>10s} {'preload ns':>10s} {'virtual ns':>10s} {'added ns':>9s} {'calls/iter':>10s} {'added us/iter':>13s}")
runtime = [op for op in nat if not op.startswith("nccl")]
def added(op): return vir.get(op, float("nan")) - nat[op]  # ns per call, virtualised less native
def runtime_ns(ca, cb):  # (added ns per iteration: the calls libprism makes slower, and all calls with savings)
    if not (runtime and ca and cb): return None  # no bench rows or no counts: no figure rather than 0
    slower = net = 0.0
    for op in runtime:
        n = per_iter(op, ca, cb); a = added(op)
        if n != n or a != a: return None
        net += a * n; slower += max(0.0, a) * n
    return slower, net
for op in runtime:
    n = per_iter(op, c1, c2)
    print(f"{op:26s} {nat[op]:10.1f} {pre.get(op, float('nan')):10.1f} {vir.get(op, float('nan')):10.1f} {added(op):9.1f} {n:10.1f} {added(op) * n / 1e3:13.2f}")
# A collective's host time with libprism (8 ranks, 7 virtual: planned, timed, gated) against NCCL's own (1 rank,
# its cheapest path): the idle case (each call after the stream drained, as a step's collectives come) decides.
coll = {}
for op in ("ncclAllReduce,idle", "ncclAllReduce"):
    if op in nat and op in vir:
        coll[op] = added(op)
        w = f"; it woke the progress thread {woken[op][0]} of {woken[op][1]} calls" if op in woken else ""
        print(f"{op:26s} {nat[op]:10.1f} {'':>10s} {vir[op]:10.1f} {coll[op]:9.1f}   (NCCL 1 rank natively; libprism 8 ranks, 7 virtual{w})")
per_coll = coll.get("ncclAllReduce,idle")
summary = []
w1_calls = runtime_ns(c1, c2) if c1 else None
if not c1:
    pass  # COST_W1=0
elif it and w1_calls is None:
    summary.append("world 1: no result (a runtime call missing from bench.*.log or calls.*.txt)")
elif it:
    slower, net = w1_calls
    summary.append(f"world 1: native iteration {it:.2f} ms (median of iterations 4-{2*iters}); the runtime calls libprism makes slower add {slower/1e6:.4f} ms per iteration = {100*slower/1e6/it:.3f} % (with the calls it makes faster: {net/1e6:+.4f} ms; collectives at world 1: one-member, duration 0, no gate)")
else:
    summary.append("world 1: no Megatron iteration times (see megatron.*.log)")
def w64_run(n):  # (units, gated units, bye host_ns, iteration s, bye host_phase_mean_ns, host_phase_driver_mean_ns)
    import json
    units = gated = 0; host = None; phases = None; driver = None
    try:
        for l in open(f"{out}/w64.{n}/rank0.events.jsonl"):
            e = json.loads(l)
            if e.get("type") == "op":
                units += 1; gated += "opened_ns" in e
            elif e.get("type") == "bye":
                host = e.get("host_ns"); phases = e.get("host_phase_mean_ns")
                driver = e.get("host_phase_driver_mean_ns")
        it_s = json.load(open(f"{out}/w64.{n}/report.json")).get("iteration_time_s")
    except (OSError, ValueError):
        return None
    return units, gated, host, it_s, phases, driver
r1, r2 = w64_run(iters), w64_run(2 * iters)
if r1 and r2 and r2[2] and r2[3]:
    w1, w2 = calls(iters, "w64calls"), calls(2 * iters, "w64calls")
    slower64, calls_ns = runtime_ns(w1, w2) or (float("nan"), float("nan"))
    print("At world 64, rank 0 (tp 2, pp 2):")
    for op in runtime:
        print(f"  {op:26s} added {added(op):9.1f} ns x {per_iter(op, w1, w2):10.1f} per iteration")
    units = (r2[0] - r1[0]) / iters; gated = (r2[1] - r1[1]) / iters; host = r2[2]
    it64 = r2[3] * 1e3
    unit_ns = units * host["p50"]
    tot = calls_ns + unit_ns
    own = host.get("own_p50")
    if own is not None:
        print(f"  per unit: host time median {host['p50']} ns, p90 {host['p90']}; less its driver calls median {own} ns, p90 {host.get('own_p90')}: {units:.1f} units x {own} ns = {units*own/1e6:.4f} ms per iteration = {100*units*own/1e6/it64:.3f} %")
    if r2[4]:
        print("  per unit, mean ns by phase (own time; unit_stats.h UnitPhase): " +
              ", ".join(f"{k} {v}" for k, v in r2[4].items()))
    if r2[5]:
        print("  per unit, mean ns in driver calls by phase: " + ", ".join(f"{k} {v}" for k, v in r2[5].items() if v))
    if "wakes" in host:
        print(f"  futex wakes of the progress thread by pushes: {host['wakes']} for {host['units']} units")
    if r2[4] and r2[5]:
        # An estimate, not a bound: the unit's payload launch (steps) counted as the kernel launch of NCCL's that it
        # replaces; its own time and its other driver calls (context and capture checks, the gate's stream wait)
        # counted as added. Means of the sampled units.
        own_mean = sum(v for k, v in r2[4].items() if k not in ("driver", "sampled"))
        other_driver = sum(v for k, v in r2[5].items() if k != "steps")
        est = calls_ns + units * (own_mean + other_driver)
        print(f"  estimate, the payload launch counted as NCCL's own: {units:.1f} units x ({own_mean} ns own + "
              f"{other_driver} ns of other driver calls) + runtime calls net of their savings = {est/1e6:.4f} ms per iteration = "
              f"{100*est/1e6/it64:.3f} %")
    print(f"  upper bound, each unit's whole host time in the job counted as added: {units:.1f} units x {host['p50']} ns (median, p90 {host['p90']}) + runtime calls net of their savings {calls_ns/1e6:.4f} ms = {tot/1e6:.4f} ms per iteration = {100*tot/1e6/it64:.3f} %")
    if slower64 != slower64:
        summary.append("world 64: no result (a runtime call missing from bench.*.log or w64calls.*.txt)")
    elif per_coll is None:
        summary.append("world 64: no per-collective micro-benchmark (ncclAllReduce rows missing: see bench.*.log)")
    else:
        bu = slower64 + units * max(0.0, per_coll)
        summary.append(f"world 64: rank 0 iteration {it64:.2f} ms (prism's report); {units:.1f} units per iteration ({gated:.1f} gated) x {per_coll:.0f} ns added per collective + the runtime calls libprism makes slower {slower64/1e6:.4f} ms = {bu/1e6:.4f} ms per iteration = {100*bu/1e6/it64:.3f} % (bottom-up; with the calls it makes faster {calls_ns/1e6:+.4f} ms)")
elif os.environ.get("COST_W64", "1") == "1":
    summary.append("world 64: no result (see w64.*.log)")
for l in summary: print(l)
EOF
cat "$out/cost.txt"
