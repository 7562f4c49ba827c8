"""Run this package's Triton kernels on a CPU, under Triton's interpreter.

Triton decides between compiling and interpreting when a function is *decorated*
(`@triton.jit` reads TRITON_INTERPRET), and that includes its own library: `tl.sum`,
`tl.max`, `tl.cdiv` are `@jit` functions of `triton.language.standard`, decorated when
`triton` is first imported. `from transformers import LlamaForCausalLM` imports triton,
so in a test session the library is usually decorated for compiling before any kernel
test sets the variable, and an interpreted kernel then fails as it calls `tl.sum`.
`use_interpreter()` sets the variable for the rest of the process and decorates again
whatever was decorated before it: the standard library and our kernel modules.
"""

from __future__ import annotations

import importlib
import os
import sys

# Ours, in import order (each binds names from the ones before it).
MODULES = ("gpuinfer.kernels.common", "gpuinfer.kernels.tile",
           "gpuinfer.kernels.mma_dot", "gpuinfer.kernels.gemv",
           "gpuinfer.kernels.tiling", "gpuinfer.kernels.qkv_rope",
           "gpuinfer.kernels.attention", "gpuinfer.kernels.embed_head",
           "gpuinfer.kernels.position_ring", "gpuinfer.decode.triton_step")


def use_interpreter() -> None:
    """From now on, run Triton kernels under the interpreter (call it before importing
    the kernel modules; only where there is no GPU to compile for)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(standard.sum, InterpretedFunction):
        importlib.reload(standard)  # re-decorated, now interpreted
        for name, value in vars(standard).items():
            if isinstance(value, InterpretedFunction) and hasattr(tl, name):
                setattr(tl, name, value)  # `tl.sum` is standard.sum re-exported
    common = sys.modules.get(MODULES[0])
    if common is not None and not common.INTERPRETED:
        for name in MODULES:
            if name in sys.modules:
                importlib.reload(sys.modules[name])
