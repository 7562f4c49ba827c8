"""Compile the step's kernels for a GPU on a machine without one (a dev tool).

Triton compiles ahead of time for any target: `compile_only(capability)` swaps in a
driver that reports a device of that compute capability (90: sm_90, Hopper; 80: A100;
89: L4, RTX 40xx) and turns every `kernel[grid](...)` launch into a compilation
(`warmup`), so the ordinary launchers, called on CPU tensors, produce the CUDA binaries
without running them: ptxas assembles them for that sm. `resource_usage` then reads
each binary's registers and stack (spills) with the cuobjdump that ships with Triton.
This catches what the interpreter cannot: code that does not compile for a GPU the
book runs on, and tiles too large for the register file.

    python -m gpuinfer.kernels.aot   # the 1B-shaped step on sm_80, sm_89, sm_90, BF16
                                     # and int8: a line a kernel, PDL on sm_90 only

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

TARGETS = (80, 89, 90)  # A100; L4 and RTX 40xx; H100 and H200


def pdl_for(capability: int) -> bool:
    """Whether the book turns Programmatic Dependent Launch on for a GPU of this compute
    capability (90 for sm_90): `common.pdl_supported`'s rule. Its griddepcontrol
    instructions exist from sm_90 on; ptxas rejects them for an earlier target."""
    return capability >= 90


class _Target:
    """Just enough of a Triton driver to compile: a target, a device, a stream.

    Its device number is the capability: Triton keeps a kernel's binaries, and the
    target it compiles for, per device number, so under one number a second target
    would be handed the first target's binaries."""

    def __init__(self, capability: int = 90):
        self.capability = capability

    def get_current_target(self):
        return GPUTarget("cuda", self.capability, 32)

    def get_current_device(self):
        return self.capability

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty):
        return ty


@contextlib.contextmanager
def compile_only(capability: int = 90):
    """Inside: kernel launches compile for sm_<capability> instead of running; one that
    does not compile raises (ptxas's errors in its message). Yields the list of
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
    driver.set_active(_Target(capability))
    JITFunction.__getitem__ = warmup
    try:
        yield compiled
    finally:
        JITFunction.__getitem__ = getitem
        driver._active = previous


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")


def resource_usage(kernel) -> dict:
    """Registers, stack (> 0: spilled registers), static shared memory of a kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", out)
    return dict(zip(("regs", "stack", "shared"), map(int, found.groups())))


def cubin_capability(kernel) -> int:
    """The sm a kernel's binary was assembled for (90 for sm_90a), read from the
    binary itself."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([_cuobjdump(), "--list-elf", f.name], capture_output=True,
                             text=True, check=True).stdout
    return int(re.search(r"\.sm_(\d+)a?\.cubin", out).group(1))


def compile_step(configs: dict, *, pdl: bool | None = None, inline: bool = True,
                 inline_argmax: bool = False, attns: tuple[dict, ...] = ({},),
                 int8=False,
                 dtype=torch.bfloat16, hidden=2048, inter=8192, heads=32, kv_heads=8,
                 head_dim=64, vocab=128256, capacity=4096, capability=90) -> list:
    """Compile every kernel of one step of a Llama of these shapes (Llama-3.2-1B by
    default) for sm_<capability> with the GEMV `configs` ({name: GemvConfig}), its
    matrices int8 if `int8`, attention once for each tiling in `attns`, PDL as the book
    sets it there unless `pdl` says; one row (name, resource_usage) per kernel."""
    from gpuinfer.kernels.embed_head import embed, lm_head_argmax
    from gpuinfer.kernels.attention import decode_attention
    from gpuinfer.kernels.gemv import gemv, gemv_silu
    from gpuinfer.model.quant import Int8Matrix
    from gpuinfer.kernels.qkv_rope import qkv_rope

    def t(*shape, dt=dtype):  # never touched: only its dtype and address matter
        return torch.empty(shape, dtype=dt)

    def m(n, k):  # a weight matrix
        return Int8Matrix(t(n, k, dt=torch.int8), t(n)) if int8 else t(n, k)

    x, pos, tokens = t(hidden), t(1, dt=torch.long), t(capacity, dt=torch.long)
    cache, table = t(kv_heads, capacity, head_dim), t(capacity, head_dim)
    q = t(heads * head_dim)
    if pdl is None:
        pdl = pdl_for(capability)
    with compile_only(capability) as compiled:
        embed(t(vocab, hidden), tokens, pos, x, pdl=pdl)
        qkv_rope(m((heads + 2 * kv_heads) * head_dim, hidden), x, q, cache, cache,
                 table, table, pos, n_heads=heads, norm=x, config=configs["qkv"],
                 pdl=pdl)
        for attn in attns:
            decode_attention(q, cache, cache, pos, q, inline_combine=inline, pdl=pdl,
                             **attn)
        gemv(m(hidden, heads * head_dim), q, x, residual=x, config=configs["o"],
             pdl=pdl)
        gemv_silu(m(2 * inter, hidden), x, t(inter), norm=x, config=configs["gate_up"],
                  pdl=pdl)
        gemv(m(hidden, inter), t(inter), x, residual=x, config=configs["down"], pdl=pdl)
        lm_head_argmax(m(vocab, hidden), x, t(vocab), tokens, pos, norm=x,
                       config=configs["lm_head"], inline=inline_argmax, pdl=pdl)
    for name, _, kernel in compiled:  # this sm's binary, not one kept for another
        if (sm := cubin_capability(kernel)) != capability:
            raise RuntimeError(f"{name} was assembled for sm_{sm}, not sm_{capability}")
    return [(name, resource_usage(kernel)) for name, _, kernel in compiled]


def main() -> int:
    from gpuinfer.kernels.common import INTERPRETED
    from gpuinfer.kernels.tiling import (ONE_PROGRAM_CONTEXT, SHORT_CONTEXT,
                                         default_attention, default_configs)

    if INTERPRETED:
        print("unset TRITON_INTERPRET: interpreted kernels do not compile")
        return 2
    # attention's three tilings: a small cache's one program a head, a short cache's
    # split and a long one's
    attns = tuple(default_attention(gpu=True, capacity=c)
                  for c in (ONE_PROGRAM_CONTEXT, SHORT_CONTEXT, 1 << 15))
    spilled = 0
    for capability in TARGETS:
        for weights in ("bf16", "int8"):
            pdl = pdl_for(capability)
            print(f"sm_{capability}, {weights} weights, PDL {'on' if pdl else 'off'}:")
            configs = default_configs(gpu=True, weights=weights)
            step = compile_step(configs, attns=attns, int8=weights == "int8",
                                capability=capability, pdl=pdl)
            for name, usage in step:
                print(f"  {name:28s} {usage}")
                spilled += usage["stack"] > 0
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
