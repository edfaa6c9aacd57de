#!/usr/bin/env bash
# libprism's added time on a real rank, bottom-up (issue 27; docs/libprism.md "Cost on a real rank"):
#  1. libprism_cost_bench (ns per call of the CUDA runtime entry points a step makes often) natively, with libprism
#     preloaded (plain), and with libprism preloaded as a virtualised rank (PRISM_GPUS_PER_NODE=8, as under
#     prism-run), alternating, COST_REPS times; the median of each.
#  2. How many of each call one iteration of Megatron's medium GPT (world 1) makes: libprism_call_count.so preloaded
#     natively at COST_ITERS and 2 x COST_ITERS iterations; the difference over the extra iterations.
#  3. The estimate: sum over ops of (virtualised - native ns) x calls per iteration, over the native iteration time
#     (Megatron's own "elapsed time per iteration", median after the first 3).
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
for ((k = 1; k <= reps; k++)); do
  timeout 120 "$bench" "$calls" 5 > "$out/bench.native.$k.log" 2>&1
  LD_PRELOAD=$lib timeout 120 "$bench" "$calls" 5 > "$out/bench.preload.$k.log" 2>&1
  env "${virt[@]}" LD_PRELOAD=$lib timeout 120 "$bench" "$calls" 5 > "$out/bench.virtual.$k.log" 2>&1
done
job=(pretrain_gpt.py "${MEGATRON_MEDIUM_ARGS[@]}" --global-batch-size 8)
for n in "$iters" $((2 * iters)); do
  rm -f "$out/calls.$n.txt"
  (cd "$MEGATRON" && PRISM_CALL_COUNT_OUT=$out/calls.$n.txt LD_PRELOAD=$count timeout 200 "$PYTHON" \
     -m torch.distributed.run --nproc-per-node 1 "${job[@]}" --train-iters "$n") > "$out/megatron.$n.log" 2>&1
done
"$PYTHON" - "$out" "$reps" "$iters" > "$out/cost.txt" <<'EOF'
import re, statistics, sys
out, reps, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def bench(kind):
    per = {}
    for k in range(1, reps + 1):
        try:
            for l in open(f"{out}/bench.{kind}.{k}.log"):
                m = re.match(r"COST op=(\S+) calls=\d+ median_ns=([\d.]+)", l)
                if m: per.setdefault(m.group(1), []).append(float(m.group(2)))
        except OSError:
            pass
    return {op: statistics.median(v) for op, v in per.items()}
def calls(n):
    best = {}
    try:
        for l in open(f"{out}/calls.{n}.txt"):
            d = dict(kv.split("=") for kv in l.split()[1:])
            if int(d.get("cudaLaunchKernel", 0)) >= int(best.get("cudaLaunchKernel", -1)): best = d
    except OSError:
        pass
    return {k: int(v) for k, v in best.items() if k != "pid"}
def iter_ms(n):
    t = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", open(f"{out}/megatron.{n}.log").read())]
    return statistics.median(t[3:]) if len(t) > 4 else None
nat, pre, vir = bench("native"), bench("preload"), bench("virtual")
c1, c2 = calls(iters), calls(2 * iters)
it = iter_ms(2 * iters)
print(f"{'op':26s} {'native ns':>10s} {'preload ns':>10s} {'virtual ns':>10s} {'added ns':>9s} {'calls/iter':>10s} {'added us/iter':>13s}")
total_ns = 0.0
for op in nat:
    per_iter = (c2.get(op, 0) - c1.get(op, 0)) / iters if c1 and c2 else float("nan")
    if op == "cudaEventRecord": per_iter += (c2.get("cudaEventRecordWithFlags", 0) - c1.get("cudaEventRecordWithFlags", 0)) / iters
    if op == "cudaMalloc+cudaFree": per_iter = (c2.get("cudaMalloc", 0) - c1.get("cudaMalloc", 0)) / iters
    added = vir.get(op, float("nan")) - nat[op]
    us = added * per_iter / 1e3
    if us == us: total_ns += added * per_iter
    print(f"{op:26s} {nat[op]:10.1f} {pre.get(op, float('nan')):10.1f} {vir.get(op, float('nan')):10.1f} {added:9.1f} {per_iter:10.1f} {us:13.2f}")
if it:
    print(f"native iteration {it:.2f} ms (median of iterations 4-{2*iters}); added {total_ns/1e6:.4f} ms per iteration = {100*total_ns/1e6/it:.3f} % (runtime calls only; collectives: the shim suite's host cost per collective)")
else:
    print("no Megatron iteration times (see megatron.*.log)")
EOF
cat "$out/cost.txt"
