"""Chapter 5's Triton step with the eight-bit kernels of issue 58 for the MLP and the
o-projection: a candidate for the chapter's int8 step, not yet read by any chapter.

`EightBitDecoder` is a `TritonDecoder` whose o-projection (with its residual add),
gate/up (RMSNorm, SiLU(gate) * up) and down-projection (residual add) run the kernels of
`kernels.eight_bit_gemv` in one `format`:

- "int8": today's int8 weights (`model.quant`), the products folded inside each thread
  before they join the accumulator (`kernels.eight_bit.fold`): NOTES-58 reads 80
  registers for gate/up, not 128, hence more bytes in flight;
- "fp8_cvt", "fp8_bits": e4m3 weights with an FP32 scale a row (`eight_bit.fp8_rows`),
  widened by Hopper's `cvt.rn.f16x2.e4m3x2` (sm_89+) or through their bits;
- "dp4a": int8 weights times x quantized per token, four products an instruction
  (x's quantization adds an error the other formats do not have).

These three matrices are ~80 % of the int8 step's bytes. The q/k/v with rotary, the
attention, the embedding and the lm_head keep the parent's kernels, in the parent's
`weights` format (INT8 by default: the step it would replace). The matrices are
converted once, at construction, from the model's own weights (int8 reused where the
parent already quantized them). The prefill runs the book's PyTorch forward on the
same converted matrices, so the cache it writes is the one the step would write.

`matrices` names which of the three run the eight-bit kernels; the others keep the
parent's kernels and weights. A trace of the 1B step on an H100 (NOTES-58 §8) found
the folded gate/up faster in the step than today's int8 and the folded o and down
slower, so the mix is a candidate of its own.

One-token steps only: the eight-bit kernels take one vector and no split-K, so a
verify pass (`max_query` > 1) is refused; Chapter 6's passes stay on `TritonDecoder`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton

from gpuinfer.decode.interface import check_keys
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels import eight_bit_gemv
from gpuinfer.kernels.common import INTERPRETED
from gpuinfer.kernels.eight_bit import Fp8Matrix, check_format, fp8_rows
from gpuinfer.kernels.gemv import GemvConfig
from gpuinfer.kernels.tiling import alone_configs
from gpuinfer.model.configs import load_llama
from gpuinfer.model.llama import INT8, WeightFormat, weights_of
from gpuinfer.model.quant import Int8Matrix, quantize_int8

STEP_FORMATS = ("int8", "fp8_bits", "fp8_cvt", "dp4a")  # eight_bit.FORMATS, all served
EIGHT_BIT = ("o", "gate_up", "down")  # the matrices the eight-bit kernels multiply
FOLD = 16  # products summed in a thread before the accumulator (NOTES-58: 80 registers)


@dataclass(frozen=True)
class Fp8Linear(Fp8Matrix):
    """An `Fp8Matrix` with the `linear` that `model.llama.forward` calls for a stored
    matrix (the prefill): the e4m3 values (exact in BF16 and FP32) multiplied in x's
    dtype, each row's FP32 sum scaled in FP32 and rounded once, as the kernels do."""

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        values = self.q.view(torch.float8_e4m3fn).to(x.dtype)
        return (F.linear(x, values).float() * self.scale).to(x.dtype)


def to_format(matrix: torch.Tensor | Int8Matrix, fmt: str) -> Int8Matrix | Fp8Linear:
    """`matrix` (the model's own, or the parent's int8 copy of it) in `fmt`: int8 and
    dp4a read `quantize_int8`'s matrix (an Int8Matrix is kept as it is), fp8 the
    per-row e4m3 of the model's own matrix (never of an int8 one: two roundings)."""
    if fmt in ("int8", "dp4a"):
        return matrix if isinstance(matrix, Int8Matrix) else quantize_int8(matrix)
    if not isinstance(matrix, torch.Tensor):
        raise ValueError(f"fp8 is converted from the model's own matrix, not from "
                         f"{type(matrix).__name__}")
    fp8 = fp8_rows(matrix)
    return Fp8Linear(fp8.q, fp8.scale)


def eight_bit_configs(gpu: bool) -> dict[str, tuple[GemvConfig, int]]:
    """{matrix: (tiling, fold)} for the eight-bit kernels in the step. On a GPU: today's
    int8 tiling (`tiling.default_configs(..., "int8")`), folded in 16s, the first
    guess NOTES-58 names for the whole-step sweep (scripts/probes/step8.py);
    interpreted: the interpreter's few large programs (`tiling.alone_configs`)."""
    if gpu:
        return {"o": (GemvConfig(8, 2048, 1, 8), FOLD),
                "gate_up": (GemvConfig(8, 512, 1, 4), FOLD),
                "down": (GemvConfig(8, 2048, 1, 8), FOLD)}
    return {name: (alone_configs(False)[name], FOLD) for name in EIGHT_BIT}


