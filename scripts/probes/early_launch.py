"""Probe helper (issue 57): the products' kernels (gemv, gemv_silu, q/k/v: the step's
and the pass's) let the next kernel launch (`gdc_launch_dependents`) before they load
their weights, instead of after their PDL wait; the wait stays where it is.

    PYTHONPATH=code python scripts/probes/early_launch.py PROBE.py [its arguments]

runs PROBE with the kernels patched (before any of them compiles). `pass_order.py
--early` patches the same way.
"""
import os
import runpy
import sys

import triton
import triton.language as tl

from gpuinfer.kernels import gemv, qkv_rope, tile
from gpuinfer.kernels.tile import INTERPRET

original_prefetch = tile.prefetch


@triton.jit
def wait_only(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def launch_then_prefetch(w_ptr, stride_w, rows, row_mask, k_lo, k_hi, norm_ptr,
                         scale_ptr, NORM: tl.constexpr, SCALED: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    if not INTERPRET:  # the interpreter runs no PTX
        tl.extra.cuda.gdc_launch_dependents()  # a no-op without dependents
    return original_prefetch(w_ptr, stride_w, rows, row_mask, k_lo, k_hi, norm_ptr,
                             scale_ptr, NORM, SCALED, BLOCK_K)


@triton.jit
def launch_then_wait(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


def patch():
    for module in (gemv, qkv_rope):
        module.prefetch, module.pdl_wait = launch_then_prefetch, wait_only


OTHERS = ("attention", "eight_bit_gemv", "embed_head", "pass_attention",
          "pass_mma_heads")


def patch_others(names=OTHERS):
    """The other kernels (attention, embedding, lm_head, the pass's heads, the
    eight-bit GEMV; or only the modules named) let the next launch just before their
    wait, not after it. The pass's own kernels alone: pass_attention (its attention)
    and pass_mma_heads (its acceptance); its lm_head runs embed_head's program."""
    import importlib
    for name in names:
        if name not in OTHERS:
            raise SystemExit(f"early_launch: no kernel module {name!r}; one of {OTHERS}")
        importlib.import_module(f"gpuinfer.kernels.{name}").pdl_wait = launch_then_wait


if __name__ == "__main__":
    patch()
    probe = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(probe)))
    print("early launch: the products' kernels trigger their dependents first", flush=True)
    runpy.run_path(probe, run_name="__main__")
