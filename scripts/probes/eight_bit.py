"""Probe (issue 58), on the H200: the eight-bit designs of `kernels.eight_bit_gemv`
against BF16 and today's int8, one GEMV at a time, at the 1B step's gate/up + SiLU
(16384 x 2048, RMSNorm prologue) and down + residual (2048 x 8192).

Each variant is a CUDA graph of LAUNCHES launches of one kernel (PDL on), each reading
its own copy of the weights (copies rotate past the 50 MB L2), timed in interleaved
rounds with CUDA events; each variant's output is first checked against its
reference. Prints µs a launch (median, min-max), GB/s of weights and the time as a
fraction of BF16's; then the SASS counts of the kernels (eight_bit_sass.py).
    PYTHONPATH=code python scripts/probes/eight_bit.py [ROUNDS]   # ~3-4 min
"""

import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from gpuinfer.kernels.eight_bit import fp8_rows
from gpuinfer.kernels.eight_bit_gemv import (gemv8, gemv8_reference, gemv8_silu,
                                             gemv8_silu_reference)
from gpuinfer.kernels.gemv import (GemvConfig as C, gemv, gemv_reference, gemv_silu,
                                   gemv_silu_reference)
from gpuinfer.kernels.tiling import default_configs
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.model.llama import rms_norm
from gpuinfer.model.quant import quantize_int8

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
H, I, LAUNCHES, L2_ROTATE = 2048, 8192, 48, 200 << 20
dev, bf = "cuda", torch.bfloat16
t0 = time.perf_counter()
torch.manual_seed(0)
BF16, INT8 = default_configs(True, "bf16"), default_configs(True, "int8")
SHAPES = {"gate_up": (2 * I, H), "down": (H, I)}


