"""The eight-bit GEMV designs of issue 58 (`kernels.eight_bit`, `eight_bit_gemv`):
each kernel against its PyTorch reference under Triton's interpreter (on the GPU where
there is one), the FP8 quantizer's round trip, misuse refused, and every kernel compiled
for sm_80, sm_89 and sm_90 at the 1B shapes without spills."""

import importlib

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import eight_bit, eight_bit_gemv  # noqa: E402
from gpuinfer.model import quant  # noqa: E402

if not torch.cuda.is_available():  # decorated before use_interpreter by another test?
    for mod in (eight_bit, eight_bit_gemv):
        if not isinstance(mod.rows_dot8 if mod is eight_bit_gemv else mod.fold,
                          __import__("triton").runtime.interpreter.InterpretedFunction):
            importlib.reload(mod)
    eight_bit_gemv = importlib.reload(eight_bit_gemv)

from gpuinfer.kernels.eight_bit import fp8_rows  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig  # noqa: E402

E = eight_bit_gemv
from kernel_checks import (  # noqa: E402,F401
    DEVICE, compiled_run, fixed_randn, quiet_numpy, rel_err, run_output)
CAP = torch.cuda.get_device_capability() if DEVICE == "cuda" else (9, 0)
FMTS = [f for f in eight_bit.FORMATS if f != "fp8_cvt" or CAP >= (8, 9)]


def weights(fmt, n, k, seed):
    w = fixed_randn(n, k, dtype=torch.bfloat16, seed=seed, scale=0.05)
    return fp8_rows(w) if fmt.startswith("fp8") else quant.quantize_int8(w)


# N, K not multiples of the block (K a multiple of 4: dp4a reads words); 2 and 3 tiles
ODD = [(37, 100, GemvConfig(16, 32)), (21, 172, GemvConfig(8, 64, num_warps=2))]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,config", ODD)
def test_gemv8_matches_its_reference(fmt, dtype, n, k, config):
    w, x = weights(fmt, n, k, seed=n + k), fixed_randn(k, dtype=dtype, seed=1)
    norm = fixed_randn(k, dtype=dtype, scale=0.1, seed=2) + 1
    res = fixed_randn(n, dtype=dtype, seed=3)
    fold, ahead = (1, False) if fmt == "dp4a" else (4, config.block_k == 64)
    out = E.gemv8(w, x, norm=norm, residual=res, config=config, format=fmt, fold=fold,
                  ahead=ahead)
    ref = E.gemv8_reference(w, x, norm=norm, residual=res, format=fmt)
    assert rel_err(out, ref) <= (1e-5 if dtype == torch.float32 else 1e-2)
    if fmt == "dp4a":  # x's quantization: near the product with the exact x
        assert rel_err(out, E.gemv8_reference(w, x, norm=norm, residual=res)) <= 2e-2


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv8_silu_matches_its_reference(fmt, dtype):
    n, k, config = 21, 172, GemvConfig(8, 64)
    w, x = weights(fmt, 2 * n, k, seed=5), fixed_randn(k, dtype=dtype, seed=6)
    norm = fixed_randn(k, dtype=dtype, scale=0.1, seed=7) + 1
    ahead = fmt != "dp4a"
    out = E.gemv8_silu(w, x, norm=norm, config=config, format=fmt, ahead=ahead)
    ref = E.gemv8_silu_reference(w, x, norm=norm, format=fmt)
    assert rel_err(out, ref) <= (1e-5 if dtype == torch.float32 else 1e-2)


def test_fp8_bits_and_cvt_give_the_same_sums():
    """Every e4m3 byte but the NaNs, through the bits and (interpreted: the same bits,
    rescaled) through the conversion: equal to the bit."""
    b = torch.arange(256, dtype=torch.int32)
    b = b[(b & 0x7F) != 0x7F].to(torch.uint8)
    q = b.repeat(2)[:2 * 256 - 4].view(4, -1)[:, :124].contiguous()
    w = eight_bit.Fp8Matrix(q.to(DEVICE), fixed_randn(4, scale=0.01, seed=8).abs() + 1e-3)
    x = fixed_randn(124, seed=9)
    bits = E.gemv8(w, x, config=GemvConfig(4, 64), format="fp8_bits")
    assert rel_err(bits, E.gemv8_reference(w, x, format="fp8_bits")) <= 1e-6
    if "fp8_cvt" in FMTS:
        cvt = E.gemv8(w, x, config=GemvConfig(4, 64), format="fp8_cvt")
        assert torch.equal(bits, cvt)


