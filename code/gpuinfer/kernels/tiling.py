"""How the decode step's kernels are tiled: one GemvConfig per weight matrix of the step
and the attention kernel's split, for a GPU and for the interpreter. The values are the
H200 probe's best (scripts/probes/NOTES-triton.md)."""

from __future__ import annotations

from gpuinfer.kernels.gemv import GemvConfig

GEMVS = ("qkv", "o", "gate_up", "down", "lm_head")
PAIRED = ("qkv", "gate_up")  # tiled in pairs of rows: their fused epilogues need both


def default_configs(gpu: bool) -> dict[str, GemvConfig]:
    """Per-matrix tiling (block_n in pairs for qkv and gate_up). On a GPU: 8 rows of
    2048 (32 KB of BF16) per program, loaded as one tile before the PDL wait by 8
    warps (under 100 registers a thread, no spills: `python -m gpuinfer.kernels.aot`);
    4 rows for gate_up; no split-K (the H200 probe's best: NOTES-triton.md).
    Interpreted: few, large programs, since each program is a Python call."""
    if gpu:
        return {"qkv": GemvConfig(4, 2048, 1, 8), "o": GemvConfig(8, 2048, 1, 8),
                "gate_up": GemvConfig(2, 2048, 1, 4), "down": GemvConfig(8, 2048, 1, 8),
                "lm_head": GemvConfig(8, 2048, 1, 8)}
    return {name: GemvConfig(256, 4096) for name in GEMVS}


def default_attention(gpu: bool) -> dict:
    """decode_attention's tiling: 32 chunks per key/value head (256 programs for 8
    heads) of 64-slot tiles on a GPU; one chunk per head interpreted."""
    return {"n_split": 32 if gpu else 1, "block_s": 64, "num_warps": 4}
