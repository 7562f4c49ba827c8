"""Attention of a pass of T tokens in a few programs per key/value head, each reading
the cache once for several tokens (`decode_attention` gives each token programs of its
own, each reading the cache).

A pass of T tokens at slots f, f + 1, ..., pos (f = pos - T + 1): token t attends to
the slots 0 ... f + t. The programs of key/value head h take its `group` query heads
for the T tokens, T * group rows of queries (a row a token and query head), 16 rows a
program, the fewest tl.dot takes: at a group of 4, four tokens a program, so a pass of
up to 4 tokens reads the cache once, as the step does, and one of 5 to 8 twice, in
programs that run side by side (a program's score tile stays 16 rows by the cache, and
nothing spills, FP32 included). Each program:

- before the PDL wait, the slots before f (no kernel of this layer writes them) in one
  tile of `block_s` >= the capacity, as the step's one-program attention loads them;
- after it, the pass's own T slots (the q/k/v kernel has just written them) in a
  second tile of 16 rows;
- both tiles' scores in one online softmax: each row sees every slot of the first tile
  and, of the second, the slots up to its token's own (causal within the pass).

This is `decode_attention`'s one-split form (a cache of up to ONE_PROGRAM_CONTEXT
slots, `tiling.default_attention`) for a pass; it sums in another order (two products
instead of one), so its output is the per-token launch's within rounding, not to the
bit. pos is read unchecked, as there: every row sees slot 0 at least, and no slot past
the cache is read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.attention import slots_seen
from gpuinfer.kernels.common import (INTERPRETED, check_pow2, launch_options,
                                     pdl_launch_next, pdl_wait_only, round_to)

FRESH = 16  # the second tile's rows: the pass's own slots, at most 16 tokens a pass


@triton.jit
def pass_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, cache_head_stride, scale,
                          GROUP: tl.constexpr, TOKENS: tl.constexpr,
                          BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_S: tl.constexpr, FRESH: tl.constexpr,
                          UPCAST: tl.constexpr, PDL: tl.constexpr):
    h = tl.program_id(0)
    capacity = cache_head_stride // HEAD_DIM
    # pos below 0 (unchecked) as 0: the pass's slots then hold slot 0, which every row
    # sees, so no row is all masked (0 / 0)
    pos = tl.maximum(tl.load(pos_ptr, cache_modifier=".cg"), 0)
    first = pos - (TOKENS - 1)  # the pass's first slot
    d = tl.arange(0, HEAD_DIM)
    base = h.to(tl.int64) * cache_head_stride
    # Before the wait: the slots before the pass's, which earlier steps wrote.
    slots = tl.arange(0, BLOCK_S)
    old = (slots < first) & (slots < capacity)
    at = base + slots[:, None] * HEAD_DIM + d[None, :]
    k = tl.load(k_ptr + at, mask=old[:, None], other=0.0)
    v = tl.load(v_ptr + at, mask=old[:, None], other=0.0)
    # The o product launches first and loads its weights while this program waits:
    # a 2-token pass 0.11 steps faster on an H100. (The step's attention does not:
    # there it made the 1B step 1.3 % slower.)
    pdl_launch_next(PDL)
    pdl_wait_only(PDL)  # q and the pass's keys and values come from the q/k/v kernel
    j = tl.arange(0, FRESH)
    fresh_slot = first + j
    fresh = (j < TOKENS) & (fresh_slot >= 0) & (fresh_slot < capacity)
    at_fresh = base + fresh_slot[:, None] * HEAD_DIM + d[None, :]
    k_new = tl.load(k_ptr + at_fresh, mask=fresh[:, None], other=0.0)
    v_new = tl.load(v_ptr + at_fresh, mask=fresh[:, None], other=0.0)
    # Row r: token r // GROUP, query head h * GROUP + r % GROUP; this program takes rows
    # BLOCK_R * c ...; rows past the pass's are zeros, never stored.
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = r // GROUP
    real = r < TOKENS * GROUP
    heads = tl.num_programs(0) * GROUP
    row_at = (t * heads + h * GROUP + r % GROUP)[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + row_at, mask=real[:, None], other=0.0)
    dt = q.dtype
    PRECISION: tl.constexpr = "ieee" if UPCAST else "tf32"
    if UPCAST:  # FP32 caches, and the interpreter, whose tl.dot has no BF16
        q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
        k_new, v_new = k_new.to(tl.float32), v_new.to(tl.float32)
    # Token t sees slots 0 ... first + t, clamped as a step's are: at least slot 0, at
    # most the whole cache.
    seen = slots_seen(first + t, capacity)[:, None]
    s_old = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    s_old = tl.where(old[None, :] & (slots[None, :] < seen), s_old, float("-inf"))
    s_new = tl.dot(q, tl.trans(k_new), input_precision=PRECISION) * scale
    s_new = tl.where(fresh[None, :] & (fresh_slot[None, :] < seen), s_new,
                     float("-inf"))
    m = tl.maximum(tl.max(s_old, axis=1), tl.max(s_new, axis=1))  # finite: slot 0
    p_old = tl.exp(s_old - m[:, None])
    p_new = tl.exp(s_new - m[:, None])
    total = tl.sum(p_old, axis=1) + tl.sum(p_new, axis=1)
    # p rounded to the cache's dtype for the second products, as the step's kernel does
    acc = tl.dot(round_to(p_old, dt).to(v.dtype), v, input_precision=PRECISION)
    acc += tl.dot(round_to(p_new, dt).to(v_new.dtype), v_new, input_precision=PRECISION)
    o = acc / total[:, None]
    do = o_ptr.dtype.element_ty
    tl.store(o_ptr + row_at, round_to(o, do).to(do), mask=real[:, None])


def pass_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   pos: torch.Tensor, out: torch.Tensor | None = None, *,
                   block_s: int | None = None, block_r: int = 16, num_warps: int = 8,
                   pdl: bool = False) -> torch.Tensor:
    """Attention of a pass: q (T, heads * d), T <= 16, the tokens at slots
    pos - T + 1 ... pos of k_cache, v_cache (kv_heads, capacity, d), each over the
    slots up to its own; pos a one-element tensor. Returns (T, heads * d) in q's dtype.
    Programs per key/value head: one per `block_r` rows of queries (a row a token and
    query head; 16, the fewest tl.dot takes, is 4 tokens of a group of 4), each
    reading the whole cache; `block_s` (default: the capacity, rounded up to a power
    of two) must hold it."""
    n_kv, capacity, head_dim = k_cache.shape
    if q.dim() != 2 or not 1 <= q.shape[0] <= FRESH:
        raise ValueError(f"q of shape {tuple(q.shape)}: a pass is (T, heads * d) with "
                         f"1 <= T <= {FRESH}")
    tokens = q.shape[0]
    if q.shape[1] % (n_kv * head_dim) or q.shape[1] == 0:
        raise ValueError(f"q of {q.shape[1]} columns for {n_kv} key/value heads of "
                         f"{head_dim}: a whole number of query heads per key/value head")
    group = q.shape[1] // (n_kv * head_dim)
    block_s = block_s or max(16, triton.next_power_of_2(capacity))
    check_pow2(head_dim=head_dim, block_s=block_s, block_r=block_r)
    if block_r < 16:
        raise ValueError(f"block_r={block_r}: tl.dot takes at least 16 rows")
    if head_dim < 16 or block_s < capacity:
        raise ValueError(f"block_s={block_s} for a cache of {capacity} slots of "
                         f"head_dim {head_dim}: one tile holds the whole cache "
                         "(block_s >= capacity) and head_dim >= 16; for longer caches "
                         "use attention.decode_attention")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and q.is_contiguous()):
        raise ValueError("q and the cache must be contiguous")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype
                            or not out.is_contiguous()):
        raise ValueError(f"out of shape {tuple(out.shape)} ({out.dtype}) for q of "
                         f"{tuple(q.shape)} ({q.dtype}): they must match, contiguous")
    out = torch.empty_like(q) if out is None else out
    pass_attention_kernel[(n_kv, triton.cdiv(tokens * group, block_r))](
        q, k_cache, v_cache, pos, out, capacity * head_dim, head_dim**-0.5,
        GROUP=group, TOKENS=tokens, BLOCK_R=block_r, HEAD_DIM=head_dim,
        BLOCK_S=block_s, FRESH=FRESH, UPCAST=INTERPRETED or q.dtype == torch.float32,
        PDL=pdl, **launch_options(num_warps, 1, pdl))
    return out
