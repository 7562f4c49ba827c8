"""Probe (issue 56): why Chapter 2's context sweep and its late stock process run slower
than its rounds and its first stock process, on the same workload, in one recording.

A: the lean loop at a 4096-token prompt (the small model, FP32), typical step over
interleaved rounds: 16 tokens alone; 16 tokens interleaved with the naive loop (a
GPU-bound generation, as in the sweep); 256 tokens alone (as the rounds); 16 alone again.
B: stock generate(static) in a fresh process, once while this process holds nothing on
the GPU, and once after A, holding the model and its caches.
Usage on the GPU: python scripts/probes/host_pace.py [a|b|ab]"""

import functools
import sys
import time

import torch

from gpuinfer.decode import loops as dec
from gpuinfer.measure.rounds import split_rounds
from gpuinfer.measure.stock import stock_fresh
from gpuinfer.model.configs import build_model, model_config, random_prompt


def stock(tag):
    t0 = time.perf_counter()
    run = stock_fresh("small", variants=("static",), dtype=torch.float32, prompt_len=4096,
                      new_tokens=256, rounds=3, warmup=3, attn_implementation="eager")
    run = run["static"]
    print(f"stock, {tag}: {run.median:.3f} ms/token ({run.low:.3f}-{run.high:.3f}), "
          f"{time.perf_counter() - t0:.0f} s", flush=True)


def show(tag, fns, tokens, rounds):
    typical = split_rounds(fns, tokens, rounds=rounds, warmup=1).typical
    print(tag, {k: f"{typical[k].median:.2f} ({typical[k].min:.2f}-{typical[k].max:.2f})"
                for k in fns}, flush=True)


part = sys.argv[1] if len(sys.argv) > 1 else "ab"
if "b" in part:
    stock("this process holding nothing")
torch.set_float32_matmul_precision("highest")
model = build_model(model_config("small"), seed=0, device="cuda", attn_implementation="eager")
prompt = random_prompt(model.config, 4096, device="cuda")
lean16 = functools.partial(dec.LOOPS["lean"], model, prompt, 16)
naive16 = functools.partial(dec.LOOPS["naive"], model, prompt, 16)
lean256 = functools.partial(dec.LOOPS["lean"], model, prompt, 256)
show("lean, 16 tokens, alone:", {"lean": lean16}, 16, 5)
show("lean, 16 tokens, with the naive loop:", {"lean": lean16, "naive": naive16}, 16, 5)
show("lean, 256 tokens, alone:", {"lean": lean256}, 256, 3)
show("lean, 16 tokens, alone again:", {"lean": lean16}, 16, 5)
if "b" in part:
    stock("after A, holding the model")