def test_fp8_rows_round_trip():
    """e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4 an element in its
    normal range, ~2-3 % of a Gaussian matrix's norm (int8: ~1 %)."""
    w = fixed_randn(256, 2048, seed=10, scale=0.02)
    m = fp8_rows(w)
    assert m.q.dtype == torch.uint8 and m.scale.dtype == torch.float32
    err = rel_err(m.dequantized(), w)
    assert err <= 0.04
    assert torch.allclose(m.dequantized().abs().amax(1), w.abs().amax(1), rtol=1e-6)
    i8 = rel_err(quant.quantize_int8(w).dequantized(torch.float32), w)
    print(f"round trip: fp8 e4m3 {err:.4f}, int8 {i8:.4f}")
    z = fp8_rows(torch.zeros(2, 8))
    assert torch.equal(z.dequantized(), torch.zeros(2, 8))


def test_x_quantized_per_token_as_the_reference():
    """dp4a's x: q = round(x * 127 / max|x|), ties to even, all-zero x to zeros."""
    x = torch.tensor([0.5, -1.0, 0.25, 127 / 254 * 1.0, 0.0, 1 / 254])
    q, s = eight_bit.quantize_x_reference(x)
    assert q.tolist() == [64, -127, 32, 64, 0, 0] and abs(s - 1 / 127) < 1e-9
    q0, s0 = eight_bit.quantize_x_reference(torch.zeros(4))
    assert q0.tolist() == [0] * 4 and s0 == 0


@pytest.mark.parametrize("call,match", [
    (lambda: E.gemv8(weights("int8", 8, 16, 1), fixed_randn(16), format="fp8_bits"),
     "takes an Fp8Matrix"),
    (lambda: E.gemv8(weights("fp8_bits", 8, 16, 1), fixed_randn(16), format="int8"),
     "takes an Int8Matrix"),
    (lambda: E.gemv8(weights("int8", 8, 16, 1), fixed_randn(16), format="int4"), "one of"),
    (lambda: E.gemv8(weights("int8", 8, 16, 1), fixed_randn(2, 16)), "one contiguous"),
    (lambda: E.gemv8(weights("int8", 8, 16, 1), fixed_randn(16).to(torch.float64)),
     "FP32, BF16 or FP16"),
    (lambda: E.gemv8(weights("int8", 8, 18, 1), fixed_randn(18), format="dp4a"),
     "multiple of 4"),
    (lambda: E.gemv8(weights("int8", 8, 16, 1), fixed_randn(16),
                     config=GemvConfig(8, 16, 2)), "do not split"),
    (lambda: E.gemv8(weights("int8", 8, 64, 1), fixed_randn(64), fold=3), "fold=3"),
    (lambda: E.gemv8(weights("int8", 8, 64, 1), fixed_randn(64), format="dp4a", fold=2),
     "1 for dp4a"),
    (lambda: E.gemv8_silu(weights("int8", 7, 16, 1), fixed_randn(16)), "even number"),
    (lambda: eight_bit.fp8_rows(torch.ones(4, dtype=torch.int8)), "2-D floating"),
    (lambda: eight_bit.check_format("fp8_cvt", 80), "sm_89 or later"),
])
def test_misuse_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# Compiled (no TRITON_INTERPRET): every kernel, every format its target has, for the
# step's gate/up and down at the 1B shapes, then fp8_cvt for sm_80, which must not.
AOT_SCRIPT = """
import contextlib, io, sys, torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.eight_bit_gemv import eight_bit_launches
bad = 0
for cap in aot.TARGETS:
    for name, launch in eight_bit_launches(cap):
        with aot.compile_only(cap) as done:
            launch()
        use = aot.resource_usage(done[-1][2])
        assert aot.cubin_capability(done[-1][2]) == cap
        bad += use["stack"] > 0
        print(f"sm_{cap} {name:32s} {use}")
try:
    with contextlib.redirect_stdout(io.StringIO()), aot.compile_only(80):
        dict(eight_bit_launches(89))["gate_up fp8_cvt fold 16"]()
    print("fp8_cvt on sm_80: compiled")
except Exception as e:
    print("fp8_cvt on sm_80:", type(e).__name__)
sys.exit(1 if bad else 0)
"""


def test_eight_bit_kernels_compile_for_sm_80_89_90_without_spills():
    proc = compiled_run(AOT_SCRIPT)
    out = run_output(proc)
    print(out)
    assert proc.returncode == 0, out
    for cap in (80, 89, 90):
        assert f"sm_{cap} gate_up dp4a" in out and f"sm_{cap} down fp8_bits" in out
    assert "sm_80 gate_up fp8_cvt" not in out and "sm_90 gate_up fp8_cvt" in out
    assert "fp8_cvt on sm_80: compiled" not in out
