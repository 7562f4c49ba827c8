"""Probe (issue 46): the graphed 1B Triton step with kernels that let the next one launch
in turn (after their own PDL wait, today) or ahead (at their start), and tilings under
the second. All variants timed in the same interleaved rounds, 20 replays a call from
the prompt's end; tokens of the same tiling compared. Usage on the GPU:
PYTHONPATH=code python scripts/probes/pdl_ahead.py [ROUNDS]"""

import sys
import time

import torch

from gpuinfer.decode.static import capacity_for
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.experiments import triton_bench as tb
IN_TURN = True
from gpuinfer.kernels.gemv import GemvConfig as C

from gpuinfer.measure.profiling import profile_steps
from gpuinfer.measure.timing import interleaved_rounds
from gpuinfer.model.configs import build_model, model_config, random_prompt
from gpuinfer.model.llama import INT8
from gpuinfer.report.trace import step_stats
from gpuinfer.report.trace_tables import kernel_table, step_timeline, time_by_kind

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
PROMPT, NEW, REPLAYS = 128, 128, 20
t0 = time.perf_counter()
config = model_config("1b")
model = build_model(config, seed=0, device="cuda").to(torch.bfloat16)
prompt = random_prompt(config, PROMPT, seed=1, device="cuda")
cap = capacity_for(PROMPT, NEW)
ONE = {"n_split": 1, "block_s": 256, "num_warps": 8}  # a program per head, no combine
def one(weights="bf16", **configs):
    kw = dict(attention=ONE, configs=configs)
    return kw if weights == "bf16" else dict(kw, weights=INT8)


variants = {
    "bf16 att one": one(),
    "bf16 att one, qkv 2x2048": one(qkv=C(2, 2048, 1, 4)),
    "bf16 att one, qkv 4x1024 8w": one(qkv=C(4, 1024, 1, 8)),
    "bf16 att one, qkv 2x1024": one(qkv=C(2, 1024, 1, 4)),
    "bf16 att one, o 4x2048": one(o=C(4, 2048, 1, 4)),
    "bf16 att one, o 8x1024": one(o=C(8, 1024, 1, 4)),
    "bf16 att one, gate_up 2x512": one(gate_up=C(2, 512, 1, 4)),
    "bf16 att one, gate_up 4x256": one(gate_up=C(4, 256, 1, 4)),
    "bf16 att one, gate_up 8x512 8w": one(gate_up=C(8, 512, 1, 8)),
    "bf16 att one, down 8x1024": one(down=C(8, 1024, 1, 4)),
    "bf16 att one, down 4x2048": one(down=C(4, 2048, 1, 4)),
    "bf16 att one, down 16x1024 8w": one(down=C(16, 1024, 1, 8)),
    "bf16 att one, lm_head 8x1024": one(lm_head=C(8, 1024, 1, 4)),
    "bf16 att one, lm_head 16x2048 8w": one(lm_head=C(16, 2048, 1, 8)),
    "int8 att one": one("int8"),
    "int8 att one, qkv 4x1024": one("int8", qkv=C(4, 1024, 1, 4)),
    "int8 att one, qkv 8x2048": one("int8", qkv=C(8, 2048, 1, 4)),
    "int8 att one, o 8x2048 4w": one("int8", o=C(8, 2048, 1, 4)),
    "int8 att one, o 16x2048 8w": one("int8", o=C(16, 2048, 1, 8)),
    "int8 att one, gate_up 16x512": one("int8", gate_up=C(16, 512, 1, 4)),
    "int8 att one, gate_up 8x256": one("int8", gate_up=C(8, 256, 1, 4)),
    "int8 att one, down 16x2048 8w": one("int8", down=C(16, 2048, 1, 8)),
    "int8 att one, down 8x2048 4w": one("int8", down=C(8, 2048, 1, 4)),
    "int8 att one, lm_head 32x1024 8w": one("int8", lm_head=C(32, 1024, 1, 8)),
}
decoders, tokens = {}, {}
for name, kw in variants.items():
    d = TritonDecoder(model, capacity=cap, **kw)
    tokens[name] = d.generate(prompt, 64)
    d.prefill(prompt)
    d.step_function()
    decoders[name] = d
    print(f"{name}: built, compiled, 64 tokens ({time.perf_counter() - t0:.0f} s)",
          flush=True)
for name in variants:
    agree = (tokens[name] == tokens[name.split()[0] + " att one"]).float().mean().item()
    print(f"  {name}: {100 * agree:.1f} % tokens as its type's att one")

rounds = interleaved_rounds({n: tb.replays_from(d, PROMPT, REPLAYS)
                             for n, d in decoders.items()},
                            rounds=ROUNDS, warmup=2, per_call=REPLAYS)
for name in variants:
    t = rounds[name]
    print(f"{name:36s} {1e3 * t.median:7.1f} us  ({1e3 * t.min:.1f}-{1e3 * t.max:.1f})")
best = min((n for n in variants if n.startswith("bf16")), key=lambda n: rounds[n].median)
best8 = min((n for n in variants if n.startswith("int8")), key=lambda n: rounds[n].median)
print("best:", best, "|", best8)
print(rounds.compare(best, "bf16 in turn").sentence(best, "bf16 in turn"))
print(rounds.compare(best8, best).sentence(best8, best))

import gzip, json, os
for name in ("bf16 in turn", best, best8):
    d = decoders[name]
    d.prefill(prompt)
    trace = profile_steps(d.step_function(), steps=10, head_start=True)
    stats, timeline = step_stats(trace), step_timeline(trace)
    if os.environ.get("OUT"):
        with gzip.open(f"{os.environ['OUT']}/{name.replace(' ', '_').replace(',', '')}"
                       ".json.gz", "wt") as f:
            json.dump(trace, f)
    by_kind = time_by_kind(kernel_table(trace))
    print(f"{name}: busy {100 * stats.gpu_span_busy_fraction:.1f} %, span "
          f"{timeline.span_us:.0f} us, overlap {timeline.overlap_us:.0f} us, shares: "
          + ", ".join(f"{k} {100 * timeline.share(k):.0f} %" for k in
                      ("matrix multiply", "attention"))
          + "; kernel sums: " + ", ".join(f"{k} {v:.0f}" for k, v in by_kind.items()))
print(f"done in {time.perf_counter() - t0:.0f} s")
