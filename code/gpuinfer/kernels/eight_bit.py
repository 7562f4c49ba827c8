"""Eight-bit weight formats for the batch-1 GEMV, and how a program turns a tile of
them into numbers (issue 58; no chapter imports this module yet).

Today's int8 step reads half the bytes of the BF16 one but runs at 1.34x, not ~1.9x.
Its loop (scripts/probes/NOTES-58.md) widens every weight to FP32 and keeps one FP32
accumulator *per weight of the tile*: four register bytes per weight byte, so the
register file, not HBM, caps the bytes a multiprocessor has in flight. The formats
here attack that from two sides:

- FP8 e4m3 weights with a per-row scale (`fp8_rows`, `Fp8Matrix`): the same bytes as
  int8, closer to the weights' distribution; widened through their bits (`widen_fp8`:
  on every arch) or by the sm_89+ `cvt.rn.f16x2.e4m3x2` instruction.
- int8 weights times int8 activations (`dp4a`): x quantized per token in each program
  (`quantize_x`), four products and their sum in one integer instruction, and one
  int32 accumulator per *four* weights: no widening at all.

Both go with `fold`: the products of a tile summed within each thread before they join
the accumulator, so that the accumulator holds a register per FOLD columns, not one
per column. The kernels that use them are in `eight_bit_gemv`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import INTERPRETED, round_to
from gpuinfer.kernels.tile import widen
from gpuinfer.model.quant import Int8Matrix

INTERPRET = tl.constexpr(INTERPRETED)
FP8_MAX = 448.0  # the largest finite e4m3 ("fn": no infinities) value
FP8_BITS_BIAS = 256.0  # e4m3 bits placed in an FP16 read 2^-(15 - 7) times the value
# FORMAT 0, 1, 2: widened to FP32 and multiplied; 3: int8 x int8 activations, dp4a
FORMATS = ("int8", "fp8_bits", "fp8_cvt", "dp4a")
RNE = tl.constexpr(12582912.0)  # 1.5 * 2^23: (v + RNE) - RNE rounds v, ties to even


@dataclass(frozen=True)
class Fp8Matrix:
    """W ~ scale[:, None] * e4m3(q): q (N, K) the e4m3 bytes as uint8 (Triton's
    interpreter and every arch read bytes), scale (N,) FP32."""

    q: torch.Tensor
    scale: torch.Tensor
    # Int8Matrix's properties (they read only q and scale), borrowed, not inherited:
    # an Fp8Matrix is no Int8Matrix, whose users (quant.unpack, matvec_fp32, the int8
    # kernels) would read its e4m3 bytes as int8 values.
    shape = Int8Matrix.shape
    nbytes = Int8Matrix.nbytes

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The matrix it stands for: e4m3 values (exact in FP32) times the row scale."""
        values = self.q.view(torch.float8_e4m3fn).float()
        return (values * self.scale.float()[:, None]).to(dtype)


