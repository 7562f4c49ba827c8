"""Probe (not book code): which FP32 workload makes Chapter 2's KV cache pay, measured in
interleaved rounds; plus two anomalies of the book's figures (eager GEMV at M >= 16, the
compiled K=1 chain). Writes JSON lines to $OUT/probe_workload.jsonl.

    PYTHONPATH=code python3 scripts/probes/probe_workload.py
"""

import json
import os
import statistics
import time

import torch

from gpuinfer.decode import loops as dec, static as sd
from gpuinfer.experiments.scale import generate_new_tokens
from gpuinfer.model.configs import build_model, random_prompt, tiny_llama_config

OUT = os.environ.get("OUT", "/tmp")
LOG = open(os.path.join(OUT, "probe_workload.jsonl"), "a")
T0 = time.time()


def emit(**rec):
    rec["t"] = round(time.time() - T0, 1)
    print(json.dumps(rec), flush=True)
    LOG.write(json.dumps(rec) + "\n")
    LOG.flush()


def ms_of(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3, out


torch.set_float32_matmul_precision("highest")
NEW = 256
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PROMPTS = [int(p) for p in os.environ.get("PROMPTS", "2048,4096").split(",")]
cfg = tiny_llama_config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=16,
                        max_position_embeddings=8192)
model = build_model(cfg, seed=0, device="cuda")


def gen(**kw):
    return lambda m, p, n: generate_new_tokens(m, p, n, **kw)


variants = {
    "V0": dec.decode_naive, "V1": dec.decode_kv_cache, "V2": dec.decode_no_sync,
    "V2s": dec.decode_static_cache, "V2L": dec.decode_lean,
    "V4": sd.decode_static, "V5": sd.decode_cuda_graph, "V9": sd.decode_compiled_graph_pdl,
    "gen_dynamic": gen(), "gen_static": gen(cache_implementation="static"),
}

for P in PROMPTS:
    prompt = random_prompt(cfg, P, device="cuda")
    ref = None
    first = {}
    for name, fn in variants.items():
        ms, toks = ms_of(lambda: fn(model, prompt, NEW))
        first[name] = ms
        if ref is None:
            ref = toks
        emit(kind="first", prompt=P, variant=name, ms=ms, equal=bool(torch.equal(toks, ref)))
    times = {n: [] for n in variants}
    names = list(variants)
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            ms, _ = ms_of(lambda: variants[name](model, prompt, NEW))
            times[name].append(ms / NEW)
        emit(kind="round", prompt=P, round=r, ms_per_token={n: times[n][-1] for n in names})
    emit(kind="summary", prompt=P,
         median={n: statistics.median(v) for n, v in times.items()},
         lo={n: min(v) for n, v in times.items()}, hi={n: max(v) for n, v in times.items()})
    # the step alone: eager static step vs its hand-captured graph (Chapter 3's 6x)
    cap = sd.capacity_for(P, NEW)
    d = sd.static_decoder(model, 1, cap)
    for how in ("eager", "graph"):
        t = sd.step_timing(d, prompt, how, warmup=5, repeats=50)
        emit(kind="step", prompt=P, how=how, median_us=t.median * 1e3, q1=t.q1 * 1e3,
             q3=t.q3 * 1e3)
    # V0's step against the sequence (does it grow?)
    with dec.step_clock() as clock:
        dec.decode_naive(model, prompt, 64)
    st = clock.times_ms()
    emit(kind="v0_steps", prompt=P, first=st[:3], last=st[-3:])
    torch.cuda.empty_cache()

# ---- the eager GEMV at M >= 16 (Chapter 1): host cost and kernels per call ----
from torch.profiler import ProfilerActivity, profile

K = N = 8192
w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
for M in (1, 8, 16, 32, 64):
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, w)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # hold the GPU: the host loop below is pure host cost
    t = time.perf_counter()
    for _ in range(50):
        torch.matmul(a, w)
    host_us = (time.perf_counter() - t) / 50 * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.matmul(a, w)
        torch.cuda.synchronize()
    kern = sorted({e.name[:90] for e in prof.events() if e.device_type.name == "CUDA"})
    api = {}
    for e in prof.events():
        if e.name.startswith(("cuda", "cu")) and e.device_type.name == "CPU":
            api.setdefault(e.name, []).append(e.cpu_time_total)
    emit(kind="gemv_eager", M=M, host_us=host_us, kernels=kern,
         api={k: (len(v) / 5, statistics.median(v)) for k, v in api.items()})

# ---- the compiled K=1 chain (Chapter 3): per-call host cost ----
from gpuinfer.measure import launch

x = torch.randn(2**12, device="cuda")


def per_call_us(f, n=200):
    for _ in range(10):
        f(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


for dynamic in (True, False):
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64):
        fns = {}
        for k in (1, 4, 16, 64, 256):
            fns[k] = torch.compile(lambda t, k=k: launch.chain(t, k), fullgraph=True,
                                   dynamic=dynamic)
            fns[k](x)
            if k == 1:
                emit(kind="compile_k1", dynamic=dynamic, alone_us=per_call_us(fns[1]))
        emit(kind="compile_k", dynamic=dynamic,
             after_all_us={k: per_call_us(f) for k, f in fns.items()})
emit(kind="done")
