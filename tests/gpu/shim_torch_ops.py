"""Plain torch as logical rank RANK of WORLD_SIZE on one GPU, under libprism (mirror policy).

Runs every torch.distributed call Megatron uses and checks the mirror values:
  all_reduce SUM (n x input), AVG (input), MAX (input); all_gather_into_tensor (n copies); reduce_scatter_tensor
  SUM (n x this rank's own chunk); broadcast from a virtual root (unchanged); all_to_all_single with even and with
  symmetric uneven splits (receives what it sends); batch_isend_irecv (a receive gets this rank's own send of the
  same size); barrier; new_group over subsets (rank 5 a member and a leader of some, not of others).
Prints one line per check "CHECK <name> PASS|FAIL <detail>" and exits 0 only when all pass.

Started by tests/gpu/shim_suite.sh with the environment prism-run would set (LD_PRELOAD, PRISM_*, RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, TORCHELASTIC_USE_AGENT_STORE=True). The store: a TCPStore server is
started here, and the NCCL unique-id keys a virtual group leader would write are pre-set (what the coordinator's
stand-in does under prism-run).
"""
import ctypes
import datetime
import json
import os
import time
import sys

import torch
import torch.distributed as dist

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok)))
    print("CHECK %s %s %s" % (name, "PASS" if ok else "FAIL", detail), flush=True)


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    port = int(os.environ["MASTER_PORT"])
    # The store a real launcher (or the coordinator) would serve. Group leaders that are virtual never write
    # their unique ids: pre-set every group's key (any 128 bytes do; libprism accepts them).
    # Under prism-run (SHIM_OWN_STORE=0) the coordinator is the store and stands in for virtual leaders itself.
    t0 = time.time()
    if os.environ.get("SHIM_OWN_STORE", "1") == "1":
        server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=60))
        # Wire keys: the default group's "/default_pg/0//cuda//0", new_group G's "/default_pg/0//G//cuda//0".
        server.set("default_pg/0//cuda//0", b"P" * 128)
        for g in range(1, 32):
            server.set("default_pg/0//%d//cuda//0" % g, b"P" * 128)

    prism = ctypes.CDLL(None)
    check("libprism_preloaded", hasattr(prism, "prism_version"))
    check("device_count_virtual", torch.cuda.device_count() == int(os.environ["PRISM_GPUS_PER_NODE"]),
          "torch.cuda.device_count()=%d" % torch.cuda.device_count())
    torch.cuda.set_device(local)  # the call that failed with "invalid device ordinal" before virtualisation
    check("set_device_local_rank", torch.cuda.current_device() == local, "current=%d" % torch.cuda.current_device())
    try:
        props = torch.cuda.get_device_properties(local)
        check("device_properties", props.total_memory > 0, props.name)
    except Exception as e:  # keep going: the distributed checks matter more
        check("device_properties", False, repr(e))
    dev = torch.device("cuda", local)

    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    print("INIT world=%d init_process_group_s=%.3f" % (world, time.time() - t0), flush=True)
    n = world

    x = torch.arange(1024, device=dev, dtype=torch.float32) * 0.5 + rank
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    check("all_reduce_sum", torch.equal(y, x * n))
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    check("all_reduce_avg", torch.allclose(y, x))
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    check("all_reduce_max", torch.equal(y, x))
    yb = x.to(torch.bfloat16)
    z = yb.clone()
    dist.all_reduce(z)
    check("all_reduce_sum_bf16", torch.allclose(z.float(), (yb.float() * n).to(torch.bfloat16).float()))

    small = torch.arange(16, device=dev, dtype=torch.float32) + 100 * rank
    out = torch.empty(16 * n, device=dev)
    dist.all_gather_into_tensor(out, small)
    check("all_gather_into_tensor", torch.equal(out.view(n, 16), small.expand(n, 16)))

    inp = torch.arange(16 * n, device=dev, dtype=torch.float32)
    rs = torch.empty(16, device=dev)
    dist.reduce_scatter_tensor(rs, inp, op=dist.ReduceOp.SUM)
    own = inp.view(n, 16)[rank]
    check("reduce_scatter_tensor", torch.equal(rs, own * n), "expected n x own chunk")

    b = x.clone()
    dist.broadcast(b, src=0)  # root 0 is virtual: it mirrors this rank's own data
    check("broadcast_virtual_root", torch.equal(b, x))
    b = x.clone()
    dist.broadcast(b, src=rank)
    check("broadcast_own_root", torch.equal(b, x))

    a2a_in = torch.arange(4 * n, device=dev, dtype=torch.float32) + rank
    a2a_out = torch.empty_like(a2a_in)
    dist.all_to_all_single(a2a_out, a2a_in)
    check("all_to_all_single_even", torch.equal(a2a_out, a2a_in))

    # Uneven but symmetric splits (what MoE token counts look like under mirror): peer j gets 1 + j % 3 rows.
    splits = [1 + j % 3 for j in range(n)]
    u_in = torch.arange(sum(splits) * 8, device=dev, dtype=torch.float32).view(-1, 8) + rank
    u_out = torch.empty_like(u_in)
    dist.all_to_all_single(u_out, u_in, output_split_sizes=splits, input_split_sizes=splits)
    check("all_to_all_single_uneven", torch.equal(u_out, u_in), "receives what it sends")

    # Uneven, not symmetric: shapes must work; values come from own sends of the same size or seeded random.
    out_splits = [2] * n
    in_splits = [1 + (j % 2) * 2 for j in range(n)]
    total_in = sum(in_splits)
    if total_in == sum(out_splits):
        w_in = torch.ones(total_in, device=dev)
        w_out = torch.empty(sum(out_splits), device=dev)
        dist.all_to_all_single(w_out, w_in, output_split_sizes=out_splits, input_split_sizes=in_splits)
        check("all_to_all_single_asymmetric", bool(torch.isfinite(w_out).all()), "finite outputs")

    nxt, prv = (rank + 1) % n, (rank - 1) % n
    send_t = torch.arange(64, device=dev, dtype=torch.float32) + 7 * rank
    recv_t = torch.zeros(64, device=dev)
    ops = [dist.P2POp(dist.isend, send_t, nxt), dist.P2POp(dist.irecv, recv_t, prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    check("batch_isend_irecv", torch.equal(recv_t, send_t), "recv = own send of the same size")

    dist.barrier()
    check("barrier", True)

    # Subgroups, as Megatron creates them: every rank calls new_group for every group, in the same order.
    tp = dist.new_group([4, 5, 6, 7])           # member, not leader
    lead = dist.new_group([5, 9, 13, 17])       # member and leader (writes its own unique id)
    other = dist.new_group([0, 1, 2, 3])        # not a member
    t = torch.ones(8, device=dev)
    dist.all_reduce(t, group=tp)
    check("new_group_member_all_reduce", torch.equal(t, torch.full_like(t, 4.0)))
    t = torch.ones(8, device=dev)
    dist.all_reduce(t, group=lead)
    check("new_group_leader_all_reduce", torch.equal(t, torch.full_like(t, 4.0)))
    check("new_group_non_member", other == dist.GroupMember.NON_GROUP_MEMBER)
    g = torch.empty(4 * 8, device=dev)
    dist.all_gather_into_tensor(g, torch.arange(8, device=dev, dtype=torch.float32), group=tp)
    check("new_group_all_gather", torch.equal(g.view(4, 8), torch.arange(8, device=dev).float().expand(4, 8)))

    # An optimizer step marks an iteration (Python hook) and GPU memory is accounted.
    model = torch.nn.Linear(64, 64, device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(8, 64, device=dev)).sum()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    prism.prism_drain.argtypes = [ctypes.c_double]
    check("gates_drained", prism.prism_drain(ctypes.c_double(30.0)) == 1)
    prism.prism_device_bytes_peak.restype = ctypes.c_ulonglong
    peak = prism.prism_device_bytes_peak()
    check("memory_accounted", peak >= torch.cuda.max_memory_allocated(),
          "shim peak %d >= torch max allocated %d" % (peak, torch.cuda.max_memory_allocated()))

    # Triton (torch.compile) on the virtual device: its driver utilities call cuDeviceGet(current_device()).
    try:
        fn = torch.compile(lambda a: torch.nn.functional.gelu(a) * 2.0 + 1.0)
        a = torch.randn(4096, device=dev)
        check("torch_compile_virtual_device", torch.allclose(fn(a), torch.nn.functional.gelu(a) * 2.0 + 1.0,
                                                             atol=1e-5))
    except Exception as e:
        check("torch_compile_virtual_device", False, repr(e)[-400:])

    dist.destroy_process_group()
    prism.prism_shutdown()
    path = os.path.join(os.environ["PRISM_OUT_DIR"], "rank%d.events.jsonl" % rank)
    kinds = {}
    ops_seen = set()
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            kinds[j["type"]] = kinds.get(j["type"], 0) + 1
            if j["type"] == "op":
                ops_seen.add(j["op"])
    check("events_file", kinds.get("hello") == 1 and kinds.get("bye") == 1 and kinds.get("iter", 0) >= 3
          and kinds.get("op", 0) > 10, json.dumps(kinds))
    check("events_ops", {"allreduce", "allgather", "reducescatter", "broadcast"} <= ops_seen, sorted(ops_seen))
    server = None
    ok = all(r[1] for r in RESULTS)
    print("TORCH_OPS %s %d/%d" % ("PASS" if ok else "FAIL", sum(r[1] for r in RESULTS), len(RESULTS)), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
