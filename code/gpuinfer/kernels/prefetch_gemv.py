"""A GEMV y = W @ x whose programs copy their first STAGES weight tiles into shared
memory before the PDL wait (issue 58, item 2b; a probe, not yet used by a chapter).

`gemv.gemv` loads a program's first tile into registers before `pdl_wait`: one tile,
since the register file must also hold the accumulator, and a kernel boundary (~0.7
µs, 83 a step) overlaps only that much of the next kernel's weights. Here each program
starts TMA copies (Hopper's tensor memory accelerator, through Gluon) of its first
STAGES tiles of W into a ring of shared-memory slots, each slot with an mbarrier that
counts the bytes landed, and only then waits for the previous kernel. The copies hold
no registers and no thread waits on them: the weights stream in while the kernel
before still runs.
After the wait, the program copies x into shared memory (one L2 round trip), then
for each tile waits on its slot's barrier, reads the tile in chunks that keep the
accumulator small, and refills the slot with the tile STAGES ahead: the rest of the
row streams through the same ring.

W is BF16, row-major; FP32 products and sums; the output rounded to BF16. No fusions
(RMSNorm, residual, SiLU) and no split-K: the question is only whether weights in
shared memory before the wait beat one tile in registers. TMA needs 16-byte aligned
rows (K a multiple of 8) and Hopper (sm_90) or later; before Hopper the same product
is `gemv.gemv` (this launcher refuses such a GPU and names it). Gluon does not run
under Triton's interpreter: on a CPU the kernel can only be compiled
(`aot.compile_only(90)`).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                              mbarrier, tma)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from gpuinfer.kernels.common import check_pow2, launch_options, pdl_wait

SHARED_LIMIT = 232448  # bytes of shared memory a block may opt into on sm_90 (227 KB)
TMA_BOX = 256  # TMA copies a box of at most 256 elements a dimension (rows here)
VECTOR = 8  # BF16 weights a thread reads at once: 16 bytes (one LDS.128)


@gluon.constexpr_function
def tile_layout(block_n, block_k, num_warps):
    """How a chunk of a tile sits in the threads: 8 adjacent columns a thread (16 bytes
    from shared memory at once), the threads of a warp along a row (a warp reads 512
    contiguous bytes: no bank conflicts), the warps down the rows, and along the
    columns only where the tile has fewer rows than warps."""
    tk = min(32, block_k // VECTOR)
    wn = min(num_warps, max(1, block_n // (32 // tk)))
    return gl.BlockedLayout([1, VECTOR], [32 // tk, tk], [wn, num_warps // wn], [1, 0])


@gluon.constexpr_function
def chunk_width(block_n, block_k, num_warps):
    """Columns a chunk spans: one 16-byte vector a thread of the layout. A tile is
    read chunk by chunk so that the FP32 accumulator holds a chunk, not a tile."""
    layout = tile_layout(block_n, block_k, num_warps)
    return VECTOR * layout.threads_per_warp[1] * layout.warps_per_cta[1]


@gluon.jit
def fetch(w_desc, ring, ready, row0, t, slot, n_tiles):
    """Start the copy of tile t (W[row0:, t * BLOCK_K:]) into `slot` of the ring, if
    the row has a tile t; the slot's barrier expects its bytes (zeros past N and K
    count too: TMA fills them)."""
    BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
    there = t < n_tiles
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes, pred=there)
    tma.async_copy_global_to_shared(w_desc, [row0, t * BLOCK_K], ready.index(slot),
                                    ring.index(slot), pred=there)


@gluon.jit
def prefetch_gemv_kernel(w_desc, x_ptr, out_ptr, N, K,
                         K_PAD: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
    """out[rows] = W[rows] @ x for one block of BLOCK_N rows (the descriptor's box).
    K_PAD: K rounded up to a power of two (x's place in shared memory)."""
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
    layout: gl.constexpr = tile_layout(BLOCK_N, BLOCK_K, gl.num_warps())
    CHUNK: gl.constexpr = chunk_width(BLOCK_N, BLOCK_K, gl.num_warps())
    CHUNKS: gl.constexpr = BLOCK_K // CHUNK
    row0 = gl.program_id(0) * BLOCK_N
    n_tiles = gl.cdiv(K, BLOCK_K)

    # Before the wait: only weights, which no kernel writes. The copies run on the TMA
    # unit while this program (and the previous kernel) goes on.
    ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K],
                                     w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()  # the barriers' initialization, seen by the TMA unit
    for i in gl.static_range(STAGES):
        fetch(w_desc, ring, ready, row0, i, i, n_tiles)
    pdl_wait(PDL)

    # x, written by the previous kernel: all of it at once into shared memory (one L2
    # round trip, not one a tile), as rows of a chunk, zeros past K.
    r = gl.arange(0, K_PAD // CHUNK, layout=gl.SliceLayout(1, layout))[:, None]
    c = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))[None, :]
    k = r * CHUNK + c
    xv = gl.load(x_ptr + k, mask=k < K, other=0.0)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # row-major
    xs = gl.allocate_shared_memory(xv.dtype, xv.shape, flat, xv)
    # the same bytes, as chunks to index by a tensor (a 1-D layout, one chunk a row)
    xs = xs._reinterpret(xv.dtype, xv.shape, gl.SwizzledSharedLayout(1, 1, 1, [0]))

    acc = gl.zeros([BLOCK_N, CHUNK], gl.float32, layout)
    for t in range(n_tiles):
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        tile = ring.index(slot)
        for j in gl.static_range(CHUNKS):
            w = tile.slice(j * CHUNK, CHUNK, dim=1).load(layout)
            xj = xs.index(t * CHUNKS + j).load(gl.SliceLayout(0, layout))
            acc += w.to(gl.float32) * xj.to(gl.float32)[None, :]
        # The slot is read: refill it with the tile STAGES ahead. (Triton puts a
        # barrier and a proxy fence before the copy: every warp's reads of the slot
        # come before the TMA unit overwrites it.)
        fetch(w_desc, ring, ready, row0, t + STAGES, slot, n_tiles)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    y = gl.sum(acc, axis=1)  # one reduction across the threads, at the end
    rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    gl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


