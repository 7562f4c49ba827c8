"""q/k/v + rotary + attention of one token in ONE kernel (issue 58, item 2a), not yet used
by a chapter: the step's `qkv_rope` and `decode_attention` (one program per key/value
head, `tiling.ONE_PROGRAM_CONTEXT`) without the kernel boundary between them.

The grid holds two kinds of programs:

- producers: each computes BLOCK_N (row, row + head_dim/2) pairs of ONE head of the
  stacked q/k/v matrix, as `qkv_rope` does (weight tile prefetched before the PDL wait,
  RMSNorm prologue, rotary epilogue), and writes them: a query head's rows to `q`, a key
  or value head's rows to slot pos of the cache. Then it counts itself in on its key/value
  head's counter (a barrier, then an atomic add with release semantics at GPU scope).
  Key/value head h has PER_HEAD = (group + 2) * head_dim / 2 / BLOCK_N producers: those
  of its group's query heads, of its key head and of its value head.
- consumers, one per key/value head: loads the head's cached keys and values of the
  slots before pos (written by earlier steps) before the PDL wait, waits until its
  head's counter reaches PER_HEAD (every thread polls it with `ld.acquire.gpu`, the loop
  ends when all of them saw it: a reduction over the program), sets it back to 0 for
  the next launch, then reads its group's queries and the new slot (`.cg`, at L2) and
  runs the attention of `decode_attention` with one split, writing its group's output.

No program waits for the whole grid, only a consumer for its own head's producers: the
grid-wide wait of a persistent kernel cost 1.3-3.7 us (scripts/probes/NOTES-46.md), a
kernel boundary 0.66-0.78 us; a head's wait is narrower than both.

Deadlock freedom rests on one ASSUMPTION: the GPU dispatches a grid's programs in the
order of their ids (true of NVIDIA's block scheduler in practice, not promised by CUDA).
Every producer has a lower id than its consumer: the producers come first, ordered
key/value head by key/value head, and the consumers after all of them (`interleave`
False) or each right after its own head's producers (`interleave` True). When a
consumer is dispatched, all its producers have been dispatched already, so they run to
completion whatever the consumer holds while it polls. Triton's interpreter runs the
programs one after another in id order: there a consumer finds its count complete (it
reads the counter once, and writes NaN unless it holds exactly its head's count: a
short count, or one not reset by the launch before, fails the tests). With PDL every
program (consumers before they poll) lets the next kernel launch; that happens only
when all of this grid's programs have done so, i.e. when all are resident, so the next
kernel's programs never take a slot a producer needs.

The counters are reset by their consumer, not counted up by an epoch: when a consumer
sees PER_HEAD, every producer of its head has added (nothing more will this launch), so
its store of 0 races with nothing; the next launch that uses the counters (the next
layer, or the next replay) adds only after its PDL wait, when this grid has finished.
An epoch derived from pos would break where one pos is replayed (every benchmark does,
and all layers of a step share one pos); counters start at 0 (`common.Workspace`) and
every launch leaves them at 0.

pos is read unchecked, as `qkv_rope` and `decode_attention` read it: outside the cache
nothing is written and the attention sees the clamped slots (`attention.slots_seen`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.attention import (decode_attention_reference, online_softmax,
                                        slots_seen)
from gpuinfer.kernels.common import (INTERPRETED, Workspace, check_pow2, launch_options,
                                     pdl_wait, round_to)
from gpuinfer.kernels.gemv import GemvConfig, pass_outputs, tokens_of
from gpuinfer.kernels.qkv_rope import qkv_rope_reference
from gpuinfer.kernels.tile import INTERPRET, prefetch, rows_dot
from gpuinfer.model.quant import Int8Matrix, unpack


@triton.jit
def acquire_load(ptrs):
    """ld.acquire.gpu of each pointer (int32): loads after it see what the releases it
    read from published."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                                     [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_count(cnt_ptr, expected, THREADS: tl.constexpr):
    """Poll *cnt_ptr until it reaches `expected`, each thread with its own acquire load;
    returns when every thread of the program has seen it (the loop's condition is a
    reduction over the program, so all threads leave it together). Interpreted: one
    plain read (the programs run in id order: the producers have run)."""
    lane = tl.arange(0, THREADS)
    if INTERPRET:
        seen = tl.load(cnt_ptr + lane * 0)
    else:
        seen = acquire_load(cnt_ptr + lane * 0)
        while tl.min(seen, axis=0) < expected:
            seen = acquire_load(cnt_ptr + lane * 0)
    return tl.min(seen, axis=0)


