"""Weight-only int8: a matrix stored as int8, with one BF16 scale per output row.

At batch 1 a GEMV's time is the time to read its weights, so halving their bytes is the
one lever left once they stream at the copy rate. The scheme is that of gpt-fast's int8
weight-only mode, symmetric and per output channel (gpt-fast divides by 127.5 and lets q
reach -128; here the range is symmetric). Row i of W becomes scale_i * q_i, with
q_i in [-127, 127] and scale_i = max|W_i| / 127 (rounded to BF16 *before* q is rounded,
so that q is rounded against the very scale the kernels multiply by). The scale is the
same for every column of a row, so the kernels sum q_i * x in FP32 and multiply the
row's sum by scale_i once; the activations stay BF16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

INT8_MAX = 127  # symmetric: -128 is never used, so that -q is representable too


@dataclass(frozen=True)
class Int8Matrix:
    """W ~ scale[:, None] * q: q (N, K) int8, scale (N,) in the activations' dtype."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def dequantized(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The matrix the int8 one stands for, in `dtype` (default: the scales'). In
        FP32 it is exact: q * scale has at most 8 + 8 significant bits."""
        return (self.q.float() * self.scale.float()[:, None]).to(dtype or self.scale.dtype)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T in plain PyTorch (the prefill): q widened to x's dtype, the product
        scaled, as gpt-fast's WeightOnlyInt8Linear."""
        return F.linear(x, self.q.to(x.dtype)) * self.scale


def quantize_int8(w: torch.Tensor) -> Int8Matrix:
    """Symmetric per-row int8 of a 2-D floating-point matrix. An all-zero row gets
    scale 1 (any scale reproduces it)."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_int8 takes a 2-D floating-point matrix, "
                         f"not {w.dim()}-D {w.dtype}")
    amax = w.detach().abs().amax(dim=1).float()
    scale = torch.where(amax > 0, amax / INT8_MAX, 1.0).to(w.dtype)
    q = torch.round(w.detach().float() / scale.float()[:, None])
    return Int8Matrix(q.clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale)


def unpack(w: torch.Tensor | Int8Matrix) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the matrix the kernel reads, its row scales or None): what a launcher passes."""
    return (w.q, w.scale) if isinstance(w, Int8Matrix) else (w, None)


def matvec_fp32(w: torch.Tensor | Int8Matrix, x: torch.Tensor) -> torch.Tensor:
    """W @ x with FP32 products and sums (the kernels' arithmetic), before rounding."""
    q, scale = unpack(w)
    y = q.float() @ x.float()
    return y if scale is None else y * scale.float()
