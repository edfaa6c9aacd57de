"""The Python hook announces each process group's members through the group's store (fake torch, no GPU).

Run by python_hook_test.cc: python3 tests/unit/python_hook_test.py <path to sitecustomize.py>; exit 0 = pass.
"""
import importlib.util
import json
import os
import sys
import types

os.environ["PRISM_PYTHON_HOOK"] = "0"  # load the module without installing the import hook


class FakeStore:
    def __init__(self, fail=False):
        self.sets, self.fail = [], fail

    def set(self, key, value):
        if self.fail:
            raise RuntimeError("store down")
        self.sets.append((key, value))


class FakeLib:
    def __init__(self):
        self.registered = []

    def prism_register_group(self, name, arr, n, desc):
        self.registered.append((name.decode(), [arr[i] for i in range(n)], desc.decode()))
        return 0


NON_MEMBER = object()
member_pg, failing_pg = object(), object()
stores = {member_pg: FakeStore(), failing_pg: FakeStore(fail=True)}
c10d = types.ModuleType("torch.distributed.distributed_c10d")
c10d._world = types.SimpleNamespace(pg_map={pg: ("nccl", s) for pg, s in stores.items()})
c10d._get_process_group_name = lambda pg: "5" if pg is member_pg else "6"
dist = types.ModuleType("torch.distributed")
dist.GroupMember = types.SimpleNamespace(NON_GROUP_MEMBER=NON_MEMBER)
dist.get_process_group_ranks = lambda pg: [3, 7]
dist.distributed_c10d = c10d
torch = types.ModuleType("torch")
torch.distributed = dist
sys.modules.update({"torch": torch, "torch.distributed": dist, "torch.distributed.distributed_c10d": c10d})

spec = importlib.util.spec_from_file_location("prism_hook_under_test", sys.argv[1])
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)
lib = FakeLib()
hook._PRISM = lib

hook._register(member_pg, "TENSOR_MODEL_PARALLEL_GROUP")
assert lib.registered == [("5", [3, 7], "TENSOR_MODEL_PARALLEL_GROUP")], lib.registered
sets = stores[member_pg].sets
assert len(sets) == 1 and sets[0][0] == "__prism_group__", sets
assert json.loads(sets[0][1]) == {"v": 1, "name": "5", "ranks": [3, 7], "desc": "TENSOR_MODEL_PARALLEL_GROUP"}

hook._register(NON_MEMBER, "X")  # non-members have no store entry and announce nothing
assert len(stores[member_pg].sets) == 1 and len(lib.registered) == 1

hook._register(failing_pg, "Y")  # a failing store must never break the job
assert len(lib.registered) == 2
print("python hook: ok")
