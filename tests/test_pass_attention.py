"""A pass's attention in one program per key/value head (`kernels.pass_attention`)
against each token's attention computed apart: token t of a pass ending at pos sees
the slots up to pos - T + 1 + t. Odd groups, passes that open the cache, straddle the
first tile's edge and end it; outputs poisoned with NaN. Under Triton's interpreter
without a GPU."""

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import attention as at  # noqa: E402
from gpuinfer.kernels import common  # noqa: E402
from gpuinfer.kernels.pass_attention import pass_attention  # noqa: E402

from kernel_checks import (  # noqa: E402
    DEVICE, compiled_run, poisoned, randn, rel_err, run_output, unspilled_lines)

PDL = common.pdl_supported(DEVICE)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def tokens_apart(q, k_cache, v_cache, pos):
    """Each token's attention over the slots up to its own, by the PyTorch reference."""
    tokens = q.shape[0]
    return torch.stack([at.decode_attention_reference(q[t], k_cache, v_cache,
                                                      pos - tokens + 1 + t)
                        for t in range(tokens)])


@pytest.mark.parametrize("tokens,group,dtype", [(2, 4, torch.float32),
                                                (5, 3, torch.float32),
                                                (5, 4, torch.bfloat16),
                                                (16, 1, torch.float32),
                                                (16, 4, torch.float32)])
def test_each_token_sees_the_slots_up_to_its_own(tokens, group, dtype):
    kv, d, capacity = 2, 16, 40
    q = randn(tokens, kv * group * d, dtype=dtype, seed=tokens + group)
    k_cache, v_cache = randn(kv, capacity, d, dtype=dtype), randn(kv, capacity, d,
                                                                  dtype=dtype)
    for pos in (tokens - 1, 17, capacity - 1):
        out = poisoned(tokens, kv * group * d, dtype=dtype)
        pass_attention(q, k_cache, v_cache, torch.tensor([pos], device=DEVICE), out,
                       pdl=PDL)
        ref = tokens_apart(q, k_cache, v_cache, pos)
        for t in range(tokens):
            assert rel_err(out[t], ref[t]) <= TOL[dtype], (pos, t)


def test_a_pos_past_the_cache_or_below_zero_reads_only_the_cache():
    """pos is read unchecked (a graph replays whatever it holds): past the cache every
    token sees all of it; below 0, slot 0. Finite either way, nothing read outside."""
    kv, group, d, capacity, tokens = 2, 2, 16, 24, 4
    q = randn(tokens, kv * group * d, seed=1)
    k_cache, v_cache = randn(kv, capacity, d), randn(kv, capacity, d)
    for pos, each in ((capacity + 7, capacity - 1), (-3, 0)):
        out = poisoned(tokens, kv * group * d, dtype=torch.float32)
        pass_attention(q, k_cache, v_cache, torch.tensor([pos], device=DEVICE), out)
        ref = torch.stack([at.decode_attention_reference(q[t], k_cache, v_cache, each)
                           for t in range(tokens)])
        assert torch.isfinite(out).all(), pos
        assert rel_err(out, ref) <= 1e-5, pos


def test_a_cache_longer_than_one_tile_a_pass_of_17_or_8_rows_a_program_is_refused():
    cache = randn(2, 40, 16)
    with pytest.raises(ValueError, match="block_r=8: tl.dot takes at least 16 rows"):
        pass_attention(randn(2, 64), cache, cache, torch.tensor([5], device=DEVICE),
                       block_r=8)
    with pytest.raises(ValueError, match="block_s=32 for a cache of 40 slots"):
        pass_attention(randn(2, 64), cache, cache, torch.tensor([5], device=DEVICE),
                       block_s=32)
    with pytest.raises(ValueError, match=r"1 <= T <= 16"):
        pass_attention(randn(17, 64), cache, cache, torch.tensor([20], device=DEVICE))


def test_an_out_of_another_shape_or_q_of_part_of_a_head_is_refused():
    """Refused before the launch: a one-token out (a pass would write past its end) and
    q columns that are not whole query heads of every key/value head."""
    cache, pos = randn(2, 40, 16), torch.tensor([20], device=DEVICE)
    out = poisoned(64, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"out of shape \(64,\).*q of \(3, 64\)"):
        pass_attention(randn(3, 64), cache, cache, pos, out)
    assert out.isnan().all()  # untouched
    with pytest.raises(ValueError, match="q of 48 columns for 2 key/value heads of 16"):
        pass_attention(randn(3, 48), cache, cache, pos)


# Run without TRITON_INTERPRET: the kernel for sm_90 (PDL) and sm_80, at the 1B model's
# heads (8 key/value heads of 4 queries, head_dim 64) over 256 slots, 5 and 16 tokens
# (2 and 4 programs a head of 16 rows), BF16 and FP32 (the checks' caches).
AOT_SCRIPT = """
import torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.pass_attention import pass_attention
for cap in (90, 80):
    for dtype in (torch.bfloat16, torch.float32):
        for tokens in (5, 16):
            q = torch.empty(tokens, 32 * 64, dtype=dtype)
            cache = torch.empty(8, 256, 64, dtype=dtype)
            with aot.compile_only(cap) as done:
                pass_attention(q, cache, cache, torch.zeros(1, dtype=torch.long),
                               pdl=aot.pdl_for(cap))
            for name, _, kernel in done:
                print(cap, dtype, tokens, name, aot.resource_usage(kernel))
"""


def test_the_kernel_compiles_for_sm_90_and_sm_80_without_spills():
    unspilled_lines(AOT_SCRIPT, 8)


# The PTX of the pass's attention and the step's, compiled for sm_90 with PDL: where each
# lets the next kernel launch (launch_dependents) against its wait.
PDL_ORDER_SCRIPT = """
import torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.attention import decode_attention
from gpuinfer.kernels.pass_attention import pass_attention
cache = torch.empty(2, 64, 64, dtype=torch.bfloat16)
pos = torch.zeros(1, dtype=torch.long)
with aot.compile_only(90) as done:
    pass_attention(torch.empty(5, 4 * 64, dtype=torch.bfloat16), cache, cache, pos,
                   pdl=True)
    decode_attention(torch.empty(4 * 64, dtype=torch.bfloat16), cache, cache, pos,
                     pdl=True)
for name, _, kernel in done:
    ptx = kernel.asm["ptx"]
    print(name, *(ptx.find(op) for op in ("griddepcontrol.launch_dependents",
                                          "griddepcontrol.wait")))
"""


def test_the_pass_lets_the_o_product_launch_before_its_wait_the_step_after():
    """Under PDL the pass's attention lets the next kernel (o) launch before it waits
    for q/k/v, so that o's weights load meanwhile (a 2-token pass 0.11 steps faster on
    an H100); the step's attention launches it only after its wait (before, it made
    the 1B step 1.3 % slower)."""
    proc = compiled_run(PDL_ORDER_SCRIPT)
    out = run_output(proc)
    assert proc.returncode == 0, out
    found = {name: [int(i) for i in at] for name, *at in
             (line.split() for line in proc.stdout.splitlines())}
    assert "pass_attention_kernel" in found and len(found) >= 2, out
    for name, (launch, wait) in found.items():
        assert launch >= 0 and wait >= 0, (name, out)
        assert (launch < wait) == (name == "pass_attention_kernel"), (name, out)
