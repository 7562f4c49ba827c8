"""How the decode step's kernels are tiled: one GemvConfig per weight matrix and the
attention kernel's split, for a GPU and for the interpreter. The GPU values are the
best of sweeps on an H200, each variant the whole graphed step, timed in interleaved
rounds (the probe `probe_roof.py` of commit f9a1975; scripts/probes/NOTES-triton.md has
its runs).

A kernel's best tiling depends on what runs beside it. Alone, or chained with other
products and nothing else, 8 warps a program stream best (`alone_configs`); inside the
step, smaller programs of 4 warps won for every BF16 matrix (`default_configs`): the
step took 0.75 ms against 0.88 with the tiling that is best alone (probes of 2026-12-01,
at a context of 192 slots).
"""

from __future__ import annotations

import triton

from gpuinfer.kernels.gemv import GemvConfig

GEMVS = ("qkv", "o", "gate_up", "down", "lm_head")
PAIRED = ("qkv", "gate_up")  # tiled in pairs of rows: their fused epilogues need both
WEIGHTS = ("bf16", "int8")
ONE_PROGRAM_CONTEXT = 256  # slots: a cache this small gets one attention program a head
SHORT_CONTEXT = 2048  # slots: a cache this small gets attention's narrow split


def alone_configs(gpu: bool) -> dict[str, GemvConfig]:
    """The products' tiling when they run alone or chained (block_n in pairs for qkv
    and gate_up): 8 rows of 2048 (32 KB of BF16) per program, 8 warps, loaded as one
    tile before the PDL wait; 4 rows for gate_up. Interpreted: few, large programs,
    since each program is a Python call."""
    if gpu:
        return {"qkv": GemvConfig(4, 2048, 1, 8), "o": GemvConfig(8, 2048, 1, 8),
                "gate_up": GemvConfig(2, 2048, 1, 4), "down": GemvConfig(8, 2048, 1, 8),
                "lm_head": GemvConfig(8, 2048, 1, 8)}
    return {name: GemvConfig(256, 4096) for name in GEMVS}


def default_configs(gpu: bool, weights: str = "bf16") -> dict[str, GemvConfig]:
    """The products' tiling inside the decode step, for BF16 or int8 weights: programs
    of 4 warps, and narrow tiles for gate/up (512 columns: the first is loaded before
    the PDL wait, the others after), which the sweeps kept
    narrowing while the step got faster. With int8 weights (swept again once they were
    widened through their bits, 2026-12-02): the q/k/v rows in one tile of all 2048
    columns, o and down with 8 warps, twice the rows in a program of gate/up and of the
    lm_head."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: one of {WEIGHTS}")
    if not gpu:
        return alone_configs(gpu)
    if weights == "int8":
        return {"qkv": GemvConfig(4, 2048, 1, 4), "o": GemvConfig(8, 2048, 1, 8),
                "gate_up": GemvConfig(8, 512, 1, 4), "down": GemvConfig(8, 2048, 1, 8),
                "lm_head": GemvConfig(16, 1024, 1, 4)}
    return {"qkv": GemvConfig(4, 1024, 1, 4), "o": GemvConfig(8, 2048, 1, 4),
            "gate_up": GemvConfig(4, 512, 1, 4), "down": GemvConfig(8, 2048, 1, 4),
            "lm_head": GemvConfig(8, 2048, 1, 4)}


PASS_TILE = 16384  # weights a program holds through a pass: 32 KB of BF16


def pass_configs(config, gpu: bool, weights: str = "bf16") -> dict[str, GemvConfig]:
    """The products' tiling for passes of several tokens (a verify pass), for a model of
    `config` (a transformers LlamaConfig): `default_configs` with every matrix in one
    tile of all its columns, as few rows as keep the tile within PASS_TILE weights.
    A pass multiplies each tile by every token's x while the tile is in registers
    (`tile.rows_dots`); a second tile would be read again for every token. On the
    H200 the target of Chapter 6 took 538 µs a pass of 5 tokens with it, 673 with the
    step's tiling (whose gate/up and down take two tiles), and 288 µs a step against
    256 (probe spec_trace.py, 2026-12-04): a tiling for passes, not for steps."""
    head_dim = getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads
    ks = {"qkv": config.hidden_size, "o": config.num_attention_heads * head_dim,
          "gate_up": config.hidden_size, "down": config.intermediate_size,
          "lm_head": config.hidden_size}
    out = {}
    for name, c in default_configs(gpu, weights).items():
        block_k = triton.next_power_of_2(ks[name])
        per_out = 2 if name in PAIRED else 1
        rows = max(1, PASS_TILE // (block_k * per_out))
        out[name] = GemvConfig(min(c.block_n, triton.next_power_of_2(rows)), block_k,
                               1, c.num_warps)
    return out


def default_attention(gpu: bool, capacity: int = SHORT_CONTEXT) -> dict:
    """decode_attention's tiling for a cache of `capacity` slots. The split is fixed
    when a step is captured, so it is chosen for the longest context the cache holds:
    up to ONE_PROGRAM_CONTEXT slots, no split: one program of 8 warps per key/value
    head loads every slot in one tile before its PDL wait and writes the head's output
    itself, with no partials to combine (the 1B step at 256 slots: 730 µs against 754
    with the split below, 2026-12-04); up to SHORT_CONTEXT slots, 16 chunks per head of
    64-slot tiles, 2 warps (the fewest programs that waiting on costs least); beyond,
    64 chunks of 128-slot tiles, 4 warps, so that a long context spreads over 512
    programs. Interpreted: one chunk per head."""
    if not gpu:
        return {"n_split": 1, "block_s": 64, "num_warps": 4}
    if capacity <= ONE_PROGRAM_CONTEXT:
        return {"n_split": 1, "block_s": max(16, triton.next_power_of_2(capacity)),
                "num_warps": 8}
    if capacity <= SHORT_CONTEXT:
        return {"n_split": 16, "block_s": 64, "num_warps": 2}
    return {"n_split": 64, "block_s": 128, "num_warps": 4}