def shared_bytes(stages: int, block_n: int, block_k: int, k: int) -> int:
    """Shared memory a program of this tiling takes for K = k (stages as launched: at
    most the row's tiles): the ring of BF16 tiles, x (K rounded up to a power of two,
    at least a tile) and a barrier (8 bytes) a slot."""
    block_k = min(block_k, triton.next_power_of_2(k))
    stages = min(stages, triton.cdiv(k, block_k))
    return 2 * stages * block_n * block_k + 2 * triton.next_power_of_2(k) + 8 * stages


def _check_tensors(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != torch.bfloat16:
        what = (f"{type(w).__name__}" if not isinstance(w, torch.Tensor) else
                f"a {w.dtype} tensor of shape {tuple(w.shape)}")
        raise ValueError(f"w is {what}: prefetch_gemv takes a 2-D torch.bfloat16 "
                         "matrix (N, K); for int8 or other dtypes use gemv.gemv")
    n, k = w.shape
    if w.stride(1) != 1 or (w.stride(0) * 2) % 16 or w.data_ptr() % 16:
        raise ValueError(f"w of shape {tuple(w.shape)}, strides {w.stride()}, at "
                         f"{w.data_ptr():#x}: TMA reads rows that start on 16 bytes, "
                         "columns contiguous (K a multiple of 8: pad W's columns and "
                         "x with zeros, or use gemv.gemv)")
    if x.shape != (k,) or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(f"x of shape {tuple(x.shape)}, {x.dtype}: must be ({k},) "
                         "torch.bfloat16, contiguous (W's columns)")
    if out is not None and (out.shape != (n,) or out.dtype != torch.bfloat16
                            or not out.is_contiguous()):
        raise ValueError(f"out of shape {tuple(out.shape)}, {out.dtype}: must be "
                         f"({n},) torch.bfloat16, contiguous (W's rows), or None")
    for name, t in (("x", x), ("out", out)):
        if t is not None and t.device != w.device:
            raise ValueError(f"{name} is on {t.device}, w on {w.device}: move it there")
    if w.is_cuda and torch.cuda.get_device_capability(w.device)[0] < 9:
        major, minor = torch.cuda.get_device_capability(w.device)
        raise ValueError(f"TMA needs Hopper (sm_90) or later, this GPU is sm_{major}"
                         f"{minor}: use gpuinfer.kernels.gemv.gemv there")


def _check_tiling(stages, block_n, block_k, num_warps, k) -> None:
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages={stages!r}: the tiles copied before the PDL wait, an "
                         "int >= 1")
    check_pow2(block_n=block_n, block_k=block_k, num_warps=num_warps)
    if block_n > TMA_BOX:
        raise ValueError(f"block_n={block_n}: a TMA box has at most {TMA_BOX} rows; "
                         f"take block_n <= {TMA_BOX}")
    if block_k < VECTOR:
        raise ValueError(f"block_k={block_k}: a TMA box row is at least 16 bytes; "
                         f"take block_k >= {VECTOR}")
    fitted = min(block_k, triton.next_power_of_2(k))  # as launched
    if block_n * fitted < 32 * VECTOR * num_warps:
        raise ValueError(f"a tile of {block_n} x {fitted} gives the {num_warps} "
                         f"warps' threads fewer than {VECTOR} weights each: take "
                         f"block_n * block_k >= {32 * VECTOR * num_warps}, or fewer "
                         "warps")
    need = shared_bytes(stages, block_n, block_k, k)
    if need > SHARED_LIMIT:
        raise ValueError(f"stages={stages} of {block_n} x {block_k} BF16 tiles and x "
                         f"({k} columns) take {need:,} bytes of shared memory; a block "
                         f"has at most {SHARED_LIMIT:,} on sm_90: fewer stages or "
                         "smaller tiles")


