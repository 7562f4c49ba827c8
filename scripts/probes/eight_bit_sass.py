"""Probe (issue 58), CPU or GPU: the SASS of the gate/up (and down) loops, counted per
weight byte. Compiles each kernel for sm_90 (`aot.compile_only`, no GPU needed) and
counts, in its SASS, the instructions of each kind and the registers a thread holds.
    PYTHONPATH=code python scripts/probes/eight_bit_sass.py [DUMP_DIR]
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton

from gpuinfer.kernels.aot import _cuobjdump, resource_usage

# opcode prefix -> the column it is counted in
KINDS = {
    "LDG": "LDG", "LDS": "LDS", "STS": "STS", "LOP3": "LOP3", "PRMT": "PRMT",
    "FADD": "FADD", "FFMA": "FFMA", "FMUL": "FMUL", "HFMA2": "HFMA2", "HADD2": "HADD2",
    "HMUL2": "HMUL2", "I2F": "I2F", "F2F": "F2F", "F2FP": "F2FP", "I2FP": "I2FP",
    "SHFL": "SHFL", "BAR": "BAR", "IDP4A": "IDP4A", "IMAD": "IMAD", "SHF": "SHF",
    "IADD3": "IADD3", "LEA": "LEA", "BSSY": "BSSY", "IDP": "IDP4A",
}


def sass_of(kernel) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout


def instructions(sass: str) -> list[tuple[int, str, str, str]]:
    """(address, opcode, modifiers, the line) of each instruction."""
    out = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)"
                      r"(\.[\w.]+)?", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3) or "", line))
    return out


def loop_body(ins):
    """The instructions of the longest loop (a backward branch and its target)."""
    best = []
    for addr, op, _, line in ins:
        if op == "BRA":
            target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", line)
            if target and target.group(1) and int(target.group(1), 16) < addr:
                lo = int(target.group(1), 16)
                body = [i for i in ins if lo <= i[0] <= addr]
                best = max(best, body, key=len)
    return best


def count(ins) -> tuple[collections.Counter, collections.Counter]:
    """(counts by KINDS column, LDG counts by width)."""
    kinds, widths = collections.Counter(), collections.Counter()
    for _, op, mods, _ in ins:
        kinds["all"] += 1
        if op in KINDS:
            kinds[KINDS[op]] += 1
        if op == "LDG":
            w = re.search(r"\.(128|64|U8|S8|U16|S16)\b", mods)
            widths[w.group(1) if w else "32"] += 1
    return kinds, widths


def occupancy(regs: int, warps: int, shared: int = 0) -> int:
    """Resident warps per SM on sm_90 (64 K registers, 64 warps, 32 blocks, 228 KB)."""
    per_warp = -(-regs * 32 // 256) * 256  # allocated per warp in units of 256
    blocks = min(65536 // (per_warp * warps), 64 // warps, 32,
                 (233472 // shared) if shared else 32)
    return blocks * warps


def report(name: str, kernel, tile_bytes: int, warps: int, dump: str | None) -> dict:
    """The kernel's registers and occupancy, and its loop's instructions per 16 weight
    bytes a thread (a tile of `tile_bytes` per iteration; no loop: the whole kernel)."""
    sass = sass_of(kernel)
    if dump:
        with open(os.path.join(dump, f"{name.replace(' ', '_')}.sass"), "w") as f:
            f.write(sass)
    ins = instructions(sass)
    body = loop_body(ins) or ins
    kinds, widths = count(body)
    use = resource_usage(kernel)
    resident = occupancy(use["regs"], warps, use["shared"])
    per_thread = tile_bytes / (warps * 32)
    print(f"{name}: regs {use['regs']} stack {use['stack']} -> {resident} warps/SM, "
          f"{resident * 32 * per_thread / 1024:.0f} KB of tiles/SM; loop "
          f"{len(body)} of {len(ins)} instructions, {per_thread:.0f} B a thread an "
          f"iteration; LDG {dict(widths)}")
    per16 = {k: round(16 * v / per_thread, 2) for k, v in kinds.items()}
    print("   per 16 weight bytes a thread:",
          " ".join(f"{k}={v}" for k, v in sorted(per16.items())), flush=True)
    return {"regs": use["regs"], "resident_warps": resident, "loop": dict(kinds),
            "ldg": dict(widths), "bytes_per_thread": per_thread}


def main() -> None:
    import torch

    from gpuinfer.kernels import aot
    from gpuinfer.kernels.gemv import GemvConfig, gemv, gemv_silu
    from gpuinfer.kernels.tiling import default_configs
    from gpuinfer.model.quant import Int8Matrix

    dump = sys.argv[1] if len(sys.argv) > 1 else None
    if dump:
        os.makedirs(dump, exist_ok=True)
    H, I = 2048, 8192

    def t(*shape, dt=torch.bfloat16):
        return torch.empty(shape, dtype=dt)

    jobs = []
    for weights in ("bf16", "int8"):
        c = default_configs(True, weights)
        if weights == "int8":
            m = (lambda n, k: Int8Matrix(t(n, k, dt=torch.int8), t(n)))
        else:
            m = (lambda n, k: t(n, k))
        jobs.append((f"gate_up {weights} {c['gate_up'].block_n}x{c['gate_up'].block_k}",
                     lambda m=m, c=c: gemv_silu(m(2 * I, H), t(H), t(I), norm=t(H),
                                                config=c["gate_up"], pdl=True),
                     c["gate_up"], 2 * c["gate_up"].block_n * c["gate_up"].block_k
                     * (1 if weights == "int8" else 2)))
        jobs.append((f"down {weights} {c['down'].block_n}x{c['down'].block_k}",
                     lambda m=m, c=c: gemv(m(H, I), t(I), t(H), residual=t(H),
                                           config=c["down"], pdl=True),
                     c["down"], c["down"].block_n * c["down"].block_k
                     * (1 if weights == "int8" else 2)))
    jobs += _extra_jobs(t)
    for name, launch, config, tile_bytes in jobs:
        with aot.compile_only(90) as compiled:
            launch()
        _, _, kernel = compiled[-1]
        report(name, kernel, tile_bytes, config.num_warps, dump)


def _extra_jobs(t):
    """The eight-bit designs of `gpuinfer.kernels.eight_bit_gemv`, when present."""
    try:
        from gpuinfer.kernels.eight_bit_gemv import AOT_CONFIGS, eight_bit_launches
    except ImportError:
        return []
    jobs = []
    configs = {f"{m} {fmt} fold {c[1]}{' ahead' if c[2] else ''}": c
               for fmt, runs in AOT_CONFIGS.items() for m, c in runs}
    for name, launch in eight_bit_launches(90):
        config, _, _ = configs[name]
        rows = config.block_n * (2 if name.startswith("gate_up") else 1)
        jobs.append((name, launch, config, rows * config.block_k))
    return jobs


if __name__ == "__main__":
    main()
