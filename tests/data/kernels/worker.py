"""A CPU stand-in for a training job under `prism-run --kernels` (tests/unit/kernel_cli_test.cc).

libprism.so is really preloaded: the job asks cudaGetDeviceCount (as torch does first; libprism starts its CUPTI
collector there), then marks iterations with prism_iteration_mark (as libprism's Python hook does after each
optimizer step). The "GPU work" is records added to the fake libcupti of the tests (PRISM_CUPTI_LIBRARY), which
the collector flushes at exit. With PRISM_CUPTI_LIBRARY naming no library, the job must simply run on.
"""
import ctypes
import os
import time

lib = ctypes.CDLL(None)
count = ctypes.c_int(0)
rc = lib.cudaGetDeviceCount(ctypes.byref(count))  # no CUDA here: an error code, and kernel recording starts

fake = None
path = os.environ.get("PRISM_CUPTI_LIBRARY", "")
if path and os.path.exists(path):
    fake = ctypes.CDLL(path)  # the copy libprism loaded (same path, same object)
    fake.fake_cupti_now.restype = ctypes.c_uint64
    fake.fake_cupti_add_kernel.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32,
                                           ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32]
    fake.fake_cupti_add_memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                                           ctypes.c_int]

lib.prism_iteration_mark.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
lib.prism_iteration_mark.restype = ctypes.c_int
iters = int(os.environ.get("KERNELS_WORKER_ITERS", "4"))
lib.prism_iteration_mark(None, 0)
for i in range(iters):
    if fake is not None:
        t = fake.fake_cupti_now()
        fake.fake_cupti_add_kernel(b"_Z10gemm_tilediPf", t + 1000, t + 400000, 7, 0, 0, 10 * i + 1)
        fake.fake_cupti_add_kernel(b"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_",
                                   t + 500000, t + 520000, 7, 0, 0, 10 * i + 2)
        fake.fake_cupti_add_kernel(b"graph_gemm", t + 600000, t + 700000, 8, 3, 11, 10 * i + 3)
        fake.fake_cupti_add_memcpy(t + 800000, t + 850000, 7, 1 << 20, 1)
    time.sleep(0.03)
    lib.prism_iteration_mark(None, 0)
print("kernels worker done: cudaGetDeviceCount returned %d" % rc, flush=True)
