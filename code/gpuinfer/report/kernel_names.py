"""What a slice of a profiler trace is, judged from its name: what it computes (`kind_of`,
one of `KINDS`), who wrote a kernel (`origin`, one of `ORIGINS`), and a kernel's name
without its templates and parameters (`kernel_name`). One classification serves the kernel
tables (gpuinfer.report.trace_tables) and the timelines (gpuinfer.report.traceplot) alike.
"""

from __future__ import annotations

# Name parts of the library kernels that multiply matrices (cuBLAS and the CUTLASS kernels
# it picks); for the kinds and for who wrote a kernel alike.
_LIBRARY_MATMUL = ("gemm", "gemv", "nvjet", "cublas", "cutlass", "xmma", "splitk")

KINDS = ("matrix multiply", "attention", "elementwise", "reduction", "copy / index",
         "host sync", "kernel launch", "other")
_RULES = [  # first match wins; matched against the lower-cased name
    ("host sync", ("synchronize", "aten::item", "_local_scalar_dense")),
    ("kernel launch", ("launchkernel", "graphlaunch")),
    ("attention", ("scaled_dot_product", "fmha", "flash", "attention", "attn")),
    ("matrix multiply", _LIBRARY_MATMUL + ("aten::linear", "aten::mm", "aten::addmm",
                                           "aten::bmm", "aten::matmul")),
    ("reduction", ("mean", "argmax", "reduce", "sum", "softmax")),
    ("copy / index", ("copy", "cat", "memcpy", "memset", "index", "embedding", "aten::to",
                      "contiguous", "fill", "stack", "gather", "scatter")),
    ("elementwise", ("mul", "add", "neg", "rsqrt", "silu", "pow", "sin", "cos",
                     "elementwise", "vectorized", "unrolled", "arange", "sub", "div",
                     "where", "le")),
]
# Inductor names a kernel by how it is scheduled (poi: pointwise; red, per: reductions) and
# by the ops fused into it: `triton_red_fused_mm_3` computes a matrix product.
_INDUCTOR = {"poi": "elementwise", "red": "reduction", "per": "reduction"}


# The book's own Triton kernels (gpuinfer.kernels), named after their functions, and what
# each computes: their names are ours, so no rule above can judge them.
OURS = {
    "qkv_rope_kernel": "matrix multiply",  # the q/k/v product, then rotary and the cache
    "gemv_kernel": "matrix multiply",
    "gemv_silu_kernel": "matrix multiply",
    "lm_head_argmax_kernel": "matrix multiply",  # the lm_head product, then argmax in part
    "attention_partial_kernel": "attention",
    "attention_combine_kernel": "attention",
    "argmax_reduce_kernel": "reduction",
    "embed_kernel": "copy / index",
}
ORIGINS = ("Inductor", "library", "ours", "ATen")  # who wrote a kernel: `origin`


def _ours(name: str) -> str | None:
    return OURS.get(name.split("(")[0].strip())


def kind_of(name: str) -> str:
    """What a trace slice (an op, an API call, a kernel) computes, judged from its name: one
    of `KINDS`. A matrix product is a matrix product whoever generated it."""
    if kind := _ours(name):
        return kind
    parts = name.lower().split("_")
    if parts[0] == "triton" and len(parts) > 1:
        if {"mm", "bmm", "addmm"} & set(parts):
            return "matrix multiply"
        if parts[1] in _INDUCTOR:
            return _INDUCTOR[parts[1]]
    low = name.lower()
    found = (kind for kind, needles in _RULES if any(n in low for n in needles))
    return next(found, "other")


def origin(name: str) -> str:
    """Who wrote a kernel, as far as its name tells (one of `ORIGINS`): Inductor, a library
    (cuBLAS, cuDNN, flash or memory-efficient attention), this book's Triton kernels
    (`OURS`), or PyTorch's own ATen kernels (and the rest)."""
    if _ours(name):
        return "ours"
    low = name.lower()
    if low.startswith("triton_"):
        return "Inductor"
    if any(s in low for s in _LIBRARY_MATMUL + ("fmha", "flash", "cudnn")):
        return "library"
    return "ATen"


def kernel_name(name: str) -> str:
    """A kernel's name without its template arguments, parameter list and return type:
    `void at::native::reduce_kernel<512, 1, ...>(...)` -> `at::native::reduce_kernel`."""
    kept, depth = [], 0
    for ch in name:  # keep only what is outside every <...> and (...)
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1] if words else name