@triton.jit
def produce(w_ptr, scale_ptr, x_ptr, norm_ptr, q_ptr, k_cache_ptr, v_cache_ptr, cos_ptr,
            sin_ptr, pos_ptr, cnt_ptr, h, j, K, stride_w, eps, cache_head_stride,
            N_HEADS: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
            NORM: tl.constexpr, SCALED: tl.constexpr, K_NORM: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
            PDL: tl.constexpr):
    """Producer j of key/value head h: pairs j * BLOCK_N ... of the head's group's query
    heads, then its key head, then its value head (all within one head: BLOCK_N <=
    HEAD_DIM / 2), as `qkv_rope_kernel` computes them at one token, one split; then
    counted in on h's counter."""
    HALF: tl.constexpr = HEAD_DIM // 2
    GROUP: tl.constexpr = N_HEADS // N_KV
    local = (j * BLOCK_N) // HALF  # 0 ... GROUP + 1: a query head, the key, the value
    offset = (j * BLOCK_N) % HALF
    head = tl.where(local < GROUP, h * GROUP + local,  # its head in the stacked matrix
                    tl.where(local == GROUP, N_HEADS + h, N_HEADS + N_KV + h))
    r = tl.arange(0, 2 * BLOCK_N)
    rows = head * HEAD_DIM + offset + r // 2 + (r % 2) * HALF
    row_mask = r < 2 * BLOCK_N
    w, g, s = prefetch(w_ptr, stride_w, rows, row_mask, 0, K, norm_ptr, scale_ptr, NORM,
                       SCALED, BLOCK_K)
    pdl_wait(PDL)
    d = offset + tl.arange(0, BLOCK_N)
    pos = tl.load(pos_ptr)
    in_cache = (pos >= 0) & (pos * HEAD_DIM < cache_head_stride)
    pos = tl.where(in_cache, pos, 0)  # the tables' row and the slot stay in bounds
    table = pos * HEAD_DIM + d
    cos_lo = tl.load(cos_ptr + table).to(tl.float32)
    cos_hi = tl.load(cos_ptr + table + HALF).to(tl.float32)
    sin_lo = tl.load(sin_ptr + table).to(tl.float32)
    sin_hi = tl.load(sin_ptr + table + HALF).to(tl.float32)
    y = rows_dot(w, g, s, w_ptr, stride_w, rows, row_mask, x_ptr, K, 0, K, norm_ptr, eps,
                 NORM, SCALED, K_NORM, BLOCK_K, N_TILES, True)
    dt = q_ptr.dtype.element_ty
    lo, hi = tl.split(tl.reshape(y, (BLOCK_N, 2)))  # dimensions d and d + HALF
    lo = round_to(lo, dt)  # F.linear's output in the activations' dtype
    hi = round_to(hi, dt)
    # q * cos + rotate_half(q) * sin, each product and the sum rounded as in PyTorch
    rot_lo = round_to(round_to(lo * cos_lo, dt) + round_to(-hi * sin_lo, dt), dt)
    rot_hi = round_to(round_to(hi * cos_hi, dt) + round_to(lo * sin_hi, dt), dt)
    rotary = local <= GROUP  # queries and the key, not the value
    lo = tl.where(rotary, rot_lo, lo).to(dt)
    hi = tl.where(rotary, rot_hi, hi).to(dt)
    which = local + d * 0  # the scalar as a vector: the stores' masks
    q_at = q_ptr + head * HEAD_DIM + d
    tl.store(q_at, lo, mask=which < GROUP)
    tl.store(q_at + HALF, hi, mask=which < GROUP)
    slot = h.to(tl.int64) * cache_head_stride + pos * HEAD_DIM + d
    is_k = (which == GROUP) & in_cache
    is_v = (which == GROUP + 1) & in_cache
    tl.store(k_cache_ptr + slot, lo, mask=is_k)
    tl.store(k_cache_ptr + slot + HALF, hi, mask=is_k)
    tl.store(v_cache_ptr + slot, lo, mask=is_v)
    tl.store(v_cache_ptr + slot + HALF, hi, mask=is_v)
    tl.debug_barrier()  # every thread's stores before the release
    tl.atomic_add(cnt_ptr + h, 1, sem="release", scope="gpu")


