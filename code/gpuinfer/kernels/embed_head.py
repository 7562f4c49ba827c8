"""The two ends of a greedy decode step: the embedding row of the input token
tokens[pos], and the final RMSNorm + lm_head GEMV + argmax that writes tokens[pos + 1]
and advances pos.

The argmax has two stages. Each lm_head program finds the maximum of its block of logits
(the first index on a tie, as torch.argmax) and writes it out; then either the last
program to finish (`arrive`) reduces the per-block maxima, or a one-program kernel
launched after does (`argmax_reduce_kernel`). Reduced in block order with a strict
comparison, the winner is the first index of the maximum over the whole vocabulary.
The logits are rounded to the activations' dtype first, as PyTorch's argmax sees them.

pos and the token are read from tensors, unchecked (a CUDA graph's replay runs whatever
they hold; the decoder refuses a step past its capacity and ids outside the vocabulary
on the host): both kernels stay inside their buffers whatever they hold. The embedding
reads a clamped pos and a clamped id; the argmax writes tokens[pos + 1] only where that
is a slot of the tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.model.llama import rms_norm
from gpuinfer.kernels.common import (arrive, check_pow2, launch_options, pdl_wait,
                                     round_to)
from gpuinfer.kernels.gemv import GemvConfig, pass_outputs, tokens_of
from gpuinfer.kernels.mma_dot import product
from gpuinfer.kernels.tile import prefetch
from gpuinfer.model.quant import Int8Matrix, matvec_fp32, unpack


@triton.jit
def choose(best_ptr, best_idx_ptr, n_blocks, BLOCK_R: tl.constexpr,
           N_CHUNKS: tl.constexpr):
    """The index of the largest of n_blocks block maxima (the first, on a tie)."""
    lane = tl.arange(0, BLOCK_R)
    best = tl.max(tl.full((BLOCK_R,), float("-inf"), tl.float32), axis=0)
    best_idx = tl.sum(tl.zeros((BLOCK_R,), tl.int32), axis=0)
    for c in range(N_CHUNKS):
        i = c * BLOCK_R + lane
        vals = tl.load(best_ptr + i, mask=i < n_blocks, other=float("-inf"),
                       cache_modifier=".cg")
        idxs = tl.load(best_idx_ptr + i, mask=i < n_blocks, other=0,
                       cache_modifier=".cg")
        top = tl.max(vals, axis=0)
        at = tl.argmax(vals, axis=0, tie_break_left=True)
        top_idx = tl.sum(tl.where(lane == at, idxs, 0), axis=0)
        better = top > best  # strict: an earlier chunk wins a tie
        best_idx = tl.where(better, top_idx, best_idx)
        best = tl.maximum(best, top)
    return best_idx.to(tl.int64)


@triton.jit
def accept_choices(choices, r, tokens_ptr, pos_ptr, capacity, ROWS: tl.constexpr):
    """A verify pass's acceptance (`pick_tokens` with ACCEPT), all tokens at once:
    choices[r] the choice after token r (r < ROWS; r = tl.arange over ROWS padded to a
    power of two). Proposal r is the token after token r, for r < ROWS - 1; m is the
    first refused (the last token has none): choices 0 ... m go in, and pos moves to
    the last slot written."""
    first = tl.load(pos_ptr) - (ROWS - 1)
    slot = first + 1 + r  # the slot after token r: proposal r, then choice r
    ours = (r < ROWS) & (slot >= 0) & (slot < capacity)
    # every proposal read before any choice is written over it
    proposal = tl.load(tokens_ptr + slot, mask=ours & (r < ROWS - 1), other=-1)
    m = tl.min(tl.where((proposal == choices) & (r < ROWS - 1), ROWS - 1, r), axis=0)
    tl.store(tokens_ptr + slot, choices, mask=ours & (r <= m))
    tl.store(pos_ptr, first + m + 1)


@triton.jit
def pick_tokens(best_ptr, best_idx_ptr, n_blocks, tokens_ptr, pos_ptr, capacity,
                BLOCK_R: tl.constexpr, N_CHUNKS: tl.constexpr, ROWS: tl.constexpr,
                ACCEPT: tl.constexpr):
    """After a pass over the ROWS tokens at slots pos - ROWS + 1 ... pos (a step: one),
    with each token's block maxima in a row of n_blocks:

    - a step, or a pass without ACCEPT: tokens[pos + 1] = the last token's choice;
      pos += 1;
    - ACCEPT (a verify pass): the tokens after the first are proposals. Each is
      accepted if it equals the choice after the token before it, up to the first that
      is not; the choices are written after each token up to there (an accepted
      proposal is its own choice; the one after the last accepted is the target's
      next token), and pos moves to the last slot written: 1 ... ROWS tokens committed.

    Past the tokens (a slot >= capacity, or a negative one) nothing is written, but pos
    still advances: every later step finds pos past the cache too, and writes nothing
    (the decoder's host count refuses such steps; a graph's replay runs them)."""
    if ACCEPT:  # each token's choice in a vector, then all accepted at once
        r = tl.arange(0, triton.next_power_of_2(ROWS))
        choices = tl.full(r.shape, -1, tl.int64)
        for t in tl.static_range(ROWS):
            choice = choose(best_ptr + t * n_blocks, best_idx_ptr + t * n_blocks,
                            n_blocks, BLOCK_R, N_CHUNKS)
            choices = tl.where(r == t, choice, choices)
        accept_choices(choices, r, tokens_ptr, pos_ptr, capacity, ROWS)
    else:
        last = (ROWS - 1) * n_blocks
        choice = choose(best_ptr + last, best_idx_ptr + last, n_blocks, BLOCK_R,
                        N_CHUNKS)
        pos = tl.load(pos_ptr)
        ours = (pos + 1 >= 0) & (pos + 1 < capacity)
        tl.store(tokens_ptr + pos + 1, choice, mask=ours)
        tl.store(pos_ptr, pos + 1)


@triton.jit
def logits_epilogue(y, logits_ptr, best_ptr, best_idx_ptr, cnt_ptr, tokens_ptr, pos_ptr,
                    capacity, rr, rows, N, block, blocks, BLOCK_N: tl.constexpr,
                    BLOCK_R: tl.constexpr, N_CHUNKS: tl.constexpr, INLINE: tl.constexpr,
                    ROWS: tl.constexpr, ACCEPT: tl.constexpr):
    """The lm_head's epilogue, a step's or a pass's: y (R, BLOCK_N), the FP32 logits
    of the block's rows for each token (rr: a row each, padded), rounded to the
    activations' dtype as PyTorch's argmax sees them and stored; each token's block
    maximum and its index (the first, on a tie) in its row of the blocks' maxima;
    then, if INLINE, the last program of the `blocks` to finish picks the tokens
    (`pick_tokens`)."""
    dt = logits_ptr.dtype.element_ty
    y = round_to(y, dt)
    mask = (rr < ROWS)[:, None] & (rows < N)[None, :]
    tl.store(logits_ptr + rr[:, None] * N + rows[None, :], y.to(dt), mask=mask)
    y = tl.where(mask, y, float("-inf"))
    at = tl.argmax(y, axis=1, tie_break_left=True)
    tl.store(best_ptr + rr * blocks + block, tl.max(y, axis=1), mask=rr < ROWS)
    tl.store(best_idx_ptr + rr * blocks + block, block * BLOCK_N + at, mask=rr < ROWS)
    if INLINE:
        if arrive(cnt_ptr, blocks):
            pick_tokens(best_ptr, best_idx_ptr, blocks, tokens_ptr, pos_ptr, capacity,
                        BLOCK_R, N_CHUNKS, ROWS, ACCEPT)


@triton.jit
def lm_head_argmax_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, logits_ptr, best_ptr,
                          best_idx_ptr, cnt_ptr, tokens_ptr, pos_ptr, N, K, stride_w,
                          eps, capacity, NORM: tl.constexpr, SCALED: tl.constexpr,
                          K_NORM: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          N_TILES: tl.constexpr, BLOCK_R: tl.constexpr,
                          N_CHUNKS: tl.constexpr, INLINE: tl.constexpr,
                          PDL: tl.constexpr, ROWS: tl.constexpr, ACCEPT: tl.constexpr,
                          N_NORM: tl.constexpr = 1, CHAINS: tl.constexpr = 1,
                          MMA: tl.constexpr = False):
    """The lm_head's logits and block maxima for the ROWS tokens of x, all K columns a
    program (no split-K). MMA: the product on the tensor cores (`mma_dot.product`),
    as the verify pass's kernel runs this program
    (`pass_mma_heads.lm_head_pass_kernel`)."""
    block = tl.program_id(0)
    blocks = tl.num_programs(0)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    w, g, s = prefetch(w_ptr, stride_w, rows, rows < N, 0, K, norm_ptr, scale_ptr, NORM,
                       SCALED, BLOCK_K)
    pdl_wait(PDL)
    R: tl.constexpr = triton.next_power_of_2(ROWS)  # a row per token, padded
    rr = tl.arange(0, R)
    y = product(w, g, s, w_ptr, stride_w, rows, rows < N, x_ptr, K, 0, K, norm_ptr, eps,
                NORM, SCALED, K_NORM, BLOCK_K, N_TILES, N_NORM, True, ROWS, R, CHAINS,
                MMA)
    logits_epilogue(y, logits_ptr, best_ptr, best_idx_ptr, cnt_ptr, tokens_ptr, pos_ptr,
                    capacity, rr, rows, N, block, blocks, BLOCK_N, BLOCK_R, N_CHUNKS,
                    INLINE, ROWS, ACCEPT)


@triton.jit
def argmax_reduce_kernel(best_ptr, best_idx_ptr, n_blocks, tokens_ptr, pos_ptr,
                         capacity, BLOCK_R: tl.constexpr, N_CHUNKS: tl.constexpr,
                         PDL: tl.constexpr, ROWS: tl.constexpr, ACCEPT: tl.constexpr):
    pdl_wait(PDL)
    pick_tokens(best_ptr, best_idx_ptr, n_blocks, tokens_ptr, pos_ptr, capacity, BLOCK_R,
                N_CHUNKS, ROWS, ACCEPT)


@triton.jit
def embed_kernel(embed_ptr, tokens_ptr, pos_ptr, x_ptr, hidden, stride_e, capacity,
                 vocab, BLOCK: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr):
    """x = embed[tokens[pos]] (a pass: row t of x for the token at slot
    pos - ROWS + 1 + t, program_id(1) = t), the slot clamped to the tokens
    [0, capacity) and the id to the embedding's rows [0, vocab): out of range, x is some
    row of the embedding, which does not matter (the decoder refuses such a pos or id
    before a step); what matters is that no read leaves the buffers. Two scalar clamps
    a program."""
    pdl_wait(PDL)  # pos and the token come from the previous step
    pos = tl.load(pos_ptr)
    if ROWS > 1:
        t = tl.program_id(1)
        pos = pos - (ROWS - 1) + t
        x_ptr += t * hidden
    pos = tl.minimum(tl.maximum(pos, 0), capacity - 1)
    token = tl.minimum(tl.maximum(tl.load(tokens_ptr + pos), 0), vocab - 1)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(embed_ptr + token * stride_e + cols, mask=cols < hidden)
    tl.store(x_ptr + cols, row, mask=cols < hidden)


class ArgmaxWorkspace:
    """Per-block maxima and their indices (a row of them for each of a pass's up to
    `rows` tokens), and the arrival counter, allocated once. block_r: the chunk the last
    lm_head program reduces at a time (inline argmax); kept small, since the registers
    it takes are the whole kernel's."""

    def __init__(self, device, n_blocks: int, block_r: int = 2048, rows: int = 1):
        self.block_r, self.rows = block_r, rows
        self.best = torch.empty(rows * n_blocks, device=device, dtype=torch.float32)
        self.best_idx = torch.empty(rows * n_blocks, device=device, dtype=torch.int32)
        self.counter = torch.zeros(1, device=device, dtype=torch.int32)


