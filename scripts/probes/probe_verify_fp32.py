"""Probe (not book code; results in NOTES-speculative.md): what an FP32 verify pass's matrix products cost for T = 1 ... 16
query tokens, per way of computing them, on Chapter 6's target shapes (hidden 1024, 16
layers, GQA 16/4, MLP 2816, vocabulary 8192). Sums one layer's products x 16 + lm_head."""
import sys
import torch
from gpuinfer.measure.timing import benchmark_graph, fresh_inputs

SHAPES = {"qkv": (1536, 1024), "o": (1024, 1024), "gate_up": (5632, 1024),
          "down": (1024, 2816), "lm_head": (8192, 1024)}
TS = [1, 2, 3, 4, 5, 6, 8, 12, 16]


def reduce_mm(x, w):
    return (x[:, None, :] * w[None]).sum(-1)


torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.cache_size_limit = 1000
compiled = torch.compile(reduce_mm, dynamic=False)
variants = {
    "cublas": lambda x, w: torch.nn.functional.linear(x, w),
    "reduce (inductor)": compiled,
}
if "--lt" in sys.argv:
    variants["cublaslt"] = "lt"
results = {}
for name, fn in variants.items():
    for t in TS:
        total = 0.0
        for shape_name, (n, k) in SHAPES.items():
            sets = fresh_inputs(lambda: (torch.randn(t, k, device="cuda"),
                                         torch.randn(n, k, device="cuda")),
                                (t * k + n * k) * 4, min_total_bytes=2**28, max_sets=64)
            if fn == "lt":
                torch.backends.cuda.preferred_blas_library("cublaslt")
                f = variants["cublas"]
            else:
                torch.backends.cuda.preferred_blas_library("cublas")
                f = fn
            timing = benchmark_graph(f, calls=len(sets), inputs=sets, repeats=10)
            us = timing.median * 1e3
            total += us * (16 if shape_name != "lm_head" else 1)
        results[(name, t)] = total
        print(f"{name:20s} T={t:2d}  linears per pass {total:7.0f} us", flush=True)
torch.backends.cuda.preferred_blas_library("cublas")
# BF16 reference
for t in TS:
    total = 0.0
    for shape_name, (n, k) in SHAPES.items():
        sets = fresh_inputs(lambda: (torch.randn(t, k, device="cuda", dtype=torch.bfloat16),
                                     torch.randn(n, k, device="cuda", dtype=torch.bfloat16)),
                            (t * k + n * k) * 2, min_total_bytes=2**28, max_sets=64)
        timing = benchmark_graph(torch.nn.functional.linear, calls=len(sets), inputs=sets,
                                 repeats=10)
        total += timing.median * 1e3 * (16 if shape_name != "lm_head" else 1)
    print(f"{'bf16 cublas':20s} T={t:2d}  linears per pass {total:7.0f} us", flush=True)
