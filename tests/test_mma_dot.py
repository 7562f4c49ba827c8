"""A tile's product in independent MMA chains (`kernels.mma_dot`, `MmaConfig.chains`):
a pass's products with 2, 4 and 8 chains against their PyTorch references at odd
shapes (N and K not multiples of the block, a short last tile, split-K), FP32, BF16
and int8 weights; chains that do not divide a tile refused when the config is made;
and the chained kernels compiled for sm_90 without spills at the 1B model's shapes."""

import importlib

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import common  # noqa: E402
from gpuinfer.kernels import mma_dot  # noqa: E402
from gpuinfer.kernels import pass_mma as pm  # noqa: E402
from gpuinfer.kernels import pass_mma_heads as ph  # noqa: E402
from gpuinfer.kernels.gemv import gemv_reference, gemv_silu_reference  # noqa: E402
from gpuinfer.model import quant  # noqa: E402

if common.INTERPRETED:  # ours are not in interpret.MODULES: decorated again, in order
    mma_dot = importlib.reload(mma_dot)
    pm = importlib.reload(pm)
    ph = importlib.reload(ph)

from kernel_checks import (  # noqa: E402,F401
    DEVICE, quiet_numpy, randn, rel_err, unspilled_lines)
PDL = common.pdl_supported(DEVICE)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
C = pm.MmaConfig


def test_chains_must_divide_a_tile_into_mma_widths():
    with pytest.raises(ValueError, match="chains=3"):
        C(16, 128, chains=3)
    with pytest.raises(ValueError, match=r"chains=16 for block_k=128"):
        C(16, 128, chains=16)
    assert C(16, 1024, chains=8).fit(100) == C(16, 128, chains=8)
    assert C(16, 1024, chains=16).fit(100) == C(16, 128, chains=8)  # 16 columns each
    assert C(16, 1024, chains=4).fit(20).chains == 2


# (tokens, N, K, config): one tile spanning K, a short last tile, split-K
CASES = [(2, 37, 100, C(16, 128, chains=8)), (5, 37, 300, C(8, 128, chains=2)),
         (8, 29, 200, C(8, 64, split_k=2, chains=4)), (16, 21, 96, C(16, 32, chains=2))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens,n,k,config", CASES)
def test_gemv_pass_in_chains(tokens, n, k, config, dtype):
    w, x = randn(n, k, dtype=dtype, seed=n + tokens), randn(tokens, k, dtype=dtype)
    norm = randn(k, dtype=dtype, scale=0.1) + 1
    res = randn(tokens, n, dtype=dtype)
    out = res.clone()
    pm.gemv_pass(w, x, out, norm=norm, residual=out, config=config, pdl=PDL)
    ref = torch.stack([gemv_reference(w, x[t], norm=norm, residual=res[t])
                       for t in range(tokens)])
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("tokens,n,k,config", CASES[:2])
def test_gemv_silu_pass_in_chains_int8(tokens, n, k, config):
    w = quant.quantize_int8(randn(2 * n, k, dtype=torch.bfloat16, seed=n))
    x = randn(tokens, k, dtype=torch.bfloat16, scale=0.5)
    out = pm.gemv_silu_pass(w, x, config=config, pdl=PDL)
    ref = torch.stack([gemv_silu_reference(w, x[t]) for t in range(tokens)])
    assert rel_err(out, ref) <= TOL[torch.bfloat16]


def test_chains_agree_with_one_chain_in_fp32():
    """Only the order of the sums differs: FP32 passes agree to rounding."""
    w, x = randn(40, 512, seed=3), randn(5, 512)
    one = pm.gemv_pass(w, x, config=C(8, 256))
    for chains in (2, 4, 8, 16):
        got = pm.gemv_pass(w, x, config=C(8, 256, chains=chains))
        assert rel_err(got, one) <= 1e-6, chains


def test_lm_head_argmax_pass_in_chains():
    """The head's logits and the last token's choice, written after the pass's slot."""
    n, k, tokens = 45, 64, 3
    w, x = randn(n, k, seed=9), randn(tokens, k)
    logits = torch.empty(tokens, n, device=DEVICE)
    row = torch.zeros(40, dtype=torch.long, device=DEVICE)
    pos = torch.tensor([20], device=DEVICE)
    ph.lm_head_argmax_pass(w, x, logits, row, pos, config=C(16, 64, chains=4),
                           pdl=PDL)
    ref = torch.stack([gemv_reference(w, x[t]) for t in range(tokens)])
    assert rel_err(logits, ref) <= TOL[torch.float32]
    assert int(pos) == 21 and int(row[21]) == int(ref[-1].argmax())


# Run without TRITON_INTERPRET: the pass's GEMV kernels at 16 tokens with one tile of
# 1024 columns a program cut into 8 and 16 chains, at the 1B model's shapes, for sm_90.
AOT_SCRIPT = """
import torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.pass_mma import MmaConfig, gemv_pass, gemv_silu_pass
from gpuinfer.model.configs import model_config
cfg, T = model_config("1b"), 16
h, i = cfg.hidden_size, cfg.intermediate_size
t = lambda *s: torch.empty(s, dtype=torch.bfloat16)
for chains in (8, 16):
    c = MmaConfig(16, 1024, chains=chains, num_stages=2)
    with aot.compile_only(90) as done:
        gemv_silu_pass(t(2 * i, h), t(T, h), t(T, i), norm=t(h),
                       config=MmaConfig(8, 1024, chains=chains, num_stages=2), pdl=True)
        gemv_pass(t(h, i), t(T, i), t(T, h), residual=t(T, h), config=c, pdl=True)
    for name, _, kernel in done:
        print(chains, name, aot.resource_usage(kernel))
"""


def test_chained_kernels_compile_for_sm_90_without_spills():
    unspilled_lines(AOT_SCRIPT, 4)
