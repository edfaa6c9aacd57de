"""Blocks of iterations with an optional piece of work switched on and off within one run (libprism's
PRISM_GATE_TOGGLE, PRISM_KERNELS_TOGGLE): the iteration times grouped by block, pooled medians, the ratios of
neighbouring blocks and a bootstrap interval over whole blocks. Used by tests/gpu/overhead_toggle.sh and
tests/gpu/kernels_suite.sh, which print it each in their own words.

Block k holds the iterations from mark k*n on: times[i] ran from mark i-1, so its block is (i-1) // n; even blocks
have the work on. The first iteration of each block (just after the switch) and iterations up to `skip` are left
out.
"""
import random
import statistics


def block_stats(times, n, skip):
    """times: seconds per iteration (None where unknown). Returns None when either side has fewer than 3
    iterations, else a dict: on, off (ms lists), median_on, median_off, pairs (on/off medians of blocks 2k, 2k+1),
    bounds (every neighbouring boundary, both ways), boot_lo, boot_hi (2.5 and 97.5 percentiles of the pooled
    ratio, blocks resampled with replacement on each side, fixed seed)."""
    blocks = {}
    for i, x in enumerate(times):
        if i <= skip or x is None or (i - 1) % n == 0:
            continue
        blocks.setdefault((i - 1) // n, []).append(x * 1e3)
    on = [v for b, vs in blocks.items() if b % 2 == 0 for v in vs]
    off = [v for b, vs in blocks.items() if b % 2 == 1 for v in vs]
    if len(on) < 3 or len(off) < 3:
        return {"on": on, "off": off, "enough": False}
    med = lambda b: statistics.median(blocks[b])
    pairs = [med(b) / med(b + 1) for b in sorted(blocks) if b % 2 == 0 and b + 1 in blocks]
    # Both ways (on -> off and off -> on): twice the pairs, and a drift lasting several blocks cancels between a
    # boundary and the next.
    bounds = [med(b) / med(b + 1) if b % 2 == 0 else med(b + 1) / med(b) for b in sorted(blocks) if b + 1 in blocks]
    rng = random.Random(1)
    on_bs = [b for b in blocks if b % 2 == 0]
    off_bs = [b for b in blocks if b % 2 == 1]
    pooled = lambda bs: statistics.median([v for b in bs for v in blocks[b]])
    boot = sorted(pooled([rng.choice(on_bs) for _ in on_bs]) / pooled([rng.choice(off_bs) for _ in off_bs])
                  for _ in range(2000))
    return {"enough": True, "on": on, "off": off, "median_on": statistics.median(on),
            "median_off": statistics.median(off), "pairs": pairs, "bounds": bounds,
            "boot_lo": boot[50], "boot_hi": boot[1949]}