def _capability(device: torch.device) -> int | None:
    """sm_XY as XY where kernels are compiled for a GPU; None when interpreted."""
    if device.type != "cuda" or INTERPRETED:
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


class EightBitDecoder(TritonDecoder):
    """`TritonDecoder` with o, gate/up and down in an eight-bit `format` (STEP_FORMATS)
    on `kernels.eight_bit_gemv`'s kernels; everything else as the parent, its other
    matrices in `weights` (default INT8).

    `eight_bit`: {matrix: (GemvConfig, fold)} over `eight_bit_configs`; each tiling is
    fitted to its matrix's K as the parent fits its own (and fold to the tile: at most
    block_k / 4; 1 for dp4a, which sums four products an instruction instead).
    `matrices`: those of EIGHT_BIT on the eight-bit kernels (default all three; the
    rest as the parent runs them). Every other option is the parent's; `max_query`
    must be 1."""

    def __init__(self, model, batch: int = 1, capacity: int = 1024, *,
                 format: str = "int8", eight_bit: dict | None = None,
                 matrices: tuple[str, ...] = EIGHT_BIT,
                 weights: WeightFormat = INT8, max_query: int = 1, device=None,
                 **options):
        if max_query != 1 or isinstance(max_query, bool):
            raise ValueError(
                f"max_query={max_query!r}: EightBitDecoder runs one-token steps (its "
                "kernels take one vector, no split-K); for verify passes use "
                "TritonDecoder(..., max_query=...)")
        if format not in STEP_FORMATS:
            raise ValueError(f"format={format!r}: one of {STEP_FORMATS}")
        check_keys("EightBitDecoder(eight_bit=...)", eight_bit, EIGHT_BIT)
        if isinstance(matrices, str) or not set(matrices) <= set(EIGHT_BIT):
            raise ValueError(f"matrices={matrices!r}: a tuple of some of {EIGHT_BIT}, "
                             "e.g. ('gate_up',)")
        if device is None and not hasattr(model, "config"):  # as the parent decides
            device = "cpu" if INTERPRETED else "cuda"
        model = load_llama(model, device=device)  # held here: fp8 reads its matrices
        super().__init__(model, batch, capacity, weights=weights, max_query=1,
                         device=device, **options)
        check_format(format, _capability(self.device))  # fp8_cvt: sm_89 or later
        self.format = format
        self.matrices = tuple(m for m in EIGHT_BIT if m in matrices)
        tilings = {**eight_bit_configs(self.on_gpu), **(eight_bit or {})}
        ks = {"o": self.n_heads * self.head_dim, "gate_up": self.x.numel(),
              "down": self.h.numel()}
        self.configs8 = {m: self._fit8(*tilings[m], ks[m]) for m in EIGHT_BIT}
        own = weights_of(model).layers if format.startswith("fp8") else self.layers
        layers = [replace(layer, **{m: to_format(getattr(src, m), format)
                                    for m in self.matrices})
                  for layer, src in zip(self.layers, own)]
        self.layers = layers
        self.model_weights = replace(self.model_weights, layers=layers)

    def _fit8(self, config: GemvConfig, fold: int, k: int) -> tuple[GemvConfig, int]:
        if config.split_k != 1:
            raise ValueError(f"split_k={config.split_k} for an eight-bit matrix: its "
                             "kernels do not split K")
        config = config.fit(k)
        block_k = min(config.block_k, triton.next_power_of_2(k))
        if fold < 1 or fold & (fold - 1):
            raise ValueError(f"fold={fold}: a power of two")
        if self.format == "dp4a":
            return config, 1
        return config, max(1, min(fold, block_k // 4))

    def tensors(self) -> list[torch.Tensor]:
        """The parent's, each FP8 matrix given as its bytes and its scales (the
        parent's `unpack` knows int8 matrices only)."""
        return [t for item in super().tensors() for t in
                ((item.q, item.scale) if isinstance(item, Fp8Matrix) else (item,))]

    def _product(self, name: str, weight, x, out, **fusions) -> None:
        """out = matrix `name` (o, gate_up or down) times x, with its fusions: on the
        eight-bit kernels if it is one of `matrices`, else on the parent's."""
        if name not in self.matrices:
            return super()._product(name, weight, x, out, **fusions)
        config, fold = self.configs8[name]
        fn = eight_bit_gemv.gemv8_silu if name == "gate_up" else eight_bit_gemv.gemv8
        fn(weight, x, out, config=config, pdl=self.pdl, format=self.format, fold=fold,
           **fusions)

    def device_pass(self, query: int = 1, accept: bool = False) -> None:
        """The parent's step (`TritonDecoder.device_pass` at query 1), its o, gate/up
        and down through `_product`; a pass of more tokens refused."""
        if query != 1:
            raise ValueError(f"a pass of {query} tokens: EightBitDecoder runs "
                             "one-token steps; for passes use "
                             "TritonDecoder(..., max_query=...)")
        super().device_pass(query, accept)
