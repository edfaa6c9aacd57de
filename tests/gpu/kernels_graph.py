"""A job with a CUDA graph, for `prism-run --kernels` (tests/gpu/kernels_suite.sh, case kernels_cuda_graph).

Each iteration: an eager matmul, one replay of a captured graph (matmul, relu, sum), and an optimizer step (which
libprism's Python hook marks as the end of the iteration). The kernels of the replays must carry their graph id in
rank0.kernels.jsonl, show as "graph G" launches in trace.json, and as [g] rows in `prism-run report kernels`.
Runs under prism-run as a world of 1 (torchrun --nproc-per-node 1); no process group is needed.
GRAPH_NVTX=1 wraps each iteration in an NVTX range "iteration" and the replay in "replay" (case kernels_nvtx, run
with --kernels-nvtx: the ranges must reach rank0.kernels.jsonl and trace.json).
"""
import os
import sys

import torch

iters = int(os.environ.get("GRAPH_ITERS", "20"))
nvtx = os.environ.get("GRAPH_NVTX") == "1"
n = 1024
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(dev)
x = torch.randn(n, n, device=dev)
w = torch.nn.Parameter(torch.randn(n, n, device=dev))
opt = torch.optim.SGD([w], lr=1e-6)

# Warm up on a side stream (as torch's CUDA graph docs ask), then capture.
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        (x @ w).relu().sum()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = (x @ w).relu().sum()

for it in range(iters):
    if nvtx:
        torch.cuda.nvtx.range_push("iteration")
    z = x @ x  # eager
    if nvtx:
        torch.cuda.nvtx.range_push("replay")
    g.replay()
    if nvtx:
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
    w.grad = z[:1].expand(n, n).contiguous() * 0  # something to step on
    opt.step()
torch.cuda.synchronize()
print("GRAPH_CHECK done: %d iterations, y=%.3f" % (iters, float(y)), flush=True)
sys.exit(0)
