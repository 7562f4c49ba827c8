"""Probe (issue 57), CPU: compile the pass's MMA kernels and the step's GEMV kernels at
Chapter 6's target shape for sm_90 (BF16, PDL on; `aot.compile_only`) and dump each
kernel's TTGIR, PTX and SASS (cuobjdump -sass) under DIR, with registers/stack.

    PYTHONPATH=code python scripts/probes/pass_sass_dump.py [DIR=/tmp/pass_sass]
"""
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import torch

from gpuinfer.kernels.aot import _cuobjdump, compile_only, resource_usage

BF16 = torch.bfloat16
H, I, HEADS, KV, D, CAP = 1024, 2816, 16, 4, 64, 256


def t(*shape, dt=BF16):
    return torch.empty(shape, dtype=dt)


def sass_of(kernel):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout


def dump(directory, label, kernel):
    """The kernel's TTGIR, PTX and SASS as DIRECTORY/LABEL.{ttgir,ptx,sass}."""
    for ext in ("ttgir", "ptx"):
        with open(os.path.join(directory, f"{label}.{ext}"), "w") as f:
            f.write(kernel.asm[ext])
    with open(os.path.join(directory, f"{label}.sass"), "w") as f:
        f.write(sass_of(kernel))


def dump_and_say(directory, label, kernel):
    """`dump`, then a line of the kernel's registers, stack and shared memory."""
    dump(directory, label, kernel)
    u = resource_usage(kernel)
    print(f"{label}: regs {u['regs']} stack {u['stack']} smem {kernel.metadata.shared}",
          flush=True)


def jobs():
    from gpuinfer.kernels.gemv import gemv, gemv_silu
    from gpuinfer.kernels.pass_mma import gemv_pass, gemv_silu_pass, mma_configs
    from gpuinfer.kernels.pass_mma_heads import qkv_rope_pass
    from gpuinfer.kernels.qkv_rope import qkv_rope
    from gpuinfer.kernels.tiling import default_configs
    cfg = SimpleNamespace(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS,
                          num_key_value_heads=KV, head_dim=D, vocab_size=8192)
    mc = mma_configs(cfg, gpu=True)
    ks = {"qkv": H, "o": HEADS * D, "gate_up": H, "down": I, "lm_head": H}
    # the step's tiling as TritonDecoder fits it (`triton_step._fit`)
    sc = {n: c.fit(ks[n]) for n, c in default_configs(True).items()}
    pos, cache, table = t(1, dt=torch.long), t(KV, CAP, D), t(CAP, D)
    out = []
    for T in (2, 5):
        out += [
            (f"pass_gate_up_T{T}", lambda T=T: gemv_silu_pass(
                t(2 * I, H), t(T, H), t(T, I), norm=t(H), config=mc["gate_up"], pdl=True)),
            (f"pass_qkv_T{T}", lambda T=T: qkv_rope_pass(
                t((HEADS + 2 * KV) * D, H), t(T, H), t(T, HEADS * D), cache, cache, table,
                table, pos, n_heads=HEADS, norm=t(H), config=mc["qkv"], pdl=True)),
            (f"pass_o_T{T}", lambda T=T: gemv_pass(
                t(H, HEADS * D), t(T, HEADS * D), x := t(T, H), residual=x,
                config=mc["o"], pdl=True)),
            (f"pass_down_T{T}", lambda T=T: gemv_pass(
                t(H, I), t(T, I), x := t(T, H), residual=x, config=mc["down"], pdl=True)),
        ]
    out += [
        ("step_gate_up", lambda: gemv_silu(t(2 * I, H), t(H), t(I), norm=t(H),
                                           config=sc["gate_up"], pdl=True)),
        ("step_qkv", lambda: qkv_rope(t((HEADS + 2 * KV) * D, H), t(H), t(HEADS * D),
                                      cache, cache, table, table, pos, n_heads=HEADS,
                                      norm=t(H), config=sc["qkv"], pdl=True)),
        ("step_o", lambda: gemv(t(H, HEADS * D), t(HEADS * D), x := t(H), residual=x,
                                config=sc["o"], pdl=True)),
        ("step_down", lambda: gemv(t(H, I), t(I), x := t(H), residual=x,
                                   config=sc["down"], pdl=True)),
    ]
    return out


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/pass_sass"
    os.makedirs(d, exist_ok=True)
    for label, launch in jobs():
        with compile_only(90) as compiled:
            launch()
        name, kw, k = compiled[-1]
        u = resource_usage(k)
        dump(d, label, k)
        print(f"{label:18s} {name:24s} regs {u['regs']} stack {u['stack']} "
              f"smem {k.metadata.shared} warps {k.metadata.num_warps} "
              f"stages {kw.get('num_stages')} BLOCK_N {kw.get('BLOCK_N')} "
              f"BLOCK_K {kw.get('BLOCK_K')} N_TILES {kw.get('N_TILES')} "
              f"SPLIT_K {kw.get('SPLIT_K')} CHAINS {kw.get('CHAINS')}", flush=True)


if __name__ == "__main__":
    main()
