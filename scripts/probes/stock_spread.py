"""Probe: how far apart fresh processes of the same stock generate() call land, each with
empty compile caches of its own (gpuinfer.measure.stock). Prints each process's median
decode ms per token, its spread over its rounds, its first call, and the spread across the
processes. Usage on the GPU: python scripts/probes/stock_spread.py [PROCESSES] [CONFIG]"""

import sys
import time

import torch

from gpuinfer.measure.stock import stock_fresh

processes = int(sys.argv[1]) if len(sys.argv) > 1 else 4
config = sys.argv[2] if len(sys.argv) > 2 else "small"
args = (dict(dtype=torch.float32, prompt_len=4096, new_tokens=256, rounds=3, warmup=3,
             attn_implementation="eager") if config == "small" else
        dict(dtype=torch.bfloat16, prompt_len=128, new_tokens=128, rounds=3, warmup=3))
medians = []
for i in range(processes):
    t0 = time.perf_counter()
    run = stock_fresh(config, variants=("static",), **args)["static"]
    assert run.ok, run.error
    medians.append(run.median)
    print(f"process {i + 1}: {run.median:.3f} ms/token ({run.low:.3f}-{run.high:.3f} over "
          f"{len(run.decode_ms)} rounds), first call {run.first_call_s:.1f} s, "
          f"graphs in rounds {run.graphs_in_rounds}, {time.perf_counter() - t0:.0f} s",
          flush=True)
lo, hi = min(medians), max(medians)
print(f"{config}: across {processes} processes {lo:.3f}-{hi:.3f} ms/token, "
      f"{100 * (hi / lo - 1):.1f} % apart")
