#!/usr/bin/env python3
"""Runs a training script with torch's allocation history on, so that its memory snapshots hold the trace.

  torchrun ... tests/gpu/mem_history.py pretrain_gpt.py ARGS... --record-memory-history --memory-snapshot-path P

Megatron dumps the snapshot (P with _<rank> before the extension) after its first iteration and at each log
interval when --record-memory-history is given, but only its config-container path starts the recording; this
wrapper starts it (python frames only, MEM_HISTORY_ENTRIES events kept, default 300000) and runs the script as
__main__ with the script's own folder first on sys.path, as `python script.py` would. Read the snapshots with
tests/gpu/mem_snapshot.py.
"""
import os
import runpy
import sys

import torch

torch.cuda.memory._record_memory_history(max_entries=int(os.environ.get("MEM_HISTORY_ENTRIES", "300000")),
                                         stacks="python")
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