@triton.jit
def attend(q_ptr, o_ptr, k_ptr, v_ptr, pos_ptr, cnt_ptr, h, cache_head_stride, scale,
           EXPECTED: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
           HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, UPCAST: tl.constexpr,
           PDL: tl.constexpr, THREADS: tl.constexpr):
    """The consumer of key/value head h: `attention_partial_kernel` with one split at
    one token, its wait on the q/k/v kernel replaced by the wait on h's counter."""
    capacity = cache_head_stride // HEAD_DIM
    pos = tl.load(pos_ptr, cache_modifier=".cg")
    n = slots_seen(pos, capacity)  # slots 0..pos
    end = n
    start = n * 0  # a tensor: the loop carries it
    d = tl.arange(0, HEAD_DIM)
    base = h.to(tl.int64) * cache_head_stride
    slots = start + tl.arange(0, BLOCK_S)  # pos's type (int64): the loop's slots too
    at = base + slots[:, None] * HEAD_DIM + d[None, :]
    old = slots < n - 1  # written by earlier steps: loaded before any wait
    k = tl.load(k_ptr + at, mask=old[:, None], other=0.0)
    v = tl.load(v_ptr + at, mask=old[:, None], other=0.0)
    pdl_wait(PDL)  # lets the next kernel launch; nothing here reads the previous one's
    seen = wait_count(cnt_ptr + h, EXPECTED, THREADS)
    tl.store(cnt_ptr + h, 0)  # every producer of h has counted in: ready for the next
    newest = slots == n - 1
    has_newest = n - 1 < BLOCK_S
    at_newest = base + (n - 1) * HEAD_DIM + d
    k_new = tl.load(k_ptr + at_newest, mask=has_newest, cache_modifier=".cg")
    v_new = tl.load(v_ptr + at_newest, mask=has_newest, cache_modifier=".cg")
    k = tl.where(newest[:, None] & has_newest, k_new[None, :], k)
    v = tl.where(newest[:, None] & has_newest, v_new[None, :], v)
    g = tl.arange(0, GROUP_PAD)
    q = tl.load(q_ptr + (h * GROUP + g)[:, None] * HEAD_DIM + d[None, :],
                mask=(g < GROUP)[:, None], other=0.0, cache_modifier=".cg")
    # the next tiles .cg: the newest slot, just written by this grid's producers, may
    # be in one of them
    m, l, acc = online_softmax(q, k, v, slots, start, end, k_ptr, v_ptr, base, d, scale,
                               BLOCK_S, HEAD_DIM, UPCAST, ".cg")
    o = acc / l[:, None]
    if INTERPRET:  # the count checked where it is read once: short or stale is NaN
        o = tl.where(seen == EXPECTED, o, float("nan"))
    out = o_ptr + (h * GROUP + g)[:, None] * HEAD_DIM + d[None, :]
    do = o_ptr.dtype.element_ty
    tl.store(out, round_to(o, do).to(do), mask=(g < GROUP)[:, None])