def copies(nbytes):
    return max(2, -(-L2_ROTATE // nbytes))


def log(*a):
    print(f"[{time.perf_counter() - t0:5.0f} s]", *a, flush=True)


# Weights: one BF16 master per shape, its int8 and fp8 forms, rotated copies of each
master = {m: torch.randn(n, k, device=dev, dtype=bf) * 0.02
          for m, (n, k) in SHAPES.items()}
forms = {m: {"bf16": w, "int8": quantize_int8(w), "fp8": fp8_rows(w)}
         for m, w in master.items()}
x = {"gate_up": torch.randn(H, device=dev, dtype=bf),
     "down": torch.randn(I, device=dev, dtype=bf) * 0.1}
norm = torch.randn(H, device=dev, dtype=bf) * 0.1 + 1
res = torch.randn(H, device=dev, dtype=bf)


def rotated(m, form):
    w = forms[m][form]
    n = copies(w.nbytes if hasattr(w, "nbytes") else w.numel() * w.element_size())
    if form == "bf16":
        return [w.clone() for _ in range(n)]
    return [type(w)(w.q.clone(), w.scale.clone()) for _ in range(n)]


def nbytes(w):
    return w.nbytes if not isinstance(w, torch.Tensor) else w.numel() * w.element_size()


# variant name -> (matrix, form, call(w) -> output, reference(w) -> output)
V = {}


def ours(m, name, form, fmt, config, fold=1, ahead=False):
    kw = dict(config=config, pdl=True, format=fmt, fold=fold, ahead=ahead)
    if m == "gate_up":
        V[f"{m} {name}"] = (m, form, lambda w: gemv8_silu(w, x[m], norm=norm, **kw),
                            lambda w: gemv8_silu_reference(w, x[m], norm=norm,
                                                           format=fmt))
    else:
        V[f"{m} {name}"] = (m, form, lambda w: gemv8(w, x[m], residual=res, **kw),
                            lambda w: gemv8_reference(w, x[m], residual=res,
                                                      format=fmt))


for m in SHAPES:
    for form, cfg in (("bf16", BF16[m]), ("int8", INT8[m])):
        if m == "gate_up":
            V[f"{m} {form} today"] = (m, form, lambda w, c=cfg: gemv_silu(
                w, x["gate_up"], norm=norm, config=c, pdl=True),
                lambda w: gemv_silu_reference(w, x["gate_up"], norm=norm))
        else:
            V[f"{m} {form} today"] = (m, form, lambda w, c=cfg: gemv(
                w, x["down"], residual=res, config=c, pdl=True),
                lambda w: gemv_reference(w, x["down"], residual=res))
    base = INT8[m]
    tilings = ([base, C(4, 512, 1, 4), C(8, 1024, 1, 4), C(4, 2048, 1, 4),
                C(16, 256, 1, 4)] if m == "gate_up" else
               [base, C(8, 2048, 1, 4), C(8, 1024, 1, 4), C(16, 1024, 1, 8)])
    for fmt, form in (("int8", "int8"), ("fp8_bits", "fp8"), ("fp8_cvt", "fp8")):
        ours(m, f"{fmt} fold 1", form, fmt, base, 1)
        for c in tilings:
            tag = f"{c.block_n}x{c.block_k}w{c.num_warps}"
            ours(m, f"{fmt} fold 16 {tag}", form, fmt, c, 16)
        ours(m, f"{fmt} fold 16 ahead", form, fmt, base, 16, True)
    for c in tilings:
        ours(m, f"dp4a {c.block_n}x{c.block_k}w{c.num_warps}", "int8", "dp4a", c)


# Inductor on the same formats (gpt-fast's pattern for the eight-bit ones)
def inductor(m, form):
    def up(w, xv):
        if form == "bf16":
            return F.linear(xv, w)
        q = w.q.view(torch.float8_e4m3fn) if form == "fp8" else w.q
        return F.linear(xv, q.to(bf)) * w.scale.to(bf)

    if m == "gate_up":
        def f(w):
            g, u = up(w, rms_norm(x[m], norm, 1e-5)).chunk(2)
            return F.silu(g) * u
    else:
        def f(w):
            return res + up(w, x[m])
    return torch.compile(f, dynamic=False)


for m in SHAPES:
    for form in ("bf16", "int8", "fp8"):
        ref = {"bf16": V[f"{m} bf16 today"][3], "int8": V[f"{m} int8 today"][3]}.get(
            form, (lambda w, m=m: (gemv8_silu_reference(w, x[m], norm=norm,
                                                         format="fp8_bits")
                                   if m == "gate_up" else
                                   gemv8_reference(w, x[m], residual=res,
                                                   format="fp8_bits"))))
        V[f"{m} inductor {form}"] = (m, form, inductor(m, form), ref)

# Check, then capture a graph of LAUNCHES launches over rotated copies
fns, bytes_of, bad = {}, {}, []
stream = torch.cuda.Stream()
for name, (m, form, call, ref) in V.items():
    try:
        ws = rotated(m, form)
        out, want = call(ws[0]), ref(ws[0])
        torch.cuda.synchronize()
        err = float((out.double() - want.double()).norm() / want.double().norm())
        if not err <= 2e-2:
            bad.append(f"{name}: rel err {err:.3g}")
            continue
        for w in ws[:3]:  # warm (and compile) outside the capture
            call(w)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(LAUNCHES):
                call(ws[i % len(ws)])
        fns[name], bytes_of[name] = graph.replay, nbytes(ws[0])
        V[name] = (m, form, call, ref, ws, graph)  # keep the copies alive
    except Exception as e:  # noqa: BLE001 - one variant's failure is a row
        bad.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
log(f"{len(fns)} variants captured; failed or wrong: {len(bad)}")
for line in bad:
    print("  !", line)

rounds = interleaved_rounds(fns, rounds=ROUNDS, warmup=2, per_call=LAUNCHES)
log(f"{ROUNDS} rounds")
for m in SHAPES:
    base = f"{m} bf16 today"
    print(f"\n{m}: µs a launch, median (min-max); GB/s of weights; time / BF16's")
    for name in sorted((n for n in fns if n.startswith(m)),
                       key=lambda n: rounds[n].median):
        t = rounds[name]
        us = 1e3 * t.median
        frac = t.median / rounds[base].median if base in fns else float("nan")
        print(f"  {name[len(m) + 1:]:34s} {us:7.2f} ({1e3 * t.min:.2f}-"
              f"{1e3 * t.max:.2f})  {bytes_of[name] / us / 1e3:6.0f} GB/s  {frac:.3f}")

log("SASS counts (sm_90, compiled here):")
sys.stdout.flush()
here = os.path.dirname(os.path.abspath(__file__))
subprocess.run([sys.executable, os.path.join(here, "eight_bit_sass.py")], check=False)