def prefetch_gemv(w: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None, *,
                  stages: int, block_n: int, block_k: int, pdl: bool,
                  num_warps: int = 4) -> torch.Tensor:
    """W (N, K) @ x (K,) -> (N,), BF16, each program `block_n` rows, its first `stages`
    tiles of `block_k` columns copied into shared memory before the PDL wait (`pdl`:
    launched with Programmatic Dependent Launch, as `gemv.gemv`). A tile wider than K
    is narrowed to K (rounded up to a power of two), and `stages` to the row's tiles:
    slots that would stay empty would only take shared memory from other programs.
    Hopper and later; elsewhere use `gemv.gemv`. Raises ValueError on any operand or
    tiling the kernel cannot take, naming it and what to do."""
    _check_tensors(w, x, out)
    n, k = w.shape
    _check_tiling(stages, block_n, block_k, num_warps, k)
    block_k = min(block_k, triton.next_power_of_2(k))
    stages = min(stages, triton.cdiv(k, block_k))
    out = torch.empty(n, device=w.device, dtype=w.dtype) if out is None else out
    # No swizzle: TMA then writes each box row-major, and a warp reading 512
    # contiguous bytes of a row hits every bank once.
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k], layout)
    prefetch_gemv_kernel[(triton.cdiv(n, block_n),)](
        w_desc, x, out, n, k, K_PAD=max(triton.next_power_of_2(k), block_k),
        STAGES=stages, PDL=pdl, **launch_options(num_warps, 1, pdl))
    return out


def prefetch_gemv_reference(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`prefetch_gemv` in plain PyTorch: FP32 products and sums, rounded to BF16."""
    return (w.float() @ x.float()).to(w.dtype)
