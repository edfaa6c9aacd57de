#!/usr/bin/env bash
# libprism's cost top-down (issue 27; docs/libprism.md "Cost on a real rank"): native `torchrun` and
# `prism-run --ranks 0 torchrun` of the same GPU-bound job (Megatron's medium GPT, world 1: every rank real, so prism
# adds only itself), alternating in one call, PAIRS pairs; the order flips every pair so that a drift of the machine
# counts against both sides. Each run: the median of Megatron's own "elapsed time per iteration" after the first
# SKIP. Prints each pair's ratio (prism / native), their median and a distribution-free interval for that median
# (order statistics of the binomial(n, 1/2): at least 95 % coverage; n = 6 gives min..max, 96.9 %).
#   tests/gpu/overhead_pairs.sh OUT       PAIRS (6), ITERS (12), SKIP (2), PAIRS_SEQ (2048), PAIRS_MBS (2)
# PAIRS_VARIANT=eager: the second side is native too, with CUDA_MODULE_LOADING=EAGER (what prism-run sets for its
# workers that share a GPU: docs/cli.md), to tell that setting's cost from libprism's. PAIRS_VARIANT=nopreload: the
# second side is `prism-run --no-preload` (prism-run's launch and environment without libprism), to tell the launch's
# cost from libprism's. PAIRS_VARIANT=libprism: the first side is `prism-run --no-preload` instead of native, so that
# the ratio is libprism's alone (the same launcher and environment on both sides: TORCH_NCCL_* settings, the compile
# cache, OMP_NUM_THREADS; docs/cli.md "Environment prism sets").
# Writes OUT/pairs.txt (the table; its last line the summary) and each run's log.
set -uo pipefail
out=$(realpath -m "${1:?usage: overhead_pairs.sh OUT}"); mkdir -p "$out"
PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
PRISM_RUN=$PRISM_BUILD/bin/prism-run
pairs=${PAIRS:-6} iters=${ITERS:-12} skip=${SKIP:-2}
FIDELITY_SEQ=${PAIRS_SEQ:-2048} FIDELITY_MBS=${PAIRS_MBS:-2}
source tests/gpu/megatron_env.sh
job=(pretrain_gpt.py "${MEGATRON_MEDIUM_ARGS[@]}" --global-batch-size 8 --train-iters "$iters")
run() {  # KIND PAIR
  local log=$out/$1.$2.log
  local kind=$1
  [ "$kind" = native ] && [ "${PAIRS_VARIANT:-}" = libprism ] && kind=noprism
  case $kind in
    noprism) (cd "$MEGATRON" && timeout 300 "$PRISM_RUN" --policy mirror --ranks 0 --no-preload --out "$out/native.$2" --quiet \
                torchrun --nproc-per-node 1 "${job[@]}") > "$log" 2>&1
             cat "$out/native.$2"/logs/rank0.log >> "$log" 2>/dev/null ;;
    native) rm -rf "$out/compile-cache"  # cold, as prism-run's workers compile (docs/cli.md "Environment")
            (cd "$MEGATRON" && TORCHINDUCTOR_CACHE_DIR=$out/compile-cache/inductor \
              TRITON_CACHE_DIR=$out/compile-cache/triton timeout 300 "$PYTHON" -m torch.distributed.run --nproc-per-node 1 "${job[@]}") \
              > "$log" 2>&1 ;;
    prism) if [ "${PAIRS_VARIANT:-}" = eager ]; then
             rm -rf "$out/compile-cache"
             (cd "$MEGATRON" && CUDA_MODULE_LOADING=EAGER TORCHINDUCTOR_CACHE_DIR=$out/compile-cache/inductor \
                TRITON_CACHE_DIR=$out/compile-cache/triton timeout 300 "$PYTHON" -m torch.distributed.run \
                --nproc-per-node 1 "${job[@]}") > "$log" 2>&1
             return
           fi
           local no_preload=(); [ "${PAIRS_VARIANT:-}" = nopreload ] && no_preload=(--no-preload)
           (cd "$MEGATRON" && timeout 300 "$PRISM_RUN" --policy mirror --ranks 0 "${no_preload[@]}" --out "$out/prism.$2" --quiet \
              torchrun --nproc-per-node 1 "${job[@]}") > "$log" 2>&1
           cat "$out/prism.$2"/logs/rank0.log >> "$log" 2>/dev/null ;;
  esac
}
for ((p = 1; p <= pairs; p++)); do
  if ((p % 2)); then run native "$p"; run prism "$p"; else run prism "$p"; run native "$p"; fi
done
"$PYTHON" - "$out" "$pairs" "$skip" > "$out/pairs.txt" <<'PY'
import math, re, statistics, sys, os
out, pairs, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def med(path):
    try:
        t = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(path).read())]
    except OSError:
        return float("nan")
    return statistics.median(t[skip:]) if len(t) > skip else float("nan")
rows = []
for p in range(1, pairs + 1):
    n, q = med(os.path.join(out, "native.%d.log" % p)), med(os.path.join(out, "prism.%d.log" % p))
    rows.append((p, n, q, q / n if n == n and q == q and n > 0 else float("nan")))
def host_ns(p):  # libprism's host time per unit on the prism side (the event file's bye line), when it ran
    import json
    try:
        for l in open(os.path.join(out, "prism.%d" % p, "rank0.events.jsonl")):
            if '"bye"' in l: return json.loads(l).get("host_ns")
    except (OSError, ValueError):
        return None
hosts = [h for h in (host_ns(p) for p in range(1, pairs + 1)) if h]
if hosts:
    print("libprism host time per unit (prism side): median %s ns, p90 %s ns over %s units (per run: %s)" % (
        statistics.median(h["p50"] for h in hosts), statistics.median(h["p90"] for h in hosts),
        statistics.median(h["units"] for h in hosts), " ".join(str(h["p50"]) for h in hosts)))
base = "prism-run --no-preload" if os.environ.get("PAIRS_VARIANT") == "libprism" else "native"
print("%-5s %12s %12s %8s   (first side: %s)" % ("pair", "native ms", "prism ms", "ratio", base))
for p, n, q, r in rows:
    print("%-5d %12.2f %12.2f %8.4f" % (p, n, q, r))
ratios = sorted(r for *_, r in rows if r == r)
k = len(ratios)
if k < 2:
    print("pairs with both runs: %d; no summary" % k); sys.exit(1)
# The widest-inner interval [x(j), x(k+1-j)] whose coverage 1 - 2 P(Bin(k, 1/2) < j) is at least 95 %.
cover = lambda j: 1 - 2 * sum(math.comb(k, i) for i in range(j)) / 2 ** k
j = 1
while j + 1 <= k // 2 and cover(j + 1) >= 0.95:
    j += 1
print("median ratio %.4f over %d pairs; %.1f %% interval %.4f..%.4f; pooled medians native %.2f ms, prism %.2f ms"
      % (statistics.median(ratios), k, 100 * cover(j), ratios[j - 1], ratios[k - j],
         statistics.median(n for _, n, _, _ in rows if n == n), statistics.median(q for _, _, q, _ in rows if q == q)))
PY
rc=$?
cat "$out/pairs.txt"
exit $rc