@triton.jit
def qkv_rope_attention_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, q_ptr, o_ptr,
                              k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr,
                              cnt_ptr, K, stride_w, eps, cache_head_stride, scale,
                              N_HEADS: tl.constexpr, N_KV: tl.constexpr,
                              HEAD_DIM: tl.constexpr, NORM: tl.constexpr,
                              SCALED: tl.constexpr, K_NORM: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              N_TILES: tl.constexpr, BLOCK_S: tl.constexpr,
                              GROUP_PAD: tl.constexpr, UPCAST: tl.constexpr,
                              INTERLEAVE: tl.constexpr, PDL: tl.constexpr,
                              THREADS: tl.constexpr):
    GROUP: tl.constexpr = N_HEADS // N_KV
    PER_HEAD: tl.constexpr = (GROUP + 2) * (HEAD_DIM // 2) // BLOCK_N
    pid = tl.program_id(0)
    if INTERLEAVE:  # h's producers, then h's consumer, head after head
        h = pid // (PER_HEAD + 1)
        j = pid % (PER_HEAD + 1)
        consumer = j == PER_HEAD
    else:  # every producer, head after head, then the N_KV consumers
        consumer = pid >= N_KV * PER_HEAD
        h = tl.where(consumer, pid - N_KV * PER_HEAD, pid // PER_HEAD)
        j = pid % PER_HEAD
    if consumer:
        attend(q_ptr, o_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, cnt_ptr, h,
               cache_head_stride, scale, PER_HEAD, GROUP, GROUP_PAD, HEAD_DIM, BLOCK_S,
               UPCAST, PDL, THREADS)
    else:
        produce(w_ptr, scale_ptr, x_ptr, norm_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                cos_ptr, sin_ptr, pos_ptr, cnt_ptr, h, j, K, stride_w, eps,
                cache_head_stride, N_HEADS, N_KV, HEAD_DIM, NORM, SCALED, K_NORM,
                BLOCK_N, BLOCK_K, N_TILES, PDL)


def default_block(gpu: bool) -> dict:
    """The fused kernel's tiling ({config, block_s, num_warps} for `qkv_rope_attention`):
    on a GPU, the step's q/k/v tiling (4 pairs of 1024 columns, 4 warps) and the
    one-program attention's 256-slot tile (one warp count for both: the kernel has one);
    interpreted, few large programs. Not yet swept: scripts/probes/attention_block.py
    times the variants."""
    if gpu:
        return {"config": GemvConfig(4, 1024, 1, 4), "block_s": 256}
    return {"config": GemvConfig(16, 128, 1, 4), "block_s": 64}


def producers_per_head(n_heads: int, n_kv: int, head_dim: int, block_n: int) -> int:
    return (n_heads // n_kv + 2) * (head_dim // 2) // block_n


def qkv_rope_attention(w: torch.Tensor | Int8Matrix, x: torch.Tensor, q: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, pos: torch.Tensor,
                       out: torch.Tensor | None = None, *, n_heads: int,
                       norm: torch.Tensor | None = None, eps: float = 1e-5,
                       config: GemvConfig = GemvConfig(4, 1024, 1, 4),
                       block_s: int = 256, interleave: bool = False, pdl: bool = False,
                       workspace: Workspace | None = None) -> torch.Tensor:
    """`qkv_rope` then `decode_attention` (one split) of one token in one launch: q
    (n_heads * d,) gets rotary(Wq xn) (scratch the kernel hands from producers to
    consumers), slot pos of k_cache, v_cache (kv_heads, capacity, d) rotary(Wk xn) and
    Wv xn, and out (n_heads * d,; may be q) the attention over slots 0..pos. w: the
    stacked (q; k; v) matrix, BF16, FP32 or an Int8Matrix; xn = RMSNorm(x) with `norm`.
    config: the producers' tiling (block_n pairs of one head: block_n <= d / 2; one
    split) and the one warp count; block_s: the consumers' tile of slots (a cache longer
    than it takes several, the first before the wait). workspace: counters, one per
    key/value head, zero (each launch leaves them zero)."""
    w, scale = unpack(w)
    n_kv, capacity, head_dim = k_cache.shape
    n_rows, k = w.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} is not k_cache's shape "
                         f"{tuple(k_cache.shape)}")
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads do not group over {n_kv} key/value heads")
    if n_rows != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"w of shape {tuple(w.shape)} is not q, k, v of "
                         f"{n_heads}/{n_kv} heads of {head_dim}")
    check_pow2(head_dim=head_dim, block_s=block_s)
    if head_dim < 16 or block_s < 16:
        raise ValueError(f"tl.dot needs head_dim >= 16 and block_s >= 16, got "
                         f"head_dim={head_dim}, block_s={block_s}")
    if config.split_k != 1:
        raise ValueError(f"split_k={config.split_k}: the fused kernel does not split K")
    if config.block_n > head_dim // 2:
        raise ValueError(f"block_n={config.block_n} pairs span heads of {head_dim}: at "
                         f"most {head_dim // 2}")
    if tokens_of(x, k) != 1:
        raise ValueError(f"x of shape {tuple(x.shape)}: one token, ({k},)")
    rows = min(cos.shape[0], sin.shape[0])
    if cos.shape[-1] != head_dim or sin.shape[-1] != head_dim or rows < capacity:
        raise ValueError(f"rotary tables {tuple(cos.shape)}, {tuple(sin.shape)} for a "
                         f"cache of {capacity} slots of {head_dim}: make them "
                         f"(capacity, head_dim)")
    pass_outputs(x, k, n_heads * head_dim, q.dtype, q=q, out=out)  # (heads * d,) each
    out = torch.empty_like(q) if out is None else out
    if not all(t.is_contiguous() for t in (k_cache, v_cache, cos, sin)):
        raise ValueError("the cache and the rotary tables must be contiguous")
    if pos.numel() != 1:
        raise ValueError(f"pos of shape {tuple(pos.shape)}: one element")
    ws = (workspace or Workspace(w.device, 1, n_kv)).check(0, n_kv)
    per_head = producers_per_head(n_heads, n_kv, head_dim, config.block_n)
    group = n_heads // n_kv
    qkv_rope_attention_kernel[(n_kv * (per_head + 1),)](
        w, scale, x, norm, q, out, k_cache, v_cache, cos, sin, pos, ws.counters,
        k, w.stride(0), eps, capacity * head_dim, head_dim**-0.5,
        N_HEADS=n_heads, N_KV=n_kv, HEAD_DIM=head_dim, NORM=norm is not None,
        SCALED=scale is not None, K_NORM=triton.next_power_of_2(k),
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, N_TILES=config.tiles(k),
        BLOCK_S=block_s, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        UPCAST=INTERPRETED or q.dtype == torch.float32, INTERLEAVE=interleave,
        PDL=pdl, THREADS=32 * config.num_warps,
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def qkv_rope_attention_reference(w, x, k_cache, v_cache, cos, sin, pos: int, *,
                                 n_heads: int, norm=None, eps=1e-5):
    """(out, k_cache, v_cache): `qkv_rope_reference` written into copies of the caches
    at slot pos, then `decode_attention_reference` on them; the inputs untouched."""
    n_kv = k_cache.shape[0]
    q, k, v = qkv_rope_reference(w, x, cos, sin, pos, n_heads=n_heads, n_kv=n_kv,
                                 norm=norm, eps=eps)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_cache[:, pos] = k
    v_cache[:, pos] = v
    return decode_attention_reference(q, k_cache, v_cache, pos), k_cache, v_cache
