"""Probe (issue 46): variants of the graphed 1B Triton step (tilings, attention,
streamed GEMVs), all timed in the same interleaved rounds, 20 replays a call from the
prompt's end; each variant's 64 greedy tokens against its weights' default step, and
traces of the default and the fastest. Usage on the GPU:
OUT=dir PYTHONPATH=code python scripts/probes/step_variants.py [ROUNDS]"""

import sys
import time

import torch

from gpuinfer.decode.static import capacity_for
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.experiments import triton_bench as tb
from gpuinfer.kernels.gemv import GemvConfig as C
from gpuinfer.measure.profiling import profile_steps
from gpuinfer.measure.rounds import interleaved_rounds
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


def v(weights="bf16", **configs):
    return dict(configs=configs) if weights == "bf16" else dict(configs=configs,
                                                                 weights=INT8)


# Earlier runs (NOTES-46.md) swept tilings, PDL "ahead", an L2 warm-up and streamed
# GEMVs; the streamed kernels are in commit a416265 (kernels/stream.py, GemvConfig.per_sm).
SPLIT = {"n_split": 16, "block_s": 64, "num_warps": 2}  # the split of a longer cache
variants = {
    "bf16": v(),
    "bf16 attention split": dict(v(), attention=SPLIT),
    "bf16 gate_up 4x1024": v(gate_up=C(4, 1024, 1, 4)),
    # On the H200 the chain's tiling (`tiling.alone_configs`) ran the 64 products 5.9 %
    # faster than the step's (prefetch_chain, 2026-12-06): does any of it carry into
    # the step, where 4 warps won on the H100 (NOTES-triton)?
    "bf16 chain tiling": v(qkv=C(4, 2048, 1, 8), o=C(8, 2048, 1, 8),
                           gate_up=C(2, 2048, 1, 4), down=C(8, 2048, 1, 8)),
    "bf16 o, down 8 warps": v(o=C(8, 2048, 1, 8), down=C(8, 2048, 1, 8)),
    "bf16 qkv 4x2048 w8": v(qkv=C(4, 2048, 1, 8)),
    "int8": v("int8"),
    "int8 attention split": dict(v("int8"), attention=SPLIT),
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
    agree = (tokens[name] == tokens[name.split()[0]]).float().mean().item()
    print(f"  {name}: {100 * agree:.1f} % tokens as its type's default")

rounds = interleaved_rounds({n: tb.replays_from(d, PROMPT, REPLAYS)
                             for n, d in decoders.items()},
                            rounds=ROUNDS, warmup=2, per_call=REPLAYS)
for name in variants:
    t = rounds[name]
    print(f"{name:36s} {1e3 * t.median:7.1f} us  ({1e3 * t.min:.1f}-{1e3 * t.max:.1f})")
best = min((n for n in variants if n.startswith("bf16")), key=lambda n: rounds[n].median)
best8 = min((n for n in variants if n.startswith("int8")), key=lambda n: rounds[n].median)
print("best:", best, "|", best8)
print(rounds.compare(best, "bf16").sentence(best, "bf16"))
print(rounds.compare(best8, best).sentence(best8, best))

import gzip, json, os
for name in ("bf16", best, best8):
    d = decoders[name]
    d.prefill(prompt)
    trace = profile_steps(d.step_function(), steps=10, head_start=True)
    stats, timeline = step_stats(trace), step_timeline(trace)
    if os.environ.get("OUT"):
        safe = "".join(c if c.isalnum() else "_" for c in name)
        with gzip.open(f"{os.environ['OUT']}/{safe}"
                       ".json.gz", "wt") as f:
            json.dump(trace, f)
    by_kind = time_by_kind(kernel_table(trace))
    print(f"{name}: busy {100 * stats.gpu_span_busy_fraction:.1f} %, span "
          f"{timeline.span_us:.0f} us, overlap {timeline.overlap_us:.0f} us, shares: "
          + ", ".join(f"{k} {100 * timeline.share(k):.0f} %" for k in
                      ("matrix multiply", "attention"))
          + "; kernel sums: " + ", ".join(f"{k} {v:.0f}" for k, v in by_kind.items()))
print(f"done in {time.perf_counter() - t0:.0f} s")
