"""The batch-1 GEMV and the gate/up product on eight-bit weights, in each format of
`eight_bit` (issue 58: candidates for Chapter 5's int8 step; no chapter imports this).

The kernels keep `gemv`'s plan: a program's first weight tile is loaded before the PDL
wait (`tile.prefetch`), RMSNorm is recomputed in each program's prologue, the residual
add and SiLU(gate) * up are the epilogues, and each row's sum is multiplied by its
scale once, at the end. What differs is the loop's arithmetic, chosen by FORMAT:

- int8, fp8_bits, fp8_cvt: each weight widened to FP32 and multiplied (`widened`);
  with FOLD > 1 the products are summed inside each thread before they join the
  accumulator (`fold`), which then holds BLOCK_K / FOLD columns, not BLOCK_K.
- dp4a: the weights read as int32 words, x quantized to int8 per token in every
  program (`quantize_x`), and four products summed by one instruction into an int32
  accumulator of BLOCK_K / 4 columns. The result is y = scale_w * scale_x * sum(q q'):
  x's quantization adds an error (~0.3 % of the output's norm) that the other formats
  do not have.

A vector of one token only, no split-K: the shapes of a decode step's products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import launch_options, pdl_wait, round_to
from gpuinfer.kernels.eight_bit import (FORMATS, Fp8Matrix, check_format, dp4a,
                                        dp4a_words, fold, format_scale, norm_x,
                                        normed_x, quantize_x, quantize_x_reference,
                                        raw_x, widened, x_words)
from gpuinfer.kernels.gemv import GemvConfig
from gpuinfer.kernels.tile import prefetch, rms_rstd
from gpuinfer.model.llama import rms_norm
from gpuinfer.model.quant import Int8Matrix

DP4A = tl.constexpr(3)  # FORMATS.index("dp4a"), read inside kernels


@triton.jit
def rows_dot8(w, s, w_ptr, stride_w, rows, row_mask, x_ptr, norm_ptr, K, eps,
              NORM: tl.constexpr, K_NORM: tl.constexpr, BLOCK_K: tl.constexpr,
              N_TILES: tl.constexpr, FORMAT: tl.constexpr, FOLD: tl.constexpr,
              AHEAD: tl.constexpr):
    """sum over k of W[rows, k] * xn[k] in FP32, times the rows' scales s, given the
    prefetched first tile w (for dp4a: a tile of BLOCK_K / 4 words). AHEAD: each tile
    is loaded (with its x) before the one before it is multiplied, two tiles in
    registers: a folded accumulator leaves room for them. dp4a's loop is unrolled
    (its tiles are loaded as ptxas schedules them)."""
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    if FORMAT == DP4A:
        WORDS: tl.constexpr = BLOCK_K // 4
        rstd, inv, sx = quantize_x(x_ptr, norm_ptr, K, eps, NORM, K_NORM)
        cols = tl.arange(0, BLOCK_K)
        xw = x_words(normed_x(x_ptr, norm_ptr, cols, cols < K, rstd, NORM), inv, WORDS)
        acc = dp4a(w, xw[None, :], tl.zeros(w.shape, tl.int32))
        for t in range(1, N_TILES):
            words = t * WORDS + tl.arange(0, WORDS)
            w = tl.load(w_rows + words[None, :],
                        mask=row_mask[:, None] & (words[None, :] < K // 4), other=0)
            cols = t * BLOCK_K + tl.arange(0, BLOCK_K)
            xw = x_words(normed_x(x_ptr, norm_ptr, cols, cols < K, rstd, NORM), inv,
                         WORDS)
            acc = dp4a(w, xw[None, :], acc)
        y = tl.sum(acc, axis=1).to(tl.float32) * s * sx
    else:  # (an early return would not keep the code below from compiling)
        rstd = 1.0
        if NORM:
            rstd = rms_rstd(x_ptr, K, eps, K_NORM)
        cols = tl.arange(0, BLOCK_K)
        xn = normed_x(x_ptr, norm_ptr, cols, cols < K, rstd, NORM)
        if AHEAD:  # the next tile in flight while this one is multiplied
            acc = tl.zeros((w.shape[0], BLOCK_K // FOLD), tl.float32)
        else:
            acc = fold(widened(w, FORMAT) * xn[None, :], FOLD)
        for t in range(1, N_TILES):
            cols = t * BLOCK_K + tl.arange(0, BLOCK_K)
            mask = cols < K
            w_next = tl.load(w_rows + cols[None, :],
                             mask=row_mask[:, None] & mask[None, :], other=0)
            if AHEAD:
                x, g = raw_x(x_ptr, norm_ptr, cols, mask, NORM)
                acc += fold(widened(w, FORMAT) * xn[None, :], FOLD)
                xn = norm_x(x, g, rstd, x_ptr.dtype.element_ty, NORM)
            else:
                xn = normed_x(x_ptr, norm_ptr, cols, mask, rstd, NORM)
                acc += fold(widened(w_next, FORMAT) * xn[None, :], FOLD)
            w = w_next
        if AHEAD:
            acc += fold(widened(w, FORMAT) * xn[None, :], FOLD)
        y = tl.sum(acc, axis=1) * (s * format_scale(FORMAT))
    return y


@triton.jit
def first_tile(w_ptr, stride_w, rows, row_mask, K, scale_ptr, BLOCK_K: tl.constexpr,
               FORMAT: tl.constexpr):
    """The prefetched tile (words for dp4a) and the rows' scales."""
    if FORMAT == DP4A:
        w, _, s = prefetch(w_ptr, stride_w, rows, row_mask, 0, K // 4, None, scale_ptr,
                           False, True, BLOCK_K // 4)
    else:
        w, _, s = prefetch(w_ptr, stride_w, rows, row_mask, 0, K, None, scale_ptr,
                           False, True, BLOCK_K)
    return w, s


@triton.jit
def gemv8_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, res_ptr, norm_ptr, N, K, stride_w,
                 eps, NORM: tl.constexpr, RESIDUAL: tl.constexpr, K_NORM: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N_TILES: tl.constexpr,
                 PDL: tl.constexpr, FORMAT: tl.constexpr, FOLD: tl.constexpr,
                 AHEAD: tl.constexpr):
    """out = [res +] W @ [RMSNorm](x) for one vector x; out may be res itself."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = rows < N
    w, s = first_tile(w_ptr, stride_w, rows, valid, K, scale_ptr, BLOCK_K, FORMAT)
    pdl_wait(PDL)
    res = 0.0
    if RESIDUAL:  # in the shadow of the weights
        res = tl.load(res_ptr + rows, mask=valid).to(tl.float32)
    y = rows_dot8(w, s, w_ptr, stride_w, rows, valid, x_ptr, norm_ptr, K, eps, NORM,
                  K_NORM, BLOCK_K, N_TILES, FORMAT, FOLD, AHEAD)
    dt = out_ptr.dtype.element_ty
    y = round_to(y, dt)
    if RESIDUAL:
        y = round_to(res + y, dt)
    tl.store(out_ptr + rows, y.to(dt), mask=valid)


@triton.jit
def gemv8_silu_kernel(w_ptr, scale_ptr, x_ptr, out_ptr, norm_ptr, N, K, stride_w, eps,
                      NORM: tl.constexpr, K_NORM: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, PDL: tl.constexpr,
                      FORMAT: tl.constexpr, FOLD: tl.constexpr,
                      AHEAD: tl.constexpr):
    """out[j] = SiLU(gate_j) * up_j for W = [gate; up] (2N rows): tile row 2i is gate
    row j, row 2i + 1 up row j, as in `gemv_silu_kernel`."""
    r = tl.arange(0, 2 * BLOCK_N)
    j = tl.program_id(0) * BLOCK_N + r // 2
    rows = j + (r % 2) * N
    w, s = first_tile(w_ptr, stride_w, rows, j < N, K, scale_ptr, BLOCK_K, FORMAT)
    pdl_wait(PDL)
    y = rows_dot8(w, s, w_ptr, stride_w, rows, j < N, x_ptr, norm_ptr, K, eps, NORM,
                  K_NORM, BLOCK_K, N_TILES, FORMAT, FOLD, AHEAD)
    dt = out_ptr.dtype.element_ty
    gate, up = tl.split(tl.reshape(y, (BLOCK_N, 2)))
    gate = round_to(gate, dt)
    silu = round_to(gate / (1.0 + tl.exp(-gate)), dt)
    out = round_to(silu * round_to(up, dt), dt)
    jj = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + jj, out.to(dt), mask=jj < N)


def _capability(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None  # the interpreter, or a compilation (aot) that ptxas checks
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def _operands(w, x: torch.Tensor, fmt: str, config: GemvConfig, fold: int):
    """(weights as the kernel reads them, row scales, stride, FORMAT, N_TILES), the
    launch checked: ValueError for a misuse."""
    code = check_format(fmt, _capability(x.device))
    want = Fp8Matrix if fmt.startswith("fp8") else Int8Matrix
    if not isinstance(w, want):
        raise ValueError(f"format={fmt!r} takes an {want.__name__}, not "
                         f"{type(w).__name__}")
    k = w.shape[1]
    if x.dim() != 1 or x.shape[0] != k or not x.is_contiguous():
        raise ValueError(f"x of shape {tuple(x.shape)}: one contiguous vector of {k}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x of dtype {x.dtype}: FP32, BF16 or FP16 activations")
    if config.split_k != 1:
        raise ValueError(f"split_k={config.split_k}: the eight-bit kernels do not "
                         "split")
    block_k = min(config.block_k, triton.next_power_of_2(k))
    if fold < 1 or fold & (fold - 1) or fold > block_k // 4 or (fold > 1 and
                                                                code == FORMATS.index(
                                                                    "dp4a")):
        raise ValueError(f"fold={fold}: a power of two up to block_k / 4, 1 for dp4a")
    q = dp4a_words(w.q) if fmt == "dp4a" else w.q
    if fmt == "dp4a" and block_k < 4:
        raise ValueError("dp4a needs block_k >= 4")
    return q, w.scale, q.stride(0), code, block_k, triton.cdiv(k, block_k)


def gemv8(w: Int8Matrix | Fp8Matrix, x: torch.Tensor, out: torch.Tensor | None = None,
          *, norm: torch.Tensor | None = None, eps: float = 1e-5,
          residual: torch.Tensor | None = None, config: GemvConfig = GemvConfig(),
          pdl: bool = False, format: str = "int8", fold: int = 1,
          ahead: bool = False) -> torch.Tensor:
    """W (N, K) @ [RMSNorm](x) [+ residual] -> (N,) in x's dtype, W eight-bit in
    `format` (FORMATS: int8 and dp4a take an Int8Matrix, fp8_* an Fp8Matrix)."""
    q, scale, stride, code, block_k, tiles = _operands(w, x, format, config, fold)
    n, k = w.shape
    out = torch.empty(n, device=x.device, dtype=x.dtype) if out is None else out
    gemv8_kernel[(triton.cdiv(n, config.block_n),)](
        q, scale, x, out, residual, norm, n, k, stride, eps,
        NORM=norm is not None, RESIDUAL=residual is not None,
        K_NORM=triton.next_power_of_2(k), BLOCK_N=config.block_n, BLOCK_K=block_k,
        N_TILES=tiles, PDL=pdl, FORMAT=code, FOLD=fold, AHEAD=ahead,
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def gemv8_silu(w: Int8Matrix | Fp8Matrix, x: torch.Tensor,
               out: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
               eps: float = 1e-5, config: GemvConfig = GemvConfig(), pdl: bool = False,
               format: str = "int8", fold: int = 1,
               ahead: bool = False) -> torch.Tensor:
    """SiLU(W[:N] @ xn) * (W[N:] @ xn) for the stacked gate/up W (2N, K) -> (N,)."""
    q, scale, stride, code, block_k, tiles = _operands(w, x, format, config, fold)
    n2, k = w.shape
    if n2 % 2:
        raise ValueError(f"gate/up of {n2} rows: gate and up stacked, an even number")
    out = torch.empty(n2 // 2, device=x.device, dtype=x.dtype) if out is None else out
    gemv8_silu_kernel[(triton.cdiv(n2 // 2, config.block_n),)](
        q, scale, x, out, norm, n2 // 2, k, stride, eps,
        NORM=norm is not None, K_NORM=triton.next_power_of_2(k),
        BLOCK_N=config.block_n, BLOCK_K=block_k, N_TILES=tiles, PDL=pdl, FORMAT=code,
        FOLD=fold, AHEAD=ahead,
        **launch_options(config.num_warps, config.num_stages, pdl))
    return out


def gemv8_reference(w: Int8Matrix | Fp8Matrix, x: torch.Tensor, *, norm=None,
                    eps: float = 1e-5, residual=None, format: str = "int8"):
    """`gemv8` in plain PyTorch: FP32 products and sums of the dequantized weights
    (FP64 for dp4a's exact integer sums), rounded as F.linear rounds."""
    xn = (x if norm is None else rms_norm(x, norm, eps)).float()
    if format == "dp4a":
        qx, sx = quantize_x_reference(xn)
        y = (w.q.double() @ qx.double()).float() * w.scale.float() * sx
    elif isinstance(w, Fp8Matrix):
        values = w.q.view(torch.float8_e4m3fn).float()
        y = (values @ xn) * w.scale.float()
    else:
        y = (w.q.float() @ xn) * w.scale.float()
    y = y.to(x.dtype)
    return y if residual is None else residual + y


def gemv8_silu_reference(w, x, *, norm=None, eps: float = 1e-5, format: str = "int8"):
    """`gemv8_silu` in plain PyTorch: F.silu(gate) * up, as the Llama MLP."""
    gate, up = gemv8_reference(w, x, norm=norm, eps=eps, format=format).chunk(2)
    return torch.nn.functional.silu(gate) * up


def eight_bit_launches(capability: int, hidden: int = 2048, inter: int = 8192,
                       configs: dict | None = None) -> list:
    """(name, launch) for each kernel and format an sm_<capability> target has, at a
    Llama's gate/up (2 inter x hidden) and down (hidden x inter) shapes, on empty CPU
    tensors: for `aot.compile_only` (PDL on sm_90 and later)."""
    configs = configs or AOT_CONFIGS  # {format: [(matrix, (config, fold, ahead))]}
    pdl = capability >= 90

    def t(*shape, dt=torch.bfloat16):
        return torch.empty(shape, dtype=dt)

    def m(fmt, n, k):
        if fmt.startswith("fp8"):
            return Fp8Matrix(t(n, k, dt=torch.uint8), t(n, dt=torch.float32))
        return Int8Matrix(t(n, k, dt=torch.int8), t(n))

    out = []
    for fmt in FORMATS:
        if fmt == "fp8_cvt" and capability < 89:
            continue
        for name, (config, fold, ahead) in configs[fmt]:
            if name == "gate_up":
                launch = (lambda f=fmt, c=config, d=fold, a=ahead: gemv8_silu(
                    m(f, 2 * inter, hidden), t(hidden), t(inter), norm=t(hidden),
                    config=c, pdl=pdl, format=f, fold=d, ahead=a))
            else:
                launch = (lambda f=fmt, c=config, d=fold, a=ahead: gemv8(
                    m(f, hidden, inter), t(inter), t(hidden), residual=t(hidden),
                    config=c, pdl=pdl, format=f, fold=d, ahead=a))
            out.append((f"{name} {fmt} fold {fold}{' ahead' if ahead else ''}",
                        launch))
    return out


# First guesses for the GPU probe to sweep from: today's int8 tiling, folded in 16s,
# with and without the next tile loaded ahead; dp4a's loop is unrolled
GATE_UP, DOWN = GemvConfig(8, 512, 1, 4), GemvConfig(8, 2048, 1, 8)
AOT_CONFIGS = {fmt: [(m, (c, 16, a)) for a in (False, True)
                     for m, c in (("gate_up", GATE_UP), ("down", DOWN))]
               for fmt in FORMATS}
AOT_CONFIGS["dp4a"] = [("gate_up", (GATE_UP, 1, False)), ("down", (DOWN, 1, False))]