def fp8_rows(w: torch.Tensor) -> Fp8Matrix:
    """Per-row e4m3 of a 2-D floating-point matrix: row i scaled so that its largest
    magnitude is FP8_MAX, rounded to nearest (PyTorch's cast). An all-zero row gets
    scale 1."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"fp8_rows takes a 2-D floating-point matrix, not "
                         f"{w.dim()}-D {w.dtype}")
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Matrix(q.view(torch.uint8), scale)


def dp4a_words(q: torch.Tensor) -> torch.Tensor:
    """int8 weights (N, K) read as int32 words, four columns each (column 4j + i in
    byte i, little-endian): what the dp4a kernels load."""
    if q.dtype != torch.int8 or q.dim() != 2 or q.shape[1] % 4 or not q.is_contiguous():
        raise ValueError(f"dp4a weights: a contiguous 2-D int8 matrix with K a "
                         f"multiple of 4, not {tuple(q.shape)} {q.dtype}")
    return q.view(torch.int32)


# `widen_fp8` compiled, in PTX, four e4m3 bytes (the word $4) a call: E4M3_CVT_PTX by
# sm_89's cvt, E4M3_BITS_PTX by moving the bits. Both leave the bytes' values as FP16 in
# h0..h3, in the bytes' order, and end alike, each half to FP32 in $0..$3: that end,
# FP16_TO_FP32, is written once for the two.
FP16_TO_FP32 = """
    cvt.f32.f16 $0, h0;
    cvt.f32.f16 $1, h1;
    cvt.f32.f16 $2, h2;
    cvt.f32.f16 $3, h3;
    }"""
E4M3_CVT_PTX = tl.constexpr("""{
    .reg .b16 lo, hi, h0, h1, h2, h3;
    .reg .b32 p, q;
    mov.b32 {lo, hi}, $4;
    cvt.rn.f16x2.e4m3x2 p, lo;
    cvt.rn.f16x2.e4m3x2 q, hi;
    mov.b32 {h0, h1}, p;
    mov.b32 {h2, h3}, q;""" + FP16_TO_FP32)
E4M3_BITS_PTX = tl.constexpr("""{
    .reg .b32 odd, even, t;
    .reg .b16 h0, h1, h2, h3;
    and.b32 t, $4, 0x7F007F00;
    shr.b32 t, t, 1;
    and.b32 odd, $4, 0x80008000;
    or.b32 odd, odd, t;
    shl.b32 even, $4, 8;
    and.b32 t, even, 0x7F007F00;
    shr.b32 t, t, 1;
    and.b32 even, even, 0x80008000;
    or.b32 even, even, t;
    mov.b32 {h0, h2}, even;
    mov.b32 {h1, h3}, odd;""" + FP16_TO_FP32)


@triton.jit
def widen_fp8(w, CVT: tl.constexpr):
    """A tile of e4m3 bytes (uint8) in FP32, divided by FP8_BITS_BIAS unless CVT.

    e4m3 is s.eeee.mmm (bias 7); FP16 is s.eeeee.mmmmmmmmmm (bias 15). Placed with its
    sign at bit 15 and the rest one bit lower (bits 13..7), a byte reads as an FP16 of
    2^-8 times its value, subnormals included: the 2^8 goes into the row's scale, for
    free. Compiled, four bytes a word (Marlin's fp8 dequantizer): two AND/OR/shift
    rounds give two half2 words, and each half goes to FP32 (HADD2.F32). CVT: the
    sm_89+ instruction `cvt.rn.f16x2.e4m3x2`, two bytes a call, the true values (no
    bias); ptxas has none before sm_89, where the bits are the way (the kernels'
    launchers refuse CVT there). Interpreted: the bits, in plain operations, scaled."""
    if INTERPRET:
        u = w.to(tl.uint16)
        h = ((u & 0x80) << 8) | ((u & 0x7F) << 7)
        f = h.to(tl.float16, bitcast=True).to(tl.float32)
        if CVT:
            f = f * 256.0
        return f
    PTX: tl.constexpr = E4M3_CVT_PTX if CVT else E4M3_BITS_PTX
    return tl.inline_asm_elementwise(PTX, "=r,=r,=r,=r,r", [w], dtype=tl.float32,
                                     is_pure=True, pack=4)


@triton.jit
def widened(w, FORMAT: tl.constexpr):
    """A tile of FORMAT (0 int8, 1 fp8 bits, 2 fp8 cvt) in FP32, before its row scale
    and `format_scale`."""
    if FORMAT == 0:
        return widen(w, True)
    return widen_fp8(w, FORMAT == 2)


@triton.jit
def format_scale(FORMAT: tl.constexpr):
    """What the row's sum is multiplied by, beside the row scale: 2^8 for fp8 widened
    through its bits, else 1."""
    if FORMAT == 1:
        return 256.0
    return 1.0


@triton.jit
def fold(p, FOLD: tl.constexpr):
    """A tile of products (rows, cols) summed over each run of FOLD adjacent columns:
    (rows, cols // FOLD). With FOLD no more than the columns a thread holds, the sums
    stay inside threads (no shuffle), and the accumulator they join is FOLD times
    smaller: registers for more tiles in flight."""
    if FOLD > 1:
        p = tl.sum(tl.reshape(p, (p.shape[0], p.shape[1] // FOLD, FOLD)), axis=2)
    return p


@triton.jit
def dp4a(a, b, c):
    """c + the dot product of a's and b's four signed bytes (int32 tensors): one
    integer instruction (IDP4A, sm_61+) for four weights. Interpreted: byte by byte."""
    if INTERPRET:
        acc = c
        for i in tl.static_range(4):
            ai = (a << (24 - 8 * i)) >> 24  # arithmetic: the byte, sign-extended
            bi = (b << (24 - 8 * i)) >> 24
            acc += ai * bi
        return acc
    return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                     [a, b, c], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def raw_x(x_ptr, norm_ptr, cols, mask, NORM: tl.constexpr):
    """x[cols] and, if NORM, the RMSNorm weights there, in FP32: loads only."""
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    g = 0.0
    if NORM:
        g = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return x, g


@triton.jit
def norm_x(x, g, rstd, dt: tl.constexpr, NORM: tl.constexpr):
    """x RMSNorm-ed with rstd as `tile.normed` does (each product rounded to dt)."""
    if NORM:
        x = round_to(g * round_to(x * rstd, dt), dt)
    return x


@triton.jit
def normed_x(x_ptr, norm_ptr, cols, mask, rstd, NORM: tl.constexpr):
    """x[cols] in FP32, RMSNorm-ed (with rstd) if NORM."""
    x, g = raw_x(x_ptr, norm_ptr, cols, mask, NORM)
    return norm_x(x, g, rstd, x_ptr.dtype.element_ty, NORM)


@triton.jit
def quantize_x(x_ptr, norm_ptr, K, eps, NORM: tl.constexpr, K_NORM: tl.constexpr):
    """(rstd, 127 / max|xn|, max|xn| / 127) for x's (RMSNorm-ed if NORM) whole row: one
    scale per token. Every program computes it (x is 2048 or 8192 values from L2), so
    that no kernel has to run before the product."""
    dt = x_ptr.dtype.element_ty
    cols = tl.arange(0, K_NORM)
    mask = cols < K
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0
    if NORM:
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps))
        g = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = round_to(g * round_to(x * rstd, dt), dt)
    amax = tl.max(tl.abs(x), axis=0)
    inv = tl.where(amax > 0, tl.math.div_rn(127.0, tl.maximum(amax, 1e-30)), 0.0)
    return rstd, inv, tl.math.div_rn(amax, 127.0)


@triton.jit
def x_words(x, inv, WORDS: tl.constexpr):
    """x (4 * WORDS,) FP32 quantized with `inv` (round to nearest even, through the
    1.5 * 2^23 trick: the same bits compiled and interpreted) and packed four to an
    int32 word, column 4j + i in byte i."""
    q = ((x * inv + RNE) - RNE).to(tl.int32)
    q = tl.reshape(q & 0xFF, (WORDS, 4))
    shift = tl.arange(0, 4)[None, :] * 8
    return tl.sum(q << shift, axis=1)


def quantize_x_reference(xn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): `quantize_x` and `x_words` in PyTorch, xn FP32 (K,), q int32."""
    amax = xn.abs().amax()
    inv = torch.where(amax > 0, 127.0 / amax.clamp_min(1e-30), 0.0)
    return torch.round(xn * inv).to(torch.int32), amax / 127.0


def check_format(fmt: str, capability: int | None) -> int:
    """FORMAT's number; ValueError for an unknown name, or fp8_cvt below sm_89."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r}: one of {FORMATS}")
    if fmt == "fp8_cvt" and capability is not None and capability < 89:
        raise ValueError(f"fp8_cvt needs sm_89 or later (cvt.rn.f16x2.e4m3x2), not "
                         f"sm_{capability}: use fp8_bits")
    return FORMATS.index(fmt)
