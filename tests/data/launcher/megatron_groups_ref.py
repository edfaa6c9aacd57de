#!/usr/bin/env python3
"""Regenerates the golden files megatron_groups_*.txt from Megatron-LM's own code.

Runs megatron/core/parallel_state.py's initialize_model_parallel (from a local Megatron-LM checkout; nothing of
it is copied here) against a stand-in torch.distributed that only records every new_group call, and prints one
line per call: "<group_desc> <member ranks...>", in call order. tests/unit/world_test.cc compares
prism::world::World::MegatronGroups() with these files.

Usage:
  git --git-dir=<Megatron-LM>.git show HEAD:megatron/core/parallel_state.py > /tmp/parallel_state.py
  python3 megatron_groups_ref.py tp=2,pp=2 16 /tmp/parallel_state.py > megatron_groups_tp-2_pp-2_dp-4.txt
The goldens in this folder came from Megatron-LM d98e8a64. Needs no torch, numpy or einops.
"""
import math
import re
import sys
import types


def main():
    spec, world = sys.argv[1], int(sys.argv[2])
    path = sys.argv[3] if len(sys.argv) > 3 else "/tmp/parallel_state.py"
    kv = dict(x.split("=") for x in spec.split(","))
    calls = []

    class Dist:  # records new_group calls; rank 0 of `world`
        def is_initialized(self):
            return True

        def get_world_size(self):
            return world

        def get_rank(self):
            return 0

        def new_group(self, ranks=None, backend=None, group_desc=None, **kw):
            calls.append((group_desc, list(ranks)))
            return object()

        def barrier(self, *a, **k):
            pass

    class Anything:
        def __getattr__(self, n):
            return Anything()

        def __call__(self, *a, **k):
            return Anything()

    torch = types.ModuleType("torch")
    torch.distributed = Dist()
    torch._C = Anything()
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0, synchronize=lambda: None)
    np = types.ModuleType("numpy")
    np.prod = lambda a: math.prod(a)
    np.array = lambda a: list(a)

    class Rows(list):
        def tolist(self):
            return [list(x) for x in self]

    def rearrange(a, pattern, u, s, l):  # the one pattern create_hierarchical_groups uses
        assert pattern == "(l s u) -> (l u) s"
        return Rows([[a[li * s * u + si * u + ui] for si in range(s)] for li in range(l) for ui in range(u)])

    einops = types.ModuleType("einops")
    einops.rearrange = rearrange
    sys.modules.update({"torch": torch, "torch.distributed": torch.distributed, "numpy": np, "einops": einops})

    code = open(path).read()
    code = re.sub(r"^from \.utils import.*$",
                  "def is_torch_min_version(v): return True\nclass GlobalMemoryBuffer: pass", code, flags=re.M)
    code = re.sub(r"^from megatron.*$", "", code, flags=re.M)
    g = {"__name__": "parallel_state"}
    exec(compile(code, "parallel_state.py", "exec"), g)
    g["_set_global_memory_buffer"] = lambda: None
    g["get_nccl_options"] = lambda *a: None
    g["initialize_model_parallel"](
        tensor_model_parallel_size=int(kv.get("tp", 1)),
        pipeline_model_parallel_size=int(kv.get("pp", 1)),
        context_parallel_size=int(kv.get("cp", 1)),
        expert_model_parallel_size=int(kv.get("ep", 1)),
        expert_tensor_parallel_size=int(kv["etp"]) if "etp" in kv else None,
        gtp_remat_size=int(kv.get("gtp", 1)),
        expert_gtp_remat_size=int(kv.get("egtp", 1)),
        num_distributed_optimizer_instances=int(kv.get("dist_opt", 1)),
        create_gloo_process_groups=kv.get("gloo", "1") == "1",
        order=kv.get("order", "tp-cp-ep-dp-pp"),
    )
    for desc, ranks in calls:
        print(desc + "".join(" %d" % r for r in ranks))


if __name__ == "__main__":
    main()
