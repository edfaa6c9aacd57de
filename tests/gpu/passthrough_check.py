"""Passthrough check (issue 10), run under prism-run with ranks 0 and 1 real on two GPUs.

World W (torchrun --nproc-per-node W); ranks 0 and 1 are real, the rest virtual. The group {0, 1} has only real
members on distinct GPUs, so libprism runs it on the real NCCL: an all-reduce over it gives the exact sum of both
ranks' distinct inputs (the mirror policy would give 2 x this rank's own), and a large all-reduce moves at NVLink
speed. The world group (virtual members too) stays emulated. With W == 2 the world itself is all real.
Prints "CHECK name PASS|FAIL detail" lines and "PASSTHROUGH n/m"; exits 0 only when all pass.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    results = []

    def check(name, ok, detail=""):
        results.append(bool(ok))
        print("CHECK %s %s %s" % (name, "PASS" if ok else "FAIL", detail), flush=True)

    # World 1 (one GPU, PRISM_PASSTHROUGH_MIN_MEMBERS=1): the "pair" is the world of one.
    members = [0, 1] if world >= 2 else [0]
    pair = dist.new_group(members)
    x = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(x, group=pair)
    torch.cuda.synchronize()
    want = float(sum(m + 1 for m in members))
    check("pair_allreduce_exact", bool((x == want).all()), "got %s, want %s" % (x[0].item(), want))

    y = torch.full((8,), float(rank + 1), device=dev)
    g = [torch.empty_like(y) for _ in members]
    dist.all_gather(g, y, group=pair)
    torch.cuda.synchronize()
    got = [t[0].item() for t in g]
    check("pair_allgather_exact", got == [float(m + 1) for m in members], "got %s" % got)

    if len(members) == 2:
        # p2p between the real pair (Megatron's pipeline path): rank 0 sends, rank 1 receives.
        z = torch.full((16,), 7.0 if rank == 0 else 0.0, device=dev)
        if rank == 0:
            dist.send(z, 1, group=pair)
        else:
            dist.recv(z, 0, group=pair)
        torch.cuda.synchronize()
        check("pair_sendrecv", z[0].item() == 7.0, "got %s" % z[0].item())

    # Bandwidth of a 256 MiB all-reduce over the pair (bus bandwidth as nccl-tests: 2 (n-1)/n x bytes / time).
    big = torch.ones(64 << 20, device=dev)
    for _ in range(3):
        dist.all_reduce(big, group=pair)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 10
    for _ in range(n):
        dist.all_reduce(big, group=pair)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / n
    n_m = len(members)
    busbw = big.numel() * 4 * (2.0 * (n_m - 1) / n_m if n_m > 1 else 1.0) / dt / 1e9
    check("pair_allreduce_256MiB", busbw > 0, "%.3f ms, busbw %.1f GB/s" % (dt * 1e3, busbw))

    w = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(w)
    torch.cuda.synchronize()
    want = sum(range(1, world + 1)) if world <= 2 else None
    check("world_allreduce", want is None or w[0].item() == want,
          "got %s%s" % (w[0].item(), "" if want is None else ", want %s" % want))
    dist.barrier()
    dist.destroy_process_group()
    print("PASSTHROUGH %d/%d %s" % (sum(results), len(results), "PASS" if all(results) else "FAIL"), flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
