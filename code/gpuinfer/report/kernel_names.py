"""What a slice of a profiler trace is, judged from its name: what it computes (`kind_of`,
one of `KINDS`), who wrote a kernel (`origin`, one of `ORIGINS`), and a kernel's name
without its templates and parameters (`kernel_name`). One classification serves the kernel
tables (gpuinfer.report.trace_tables) and the timelines (gpuinfer.report.traceplot) alike.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

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


# The book's own Triton kernels (gpuinfer.kernels) are named in a trace after their
# functions, bare `*_kernel` identifiers: ours are the names of the package's `@triton.jit`
# functions, not any name of that shape (cuBLAS has a bare `gemv2T_kernel` too).
_KERNELS = Path(__file__).resolve().parents[1] / "kernels"
# What ours compute, judged from their names (first match wins): the rules above would
# call `qkv_rope_kernel` and `embed_kernel` "other", and `lm_head_argmax_kernel` (the
# lm_head product, then argmax in part) a reduction. A kernel none matches falls to them.
_OUR_RULES = [  # matched against the kernel's name
    ("attention", ("attention",)),  # a pass's attention too
    ("matrix multiply", ("gemv", "qkv", "lm_head")),  # gemv8_*, the *_pass_* (MMA) too
    ("reduction", ("argmax_reduce", "accept")),  # a pass's acceptance: its argmax too
    ("copy / index", ("embed",)),
]
ORIGINS = ("Inductor", "library", "ours", "ATen")  # who wrote a kernel: `origin`


@cache
def our_kernels() -> frozenset[str]:
    """The names of the book's Triton kernels: the `@triton.jit` (and Gluon `@gluon.jit`)
    functions named *_kernel in gpuinfer/kernels, read once from their source: importing
    them would need Triton, and tie every chapter that reads a trace to every kernel's
    code. The reach analysis (gpuinfer.publish.reach) does not follow this read, and
    need not: a kernel changes what is said of its own name only, which only a chapter
    that launches it, so reaches it, finds in a trace. A new kernel needs no table
    edited."""
    return frozenset(
        node.name for path in sorted(_KERNELS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf8")))
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel")
        and any("jit" in ast.unparse(d) for d in node.decorator_list))


def _ours(name: str) -> str | None:
    """The kernel's name if it is one of ours, else None."""
    bare = name.split("(")[0].strip()
    return bare if bare in our_kernels() else None


def kind_of(name: str) -> str:
    """What a trace slice (an op, an API call, a kernel) computes, judged from its name: one
    of `KINDS`. A matrix product is a matrix product whoever generated it."""
    if ours := _ours(name):
        found = (kind for kind, needles in _OUR_RULES if any(n in ours for n in needles))
        if kind := next(found, None):
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
    (`our_kernels`), or PyTorch's own ATen kernels (and the rest)."""
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
