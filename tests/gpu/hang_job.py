#!/usr/bin/env python3
"""A plain-torch job with planted communication bugs, for tests/gpu/hang_suite.sh (issue 9's cases).

Run under prism-run with two real ranks of one data-parallel group (default 5 and 517 of a world of 1024, tp 16:
the data-parallel groups are the 16 strided sets {g, g+16, ...} of 64 ranks). Every iteration does, on the rank's
data-parallel group, an all_reduce of a 2 MiB gradient (bf16) and an all_gather_into_tensor of a 2 KiB shard.

  HANG_CASE=skip  rank HANG_BAD_RANK leaves out the all_reduce of iteration HANG_ITER (so at that sequence it issues
                  the all_gather while its peers issue the all_reduce)
  HANG_CASE=size  rank HANG_BAD_RANK all_reduces 1 MiB at iteration HANG_ITER, its peers 2 MiB
  HANG_CASE=p2p   the two real ranks (HANG_BAD_RANK and HANG_PEER) both send 4 MiB to each other first, then
                  receive (no group: torch's 2-rank p2p communicator): a deadlock in real NCCL
  HANG_CASE=none  no bug (the suite's control: the job finishes)

Prints "HANG_BUG t=<unix seconds>" when the bug is executed, "iteration N done" after each iteration, "DONE" at the end.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    case = os.environ.get("HANG_CASE", "skip")
    bad = int(os.environ.get("HANG_BAD_RANK", "517"))
    peer_of_bad = int(os.environ.get("HANG_PEER", "5"))
    bug_iter = int(os.environ.get("HANG_ITER", "3"))
    iters = int(os.environ.get("HANG_ITERS", "6"))
    tp = int(os.environ.get("HANG_TP", "16"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    t0 = time.time()
    dist.init_process_group("nccl")
    # Every rank creates every data-parallel group (torch requires all ranks to call new_group for each group).
    mine = None
    for g in range(tp):
        ranks = list(range(g, world, tp))
        try:
            grp = dist.new_group(ranks, group_desc="DATA_PARALLEL_GROUP")
        except TypeError:  # a torch without group_desc
            grp = dist.new_group(ranks)
        if rank in ranks:
            mine = grp
    print("init_s=%.1f dp_group_size=%d" % (time.time() - t0, world // tp), flush=True)

    if case == "p2p":
        peer = peer_of_bad if rank == bad else bad
        t = torch.ones(1 << 20, dtype=torch.float32, device="cuda")  # 4 MiB: beyond any eager buffering
        r = torch.empty_like(t)
        print("HANG_BUG t=%.3f send to %d before receiving" % (time.time(), peer), flush=True)
        dist.send(t, dst=peer)
        dist.recv(r, src=peer)
        torch.cuda.synchronize()
        print("DONE", flush=True)
        return 0

    grad = torch.ones(1 << 20, dtype=torch.bfloat16, device="cuda")         # 2 MiB
    small = torch.ones(1 << 19, dtype=torch.bfloat16, device="cuda")        # 1 MiB
    shard = torch.ones(1 << 10, dtype=torch.bfloat16, device="cuda")        # 2 KiB
    out = torch.empty((world // tp) * shard.numel(), dtype=torch.bfloat16, device="cuda")
    for it in range(iters):
        buggy = rank == bad and it == bug_iter
        if case == "skip" and buggy:
            print("HANG_BUG t=%.3f skips the all_reduce of iteration %d" % (time.time(), it), flush=True)
        elif case == "size" and buggy:
            print("HANG_BUG t=%.3f all_reduces 1 MiB at iteration %d" % (time.time(), it), flush=True)
            dist.all_reduce(small, group=mine)
        else:
            dist.all_reduce(grad, group=mine)
        dist.all_gather_into_tensor(out, shard, group=mine)
        torch.cuda.synchronize()
        print("iteration %d done" % it, flush=True)
    dist.destroy_process_group()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
