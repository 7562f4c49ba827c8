"""Compile the step's kernels for a Hopper GPU on a machine without one (a dev tool).

Triton compiles ahead of time for any target: `compile_only()` swaps in a driver that
reports an sm_90 device and turns every `kernel[grid](...)` launch into a compilation
(`warmup`), so the ordinary launchers, called on CPU tensors, produce the CUDA binaries
without running them. `resource_usage` then reads each binary's registers and stack
(spills) with the cuobjdump that ships with Triton. This catches what the interpreter
cannot: code that does not compile, and tiles too large for the register file.

    python -m gpuinfer.kernels.aot   # the 1B-shaped step, BF16 and int8, a line a kernel

Run it without TRITON_INTERPRET (interpreted kernels do not compile).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction


class _Hopper:
    """Just enough of a Triton driver to compile: a target, a device, a stream."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty):
        return ty


@contextlib.contextmanager
def compile_only():
    """Inside: kernel launches compile for sm_90 instead of running. Yields the list of
    (kernel name, launch keyword arguments, CompiledKernel) it fills."""
    compiled = []
    getitem = JITFunction.__getitem__

    def warmup(self, grid):
        def launch(*args, **kwargs):
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            compiled.append((self.fn.__name__, kwargs, kernel))
            return kernel
        return launch

    previous = driver._active  # None until a driver is first used (none without a GPU)
    driver.set_active(_Hopper())
    JITFunction.__getitem__ = warmup
    try:
        yield compiled
    finally:
        JITFunction.__getitem__ = getitem
        driver._active = previous


def resource_usage(kernel) -> dict:
    """Registers, stack (> 0: spilled registers), static shared memory of a kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", out)
    return dict(zip(("regs", "stack", "shared"), map(int, found.groups())))


def compile_step(configs: dict, *, pdl: bool = True, inline: bool = True,
                 inline_argmax: bool = False, attn: dict | None = None, int8=False,
                 dtype=torch.bfloat16, hidden=2048, inter=8192, heads=32, kv_heads=8,
                 head_dim=64, vocab=128256, capacity=4096) -> list:
    """Compile every kernel of one step of a Llama of these shapes (Llama-3.2-1B by
    default) with the GEMV `configs` ({name: GemvConfig}), its matrices int8 if `int8`;
    one row per kernel."""
    from gpuinfer.kernels.quant import Int8Matrix
    from gpuinfer.kernels.argmax import embed, lm_head_argmax
    from gpuinfer.kernels.attention import decode_attention
    from gpuinfer.kernels.gemv import gemv, gemv_silu
    from gpuinfer.kernels.rotary import qkv_rope

    def t(*shape, dt=dtype):  # never touched: only its dtype and address matter
        return torch.empty(shape, dtype=dt)

    def m(n, k):  # a weight matrix
        return Int8Matrix(t(n, k, dt=torch.int8), t(n)) if int8 else t(n, k)

    x, pos, tokens = t(hidden), t(1, dt=torch.long), t(capacity, dt=torch.long)
    cache, table = t(kv_heads, capacity, head_dim), t(capacity, head_dim)
    q = t(heads * head_dim)
    with compile_only() as compiled:
        embed(t(vocab, hidden), tokens, pos, x, pdl=pdl)
        qkv_rope(m((heads + 2 * kv_heads) * head_dim, hidden), x, q, cache, cache,
                 table, table, pos, n_heads=heads, norm=x, config=configs["qkv"],
                 pdl=pdl)
        decode_attention(q, cache, cache, pos, q, inline_combine=inline, pdl=pdl,
                         **(attn or {}))
        gemv(m(hidden, heads * head_dim), q, x, residual=x, config=configs["o"],
             pdl=pdl)
        gemv_silu(m(2 * inter, hidden), x, t(inter), norm=x, config=configs["gate_up"],
                  pdl=pdl)
        gemv(m(hidden, inter), t(inter), x, residual=x, config=configs["down"], pdl=pdl)
        lm_head_argmax(m(vocab, hidden), x, t(vocab), tokens, pos, norm=x,
                       config=configs["lm_head"], inline=inline_argmax, pdl=pdl)
    return [(name, resource_usage(kernel)) for name, _, kernel in compiled]


def main() -> int:
    from gpuinfer.kernels.common import INTERPRETED
    from gpuinfer.kernels.tiling import default_attention, default_configs

    if INTERPRETED:
        print("unset TRITON_INTERPRET: interpreted kernels do not compile")
        return 2
    spilled = 0
    for weights in ("bf16", "int8"):
        print(f"{weights} weights:")
        step = compile_step(default_configs(gpu=True), attn=default_attention(gpu=True),
                            int8=weights == "int8")
        for name, usage in step:
            print(f"  {name:28s} {usage}")
            spilled += usage["stack"] > 0
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