def block_maxima(config: GemvConfig, n: int, rows: int,
                 workspace: ArgmaxWorkspace | None,
                 device) -> tuple[int, ArgmaxWorkspace]:
    """How many blocks of config.block_n rows an lm_head of n rows takes, one program
    each, and the workspace for their maxima: `workspace`, refused unless it holds a
    row of them for each of `rows` tokens, or a fresh one."""
    blocks = triton.cdiv(n, config.block_n)
    ws = workspace or ArgmaxWorkspace(device, blocks, rows=rows)
    if ws.best.numel() < rows * blocks:
        raise ValueError(f"argmax workspace holds {ws.best.numel()} block maxima, "
                         f"need {rows} x {blocks}")
    return blocks, ws


def launch_lm_head(kernel, config: GemvConfig, w: torch.Tensor, scale, x, norm, logits,
                   tokens, pos, rows: int, *, eps: float, inline: bool, accept: bool,
                   pdl: bool, workspace: ArgmaxWorkspace | None,
                   ) -> tuple[int, ArgmaxWorkspace]:
    """Launch `kernel`, the step's lm_head kernel or the pass's (whose arguments are the
    step's and its tiling's, `MmaConfig.kernel_args`), over the `rows` tokens of x,
    its buffers already checked. Returns the blocks and the workspace that holds their
    maxima (`block_maxima`), for the reduction after it unless `inline`."""
    n, k = w.shape
    blocks, ws = block_maxima(config, n, rows, workspace, w.device)
    kernel[(blocks,)](
        w, scale, x, norm, logits, ws.best, ws.best_idx, ws.counter, tokens, pos,
        n, k, w.stride(0), eps, tokens.numel(), SCALED=scale is not None,
        BLOCK_R=ws.block_r, N_CHUNKS=triton.cdiv(blocks, ws.block_r), INLINE=inline,
        PDL=pdl, ROWS=rows, ACCEPT=accept, **config.kernel_args(k, norm),
        **launch_options(config.num_warps, config.num_stages, pdl))
    return blocks, ws


