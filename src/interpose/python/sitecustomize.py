"""Prism's Python hook for real ranks (loaded as `sitecustomize` when lib/python is on PYTHONPATH).

It does three small things once `torch` is imported, and nothing at all when torch or libprism is absent:

1. Iteration marks: a global optimizer step post-hook calls libprism's prism_iteration_mark(stream,
   torch.cuda.max_memory_allocated()) after every step of the first optimizer that steps, so the shim stamps the
   GPU clock on the current stream (iteration time is GPU time).
2. Group members: torch.distributed.new_group / init_process_group are wrapped so libprism learns each process
   group's global ranks (prism_group_begin before new_group, prism_register_group(name, ranks, desc) after).
   NCCL communicators are created lazily by ProcessGroupNCCL; the shim matches them to these groups.
3. Device count: torch.cuda.device_count() asks NVML first, which sees the one physical GPU; when the shim
   virtualises devices (PRISM_GPUS_PER_NODE) the NVML path is turned off so torch asks cudaGetDeviceCount, which
   libprism answers.

Why an import hook: sitecustomize runs before the job imports torch; the patches are applied right after torch's
own import finishes. Any failure here is reported once on stderr and leaves the job untouched.
See docs/libprism.md.
"""
import ctypes
import json
import os
import sys

_PRISM = None
_STATE = {"optimizer": None, "patched": False}


def _warn(what):
    sys.stderr.write("[prism hook] %s\n" % what)


def _lib():
    """libprism.so if the process preloaded it (never loads a second copy)."""
    global _PRISM
    if _PRISM is not None:
        return _PRISM or None
    _PRISM = False
    try:
        lib = ctypes.CDLL(None)
        fn = lib.prism_iteration_mark  # raises AttributeError when libprism is not preloaded
        fn.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
        fn.restype = ctypes.c_int
        lib.prism_register_group.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                             ctypes.c_char_p]
        lib.prism_register_group.restype = ctypes.c_int
        lib.prism_group_begin.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.prism_group_begin.restype = ctypes.c_int
        lib.prism_group_end.argtypes = []
        lib.prism_group_end.restype = None
        _PRISM = lib
    except (OSError, AttributeError):
        return None
    return _PRISM


def _int_array(ranks):
    ranks = [int(r) for r in ranks]
    return (ctypes.c_int * max(1, len(ranks)))(*ranks), len(ranks)


def _after_step(optimizer, args, kwargs):
    # The first optimizer that steps is the iteration clock (Megatron may chain several per iteration).
    if _STATE["optimizer"] is None:
        _STATE["optimizer"] = optimizer
    if optimizer is not _STATE["optimizer"]:
        return
    import torch
    lib = _lib()
    if lib is None:
        return
    try:
        stream = torch.cuda.current_stream().cuda_stream
        lib.prism_iteration_mark(ctypes.c_void_p(stream), int(torch.cuda.max_memory_allocated()))
    except Exception as e:  # never break the job
        _warn("iteration mark failed: %r" % (e,))


def _register(pg, desc):
    import torch.distributed as dist
    lib = _lib()
    if lib is None or pg is None:
        return
    try:
        if pg == dist.GroupMember.NON_GROUP_MEMBER:
            return
        ranks = dist.get_process_group_ranks(pg)
        name = dist.distributed_c10d._get_process_group_name(pg)
        arr, n = _int_array(ranks)
        lib.prism_register_group(str(name).encode(), arr, n, str(desc or "").encode())
    except Exception as e:
        _warn("could not register a process group: %r" % (e,))
        return
    _announce_to_store(dist, pg, name, ranks, desc)


def _announce_to_store(dist, pg, name, ranks, desc):
    # Why: the coordinator's store stands in for a group's virtual leader only once it knows the group's members;
    # this SET travels on the same store connection as the rank's later wait for the group's NCCL id, so it
    # arrives first (docs/coordinator.md, "Stand-in rules"). The coordinator consumes the key.
    try:
        store = dist.distributed_c10d._world.pg_map[pg][1]
        store.set("__prism_group__", json.dumps({"v": 1, "name": str(name), "ranks": [int(r) for r in ranks],
                                                 "desc": str(desc or "")}))
    except Exception as e:
        _warn("could not announce a process group to the store: %r" % (e,))


def _wrap_distributed():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    if getattr(c10d.new_group, "_prism_wrapped", False):
        return
    orig_new_group = c10d.new_group
    orig_init = c10d.init_process_group

    def new_group(ranks=None, *args, **kwargs):
        lib = _lib()
        if lib is not None and ranks is not None:
            arr, n = _int_array(ranks)
            lib.prism_group_begin(arr, n)
        try:
            pg = orig_new_group(ranks, *args, **kwargs)
        finally:
            if lib is not None:
                lib.prism_group_end()
        _register(pg, kwargs.get("group_desc"))
        return pg

    def init_process_group(*args, **kwargs):
        out = orig_init(*args, **kwargs)
        try:
            _register(c10d._get_default_group(), "default_pg")
        except Exception as e:
            _warn("could not register the default group: %r" % (e,))
        return out

    new_group._prism_wrapped = True
    init_process_group._prism_wrapped = True
    c10d.new_group = new_group
    c10d.init_process_group = init_process_group
    dist.new_group = new_group
    dist.init_process_group = init_process_group


def _patch_torch():
    if _STATE["patched"]:
        return
    _STATE["patched"] = True
    if _lib() is None:
        return
    import torch
    try:
        if int(os.environ.get("PRISM_GPUS_PER_NODE", "0") or 0) > 0 and hasattr(torch.cuda, "_device_count_nvml"):
            torch.cuda._device_count_nvml = lambda: -1  # use cudaGetDeviceCount (libprism's virtual count)
    except Exception as e:
        _warn("could not patch torch.cuda.device_count: %r" % (e,))
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(_after_step)
    except Exception as e:
        _warn("no iteration marks: %r" % (e,))
    try:
        _wrap_distributed()
    except Exception as e:
        _warn("process groups are not registered: %r" % (e,))


class _TorchImportHook:
    """Runs _patch_torch once `import torch` has completed (sys.meta_path finder; never imports anything)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or _STATE["patched"]:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                _patch_torch()
            except Exception as e:
                _warn("hook failed: %r" % (e,))

        loader.exec_module = exec_and_patch
        return spec


def _install():
    if os.environ.get("PRISM_PYTHON_HOOK", "1") == "0":
        return
    if "torch" in sys.modules:
        _patch_torch()
    else:
        sys.meta_path.insert(0, _TorchImportHook())


def _chain_next_sitecustomize():
    """Python imports only the first sitecustomize on sys.path: run the next one (the job's own), if any."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_prism_next_sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install()
except Exception as _e:  # a hook must never stop the interpreter
    _warn("not installed: %r" % (_e,))
try:
    _chain_next_sitecustomize()
except Exception as _e:
    _warn("the next sitecustomize failed: %r" % (_e,))
