"""GPU measurements of libprism (run under LD_PRELOAD=libprism.so by tests/gpu/shim_suite.sh).

usage:
  shim_gpu_bench.py gate     # PRISM_FIXED_DUR_US=D: how long a collective holds its stream (50 trials)
  shim_gpu_bench.py memory   # GPU memory of a rank after init_process_group + collectives at WORLD_SIZE
  shim_gpu_bench.py alloc    # libprism's tracked peak against torch's max reserved over a fixed allocation pattern
                             # (run with and without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the VMM path)
Prints one machine-readable line: "GATE gate=<wait|spin> dur_us=D median_us=.. p10_us=.. p90_us=.. max_us=..
host_overhead_median_ns=.. host_overhead_p90_ns=.." or "MEMORY world=W used_mib=.. torch_reserved_mib=.." or "ALLOC conf=.. prism_peak_mib=.. torch_max_reserved_mib=..
prism_current_mib=.. torch_reserved_mib=..".

The gate mode calls libprism's ncclAllReduce through ctypes on a torch stream, bracketed by CUDA events on the
same stream, with the stream idle before each trial (so the arrival is the first event).
"""
import ctypes
import datetime
import os
import statistics
import sys
import time

import torch


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def lib():
    l = ctypes.CDLL(None)
    l.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    l.ncclCommInitRank.argtypes = [ctypes.c_void_p, ctypes.c_int, UniqueId, ctypes.c_int]
    l.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_void_p]
    l.prism_host_overhead_ns.argtypes = [ctypes.c_double]
    l.prism_host_overhead_ns.restype = ctypes.c_ulonglong
    l.prism_drain.argtypes = [ctypes.c_double]
    l.prism_calibration_ns.argtypes = [ctypes.c_int]
    l.prism_calibration_ns.restype = ctypes.c_longlong
    l.prism_reset_stats.argtypes = []
    return l


def gate():
    l = lib()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    world = int(os.environ.get("WORLD_SIZE", "8"))
    rank = int(os.environ.get("RANK", "0"))
    uid = UniqueId()
    assert l.ncclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    rc = l.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
    assert rc == 0, "ncclCommInitRank returned %d" % rc
    s = torch.cuda.Stream()
    x = torch.ones(1 << 16, device="cuda")
    ev0 = [torch.cuda.Event(enable_timing=True) for _ in range(60)]
    ev1 = [torch.cuda.Event(enable_timing=True) for _ in range(60)]
    samples = []
    host = []  # host wall time around the same trial (launch + gate + sync): tells which clock drifts
    for i in range(60):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        with torch.cuda.stream(s):
            ev0[i].record(s)
            rc = l.ncclAllReduce(x.data_ptr(), x.data_ptr(), x.numel(), 7, 0, comm, s.cuda_stream)  # float, sum
            ev1[i].record(s)
        assert rc == 0, "ncclAllReduce returned %d" % rc
        s.synchronize()
        t1 = time.perf_counter_ns()
        if i >= 10:
            host.append((t1 - t0) / 1000.0)
        if i == 9:
            l.prism_reset_stats()
        if i >= 10:  # 50 measured trials after 10 warm-up
            samples.append(ev0[i].elapsed_time(ev1[i]) * 1000.0)
    # Host overhead: back-to-back collectives, nothing waited for in between.
    for _ in range(200):
        l.ncclAllReduce(x.data_ptr(), x.data_ptr(), 1024, 7, 0, comm, s.cuda_stream)
    l.prism_drain(60.0)
    torch.cuda.synchronize()
    q = statistics.quantiles(samples, n=10)
    print("GATE gate=%s dur_us=%s median_us=%.1f p10_us=%.1f p90_us=%.1f max_us=%.1f host_overhead_median_ns=%d "
          "host_overhead_p90_ns=%d clock_offset_ns=%d wait_release_ns=%d spin_release_ns=%d host_wall_median_us=%.1f" % (
              os.environ.get("PRISM_GATE", "wait"), os.environ.get("PRISM_FIXED_DUR_US"),
              statistics.median(samples), q[0], q[-1], max(samples), l.prism_host_overhead_ns(0.5),
              l.prism_host_overhead_ns(0.9), l.prism_calibration_ns(0), l.prism_calibration_ns(1),
              l.prism_calibration_ns(2), statistics.median(host)), flush=True)


def memory():
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    server = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    server.set("default_pg/0//cuda//0", b"P" * 128)
    for g in range(1, 8):
        server.set("default_pg/0//%d//cuda//0" % g, b"P" * 128)
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(20):
        dist.all_reduce(t)
    sub = dist.new_group([rank, (rank + 1) % world])
    x = torch.ones(1024, device="cuda")
    dist.all_reduce(x, group=sub)
    dist.barrier()
    torch.cuda.synchronize()
    ctypes.CDLL(None).prism_drain(ctypes.c_double(60.0))
    free, total = torch.cuda.mem_get_info()
    print("MEMORY world=%d used_mib=%.1f torch_reserved_mib=%.1f" % (
        world, (total - free) / 2**20, torch.cuda.memory_reserved() / 2**20), flush=True)
    dist.destroy_process_group()


def alloc():
    prism = ctypes.CDLL(None)
    prism.prism_device_bytes_peak.restype = ctypes.c_ulonglong
    prism.prism_device_bytes_current.restype = ctypes.c_ulonglong
    torch.cuda.set_device(0)
    keep = [torch.empty(100 << 20, dtype=torch.uint8, device="cuda") for _ in range(10)]  # 1000 MiB
    del keep[::2]                                                                          # free 500 MiB
    keep += [torch.empty(300 << 20, dtype=torch.uint8, device="cuda") for _ in range(2)]   # +600 MiB
    big = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")                           # +2 GiB
    del big
    torch.cuda.empty_cache()  # returns unused segments (unmaps expandable ones): current must follow
    torch.cuda.synchronize()
    print("ALLOC conf=%s prism_peak_mib=%.1f torch_max_reserved_mib=%.1f prism_current_mib=%.1f torch_reserved_mib=%.1f" % (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default") or "default", prism.prism_device_bytes_peak() / 2**20,
        torch.cuda.max_memory_reserved() / 2**20, prism.prism_device_bytes_current() / 2**20,
        torch.cuda.memory_reserved() / 2**20), flush=True)


if __name__ == "__main__":
    {"gate": gate, "memory": memory, "alloc": alloc}[sys.argv[1]]()