def lm_head_argmax(w: torch.Tensor | Int8Matrix, x: torch.Tensor, logits: torch.Tensor,
                   tokens: torch.Tensor, pos: torch.Tensor, *,
                   norm: torch.Tensor | None = None, eps: float = 1e-5,
                   config: GemvConfig = GemvConfig(), inline: bool = True,
                   accept: bool = False, pdl: bool = False,
                   workspace: ArgmaxWorkspace | None = None) -> None:
    """logits = W @ RMSNorm(x); tokens[pos + 1] = argmax(logits); pos += 1.
    tokens: one row (capacity,) of int64; pos: a one-element int64 tensor. Where
    pos + 1 is not a slot of tokens, no token is written (pos still advances).
    x (T, hidden), logits (T, vocab): a pass over the tokens at slots pos - T + 1 ...
    pos, the weights read once; then the last token's choice is written after it, or,
    with `accept` (a verify pass), the proposals are accepted as `pick_tokens` says."""
    w, scale = unpack(w)
    n, k = w.shape
    if config.split_k != 1:
        raise ValueError("the lm_head argmax has no split-K (one program per block)")
    rows, _ = pass_outputs(x, k, n, logits=logits)  # logits: (T, vocab), or refused
    blocks, ws = launch_lm_head(lm_head_argmax_kernel, config, w, scale, x, norm,
                                logits, tokens, pos, rows, eps=eps, inline=inline,
                                accept=accept, pdl=pdl, workspace=workspace)
    if not inline:
        # one program, as wide as it takes to read every block maximum at once: a loop
        # of chunks would be one L2 round trip after another
        block_r = min(16384, triton.next_power_of_2(blocks))
        argmax_reduce_kernel[(1,)](
            ws.best, ws.best_idx, blocks, tokens, pos, tokens.numel(),
            BLOCK_R=block_r, N_CHUNKS=triton.cdiv(blocks, block_r), PDL=pdl, ROWS=rows,
            ACCEPT=accept, **launch_options(max(4, min(16, block_r // 1024)), 1, pdl))


def embed(table: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor,
          x: torch.Tensor, *, block: int = 1024, pdl: bool = False) -> None:
    """x = table[tokens[pos]] for one row `tokens` (capacity,) and pos (1,); x (T,
    hidden): the rows of the tokens at slots pos - T + 1 ... pos. Reads nothing
    outside them whatever pos and the ids are (`embed_kernel`)."""
    hidden = table.shape[1]
    check_pow2(block=block)
    rows = tokens_of(x, hidden)
    embed_kernel[(triton.cdiv(hidden, block), rows)](
        table, tokens, pos, x, hidden, table.stride(0), tokens.numel(), table.shape[0],
        BLOCK=block, PDL=pdl, ROWS=rows,
        **launch_options(4, 1, pdl))


def lm_head_argmax_reference(w, x, *, norm=None, eps=1e-5):
    """(logits, token): F.linear(RMSNorm(x), W) in FP32, rounded; torch.argmax."""
    xn = x if norm is None else rms_norm(x, norm, eps)
    logits = matvec_fp32(w, xn).to(x.dtype)
    return logits, int(logits.argmax())
