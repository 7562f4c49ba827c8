"""Decode attention at batch 1: one query per head over the cache slots 0..pos (a pass
of T tokens: grid axis 2 is the token, each token's programs those of a step at its own
slot, the pass's slots before it loaded after the PDL wait).

Split-KV ("flash-decoding"): program (h, s) takes key/value head h with all of its
`group` query heads at once (grouped-query attention: the keys and values are read
once, not once per query head) and the s-th of `n_split` chunks of the slots 0..pos.
The chunk length follows pos (a multiple of `block_s`), so the same launch, captured
once in a CUDA graph, serves any context: from `n_split * block_s` slots on, every
program of a head has a chunk; below that, only the first ceil((pos + 1) / block_s) do
(4 of 32 at 256 slots), and the others exit: they write nothing and the combine reads
only the partials of the splits that had slots. So one wide split serves short contexts
and long ones. Each program runs the
online softmax over its chunk, both products on the tensor cores (the group's few
queries padded to the 16 rows tl.dot needs), and writes a partial (max, sum, weighted
values); the partials of a head are then combined:

- inline (default): the last program of head h to finish combines its head's
  partials (`arrive`): no second kernel;
- or by `attention_combine_kernel`, one program per head, launched after;
- or not at all: with `n_split` 1 a head's one program has every slot and writes its
  output itself, no partial, atomic or second read on the way to the o-projection
  (`tiling.default_attention` picks it for a cache of a few hundred slots, in one tile
  of `block_s` >= the capacity, all of it loaded before the PDL wait).

Under PDL a program loads its chunk's first tile of keys and values *before* waiting for
the q/k/v kernel: the slots before pos were written by earlier steps, and only slot pos,
the newest, is then patched in from what that kernel wrote.

The loop over a chunk is a while loop: its bounds depend on pos, a tensor, and
Triton's interpreter cannot iterate a range over tensor bounds.

pos is read unchecked (a CUDA graph's replay runs whatever it holds): the slots seen are
clamped to 1..capacity (`slots_seen`), so that no call reads past the cache; past it,
it attends to every slot, as at the last one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import (INTERPRETED, arrive, check_pow2, launch_options,
                                     pdl_wait, round_to)
from gpuinfer.kernels.gemv import pass_outputs


@triton.jit
def chunk_of(n, N_SPLIT: tl.constexpr, BLOCK_S: tl.constexpr):
    """Slots per split for a context of n slots: a multiple of BLOCK_S, so that only the
    first cdiv(n, chunk) splits have any."""
    return tl.cdiv(tl.cdiv(n, N_SPLIT), BLOCK_S) * BLOCK_S


@triton.jit
def slots_seen(pos, capacity):
    """The slots 0..pos of a cache of `capacity`, clamped: at least slot 0, at most all
    of them. One scalar min and max a program: what keeps a replay at a pos past the
    cache (which the decoder refuses on the host) from reading past it."""
    return tl.minimum(tl.maximum(pos + 1, 1), capacity)


@triton.jit
def kv_tile(k_ptr, v_ptr, base, start, end, d, BLOCK_S: tl.constexpr,
            HEAD_DIM: tl.constexpr, CACHE: tl.constexpr):
    """The tile of slots start... of a head's keys and values (those from `end` on
    read as 0), its loads with the cache modifier CACHE ("": the default, ".cg": at
    L2, for slots another program of this grid has just written)."""
    slots = start + tl.arange(0, BLOCK_S)
    at = base + slots[:, None] * HEAD_DIM + d[None, :]
    mask = (slots < end)[:, None]
    k = tl.load(k_ptr + at, mask=mask, other=0.0, cache_modifier=CACHE)
    v = tl.load(v_ptr + at, mask=mask, other=0.0, cache_modifier=CACHE)
    return slots, k, v


@triton.jit
def softmax_tile(q, k, v, valid, m, l, acc, scale, dt: tl.constexpr,
                 UPCAST: tl.constexpr):
    """The online softmax over one tile: q (GROUP_PAD, HEAD_DIM) against the tile's
    keys and values (the slots not `valid` weigh 0); the running max m, sum l and
    weighted values acc, in FP32, carried to the next tile. dt: the cache's dtype, to
    which p is rounded for the second product, as flash attention does. UPCAST: FP32
    products in IEEE precision (no TF32), for FP32 caches, and under the interpreter,
    whose tl.dot cannot multiply BF16 (numpy has no BF16)."""
    PRECISION: tl.constexpr = "ieee" if UPCAST else "tf32"
    kt, vt = k, v
    if UPCAST:
        kt = k.to(tl.float32)
        vt = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * scale
    scores = tl.where(valid[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(scores - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    pv = tl.dot(round_to(p, dt).to(vt.dtype), vt, input_precision=PRECISION)
    acc = acc * alpha[:, None] + pv
    return m_new, l, acc


@triton.jit
def online_softmax(q, k, v, slots, start, end, k_ptr, v_ptr, base, d, scale,
                   BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr,
                   CACHE: tl.constexpr):
    """The softmax-weighted values of the slots start..end of one key/value head for
    the queries q (GROUP_PAD, HEAD_DIM), tile by tile: k, v the first tile (of `slots`),
    already loaded; each next one loaded with CACHE (`kv_tile`). Returns the running
    max m, sum l and weighted values acc (FP32), to divide or to combine."""
    GROUP_PAD: tl.constexpr = q.shape[0]
    dt = q.dtype
    if UPCAST:  # FP32 products (`softmax_tile`)
        q = q.to(tl.float32)
    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    l = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
    while start < end:  # a while loop: the bounds are tensors (see the module's notes)
        m, l, acc = softmax_tile(q, k, v, slots < end, m, l, acc, scale, dt, UPCAST)
        start += BLOCK_S  # the next tile (none past the end)
        slots, k, v = kv_tile(k_ptr, v_ptr, base, start, end, d, BLOCK_S, HEAD_DIM,
                              CACHE)
    return m, l, acc


@triton.jit
def pass_token(pos, t, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
               N_SPLIT: tl.constexpr, ROWS: tl.constexpr):
    """Token t of a pass of ROWS tokens, grid axis 0 the key/value heads: its slot
    (pos - ROWS + 1 + t), the offset of its row of q and of o (heads * HEAD_DIM
    elements a token), and that of its partials (a row of HEAD_DIM + 2 for each query
    head of each split)."""
    heads = tl.num_programs(0)
    return (pos - (ROWS - 1) + t, t * heads * GROUP * HEAD_DIM,
            t * heads * N_SPLIT * GROUP * (HEAD_DIM + 2))


@triton.jit
def combine_head(part_ptr, o_ptr, h, active, GROUP: tl.constexpr,
                 HEAD_DIM: tl.constexpr, N_SPLIT: tl.constexpr):
    """o of head h's query heads from the partials of its first `active` splits (the
    non-empty ones), in split order, in FP32."""
    ROW: tl.constexpr = HEAD_DIM + 2  # a partial row: acc[0:HEAD_DIM], max, sum
    # Any group (Llama-3.2-3B's is 3): its axis padded to a power of two, as tl.arange
    # needs. A padded head re-reads the last real one, so it stays in bounds and finite
    # (an all-masked head would be 0 / 0 = NaN), and it is never stored.
    GROUP_P2: tl.constexpr = triton.next_power_of_2(GROUP)
    s = tl.arange(0, N_SPLIT)[:, None]
    g = tl.arange(0, GROUP_P2)[None, :]
    if GROUP_P2 != GROUP:  # a power of two compiles as before, without the min
        g = tl.minimum(g, GROUP - 1)
    row = ((h * N_SPLIT + s) * GROUP + g) * ROW  # (N_SPLIT, GROUP_P2)
    written = s < active
    m = tl.load(part_ptr + row + HEAD_DIM, mask=written, other=float("-inf"),
                cache_modifier=".cg")
    l = tl.load(part_ptr + row + HEAD_DIM + 1, mask=written, other=0.0,
                cache_modifier=".cg")
    m_max = tl.max(m, axis=0)  # finite: split 0 always holds slot 0
    scale = tl.exp(m - m_max[None, :])  # 0 for the splits never written
    total = tl.sum(l * scale, axis=0)
    d = tl.arange(0, HEAD_DIM)[None, None, :]
    acc = tl.load(part_ptr + row[:, :, None] + d, mask=written[:, :, None], other=0.0,
                  cache_modifier=".cg")
    o = tl.sum(acc * scale[:, :, None], axis=0) / total[:, None]  # (GROUP_P2, HEAD_DIM)
    dd = tl.arange(0, HEAD_DIM)[None, :]
    g = tl.arange(0, GROUP_P2)[:, None]
    out = o_ptr + (h * GROUP + g) * HEAD_DIM + dd
    dt = o_ptr.dtype.element_ty
    # round_to: the interpreter truncates to BF16
    tl.store(out, round_to(o, dt).to(dt), mask=g < GROUP)


@triton.jit
def attention_partial_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, o_ptr, cnt_ptr,
                             cache_head_stride, scale,
                             GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                             HEAD_DIM: tl.constexpr, N_SPLIT: tl.constexpr,
                             BLOCK_S: tl.constexpr, UPCAST: tl.constexpr,
                             INLINE_COMBINE: tl.constexpr, PDL: tl.constexpr,
                             ROWS: tl.constexpr):
    h = tl.program_id(0)
    s = tl.program_id(1)
    # Before the PDL wait, what no kernel of this layer writes: pos (the previous step's
    # last kernel wrote it, and that kernel has finished before the one before this
    # launched us; .cg reads it at L2) and the cached slots before pos.
    capacity = cache_head_stride // HEAD_DIM  # a shift: HEAD_DIM is a power of two
    pos = tl.load(pos_ptr, cache_modifier=".cg")
    fresh = 0  # the pass's slots before this token's own (a step: none)
    if ROWS > 1:  # token t of a pass (pos - ROWS + 1 + t): the step's program at its slot
        t = tl.program_id(2)
        fresh = t
        pos, token_at, partials_at = pass_token(pos, t, GROUP, HEAD_DIM, N_SPLIT, ROWS)
        q_ptr += token_at
        o_ptr += token_at
        part_ptr += partials_at
        cnt_ptr += t * tl.num_programs(0)
    n = slots_seen(pos, capacity)  # slots 0..pos
    chunk = chunk_of(n, N_SPLIT, BLOCK_S)
    start = s * chunk
    end = tl.minimum(start + chunk, n)
    d = tl.arange(0, HEAD_DIM)
    base = h.to(tl.int64) * cache_head_stride
    slots = start + tl.arange(0, BLOCK_S)
    at = base + slots[:, None] * HEAD_DIM + d[None, :]
    old = (slots < end) & (slots < n - 1 - fresh)
    k = tl.load(k_ptr + at, mask=old[:, None], other=0.0)
    v = tl.load(v_ptr + at, mask=old[:, None], other=0.0)
    pdl_wait(PDL)  # q and the newest keys and values (this pass's) come from qkv
    for i in tl.static_range(ROWS):  # slot n - 1 - i, if it is the pass's
        newest = slots == n - 1 - i  # in this first tile, or nowhere in it
        has_newest = (n - 1 - i >= start) & (n - 1 - i < start + BLOCK_S) & (i <= fresh)
        at_newest = base + (n - 1 - i) * HEAD_DIM + d
        k_new = tl.load(k_ptr + at_newest, mask=has_newest)
        v_new = tl.load(v_ptr + at_newest, mask=has_newest)
        k = tl.where(newest[:, None] & has_newest, k_new[None, :], k)
        v = tl.where(newest[:, None] & has_newest, v_new[None, :], v)
    # The group's queries padded with rows of zeros to GROUP_PAD, a power of two >= 16
    # (the least tl.dot takes), whatever the group: both products run on the tensor
    # cores, and the padding costs no memory (masked loads and stores).
    g = tl.arange(0, GROUP_PAD)
    q = tl.load(q_ptr + (h * GROUP + g)[:, None] * HEAD_DIM + d[None, :],
                mask=(g < GROUP)[:, None], other=0.0)
    # k, v: the tile of slots start.., loaded before the PDL wait
    m, l, acc = online_softmax(q, k, v, slots, start, end, k_ptr, v_ptr, base, d, scale,
                               BLOCK_S, HEAD_DIM, UPCAST, "")
    if N_SPLIT == 1:  # one program per head saw every slot: nothing to combine
        o = acc / l[:, None]  # what combine_head makes of a single partial
        out = o_ptr + (h * GROUP + g)[:, None] * HEAD_DIM + d[None, :]
        do = o_ptr.dtype.element_ty
        tl.store(out, round_to(o, do).to(do), mask=(g < GROUP)[:, None])
    # A split past the context writes nothing and is not waited for: at a short context
    # a wide split costs only programs that exit, not a longer combine.
    elif s * chunk < n:
        active = tl.cdiv(n, chunk)
        ROW: tl.constexpr = HEAD_DIM + 2
        row = part_ptr + ((h * N_SPLIT + s) * GROUP + g) * ROW
        real = g < GROUP
        tl.store(row[:, None] + d[None, :], acc, mask=real[:, None])
        tl.store(row + HEAD_DIM, m, mask=real)
        tl.store(row + HEAD_DIM + 1, l, mask=real)
        if INLINE_COMBINE:
            if arrive(cnt_ptr + h, active):
                combine_head(part_ptr, o_ptr, h, active, GROUP, HEAD_DIM, N_SPLIT)


@triton.jit
def attention_combine_kernel(part_ptr, o_ptr, pos_ptr, capacity, GROUP: tl.constexpr,
                             HEAD_DIM: tl.constexpr, N_SPLIT: tl.constexpr,
                             BLOCK_S: tl.constexpr, PDL: tl.constexpr,
                             ROWS: tl.constexpr):
    pdl_wait(PDL)
    pos = tl.load(pos_ptr)
    if ROWS > 1:  # token t of a pass, as the partials' kernel offset it
        pos, token_at, partials_at = pass_token(pos, tl.program_id(1), GROUP, HEAD_DIM,
                                                N_SPLIT, ROWS)
        o_ptr += token_at
        part_ptr += partials_at
    n = slots_seen(pos, capacity)  # as the partials' kernel saw them
    active = tl.cdiv(n, chunk_of(n, N_SPLIT, BLOCK_S))
    combine_head(part_ptr, o_ptr, tl.program_id(0), active, GROUP, HEAD_DIM, N_SPLIT)


class AttentionWorkspace:
    """The partials (rows, kv_heads, n_split, group, head_dim + 2) FP32 and the per-head
    arrival counters of the inline combine, allocated once, for passes of up to `rows`
    tokens. Any group: the kernels' padded heads are never stored."""

    def __init__(self, device, n_kv: int, group: int, head_dim: int, n_split: int,
                 rows: int = 1):
        self.n_split, self.rows = n_split, rows
        self.partials = torch.empty(rows * n_kv * n_split * group * (head_dim + 2),
                                    device=device, dtype=torch.float32)
        self.counters = torch.zeros(rows * n_kv, device=device, dtype=torch.int32)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     pos: torch.Tensor, out: torch.Tensor | None = None, *,
                     n_split: int = 16, block_s: int = 64, num_warps: int = 4,
                     num_stages: int = 1, inline_combine: bool = True,
                     pdl: bool = False,
                     workspace: AttentionWorkspace | None = None) -> torch.Tensor:
    """Attention of q (heads * d,) on slots 0..pos of k_cache, v_cache (kv_heads,
    capacity, d); pos a one-element tensor (past the cache: all its slots, below 0:
    slot 0). Returns (heads * d,) in q's dtype. q (T, heads * d): a pass of T tokens at
    slots pos - T + 1 ... pos, each over the slots up to its own, in programs of its
    own (grid axis 2), each the step's program at its slot; returns (T, heads * d).
    `out`, if given, has q's shape, or is refused before any launch."""
    n_kv, capacity, head_dim = k_cache.shape
    rows = 1 if q.dim() == 1 else q.shape[0]
    group = q.shape[-1] // (n_kv * head_dim)
    check_pow2(head_dim=head_dim, n_split=n_split, block_s=block_s)  # not group: padded
    if head_dim < 16 or block_s < 16:
        raise ValueError("tl.dot needs head_dim >= 16 and block_s >= 16")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and q.is_contiguous()):
        raise ValueError("q and the cache must be contiguous")
    pass_outputs(q, q.shape[-1], q.shape[-1], out=out)  # out: q's shape, or refused
    out = torch.empty_like(q) if out is None else out
    ws = workspace or AttentionWorkspace(q.device, n_kv, group, head_dim, n_split, rows)
    if ws.n_split != n_split or ws.counters.numel() < rows * n_kv:
        raise ValueError(f"the workspace was made for another n_split, head count or "
                         f"number of tokens ({ws.rows}, not {rows})")
    attention_partial_kernel[(n_kv, n_split, rows)](
        q, k_cache, v_cache, pos, ws.partials, out, ws.counters,
        capacity * head_dim, head_dim**-0.5,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, N_SPLIT=n_split,
        BLOCK_S=block_s, UPCAST=INTERPRETED or q.dtype == torch.float32,
        INLINE_COMBINE=inline_combine, PDL=pdl, ROWS=rows,
        **launch_options(num_warps, num_stages, pdl))
    if not inline_combine and n_split > 1:  # one split writes o itself
        attention_combine_kernel[(n_kv, rows)](
            ws.partials, out, pos, capacity, GROUP=group, HEAD_DIM=head_dim,
            N_SPLIT=n_split, BLOCK_S=block_s, PDL=pdl, ROWS=rows,
            **launch_options(num_warps, 1, pdl))
    return out


def decode_attention_reference(q, k_cache, v_cache, pos: int) -> torch.Tensor:
    """Softmax(q k^T / sqrt(d)) v over slots 0..pos in FP32, query head j on key/value
    head j // group as transformers pairs them; (heads * d,) in q's dtype."""
    n_kv, _, head_dim = k_cache.shape
    group = q.numel() // (n_kv * head_dim)
    qf = q.float().view(n_kv, group, head_dim)
    keys = k_cache[:, : pos + 1].float()
    values = v_cache[:, : pos + 1].float()
    scores = qf @ keys.transpose(1, 2) * head_dim**-0.5  # (kv, group, slots)
    return (scores.softmax(-1) @ values).reshape(-1).to(q.dtype)
