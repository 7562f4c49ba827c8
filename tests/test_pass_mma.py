"""The tensor-core pass kernels (`kernels.pass_mma`, `kernels.pass_mma_heads`, issue 57)
against their PyTorch references: passes of T = 2, 3, 5, 8 and 16 tokens at odd
shapes (N and K not multiples of the block, split-K with a short last split), FP32,
BF16 and int8 weights; misuse refused before a launch; and every kernel compiled for
sm_80, sm_89 and sm_90 at Chapter 6's target's and the 1B model's shapes, 16 tokens,
without spills.

The MMA sums in its own order, so results match within tolerance, not to the bit.
Without a GPU the kernels run under Triton's interpreter, whose tl.dot takes no BF16:
the kernels multiply in FP32 there (`pass_mma.mma`).
"""

import importlib

import pytest
import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import common  # noqa: E402
from gpuinfer.kernels import pass_mma as pm  # noqa: E402
from gpuinfer.kernels import pass_mma_heads as ph  # noqa: E402
from gpuinfer.kernels import tile  # noqa: E402
from gpuinfer.kernels.gemv import gemv_reference, gemv_silu_reference  # noqa: E402
from gpuinfer.kernels.qkv_rope import qkv_rope_reference  # noqa: E402
from gpuinfer.model import quant  # noqa: E402

if common.INTERPRETED:  # ours are not in interpret.MODULES: decorated again, in order
    pm = importlib.reload(pm)
    ph = importlib.reload(ph)

from kernel_checks import (  # noqa: E402,F401
    DEVICE, poisoned, quiet_numpy, randn, rel_err, unspilled_lines)
PDL = common.pdl_supported(DEVICE)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                                 ids=["fp32", "bf16"])
TOKENS = [2, 3, 5, 8, 16]
C = pm.MmaConfig


def per_token(fn, *rows):
    """fn on each row of `rows`, stacked: the reference of a pass."""
    return torch.stack([fn(*(r[t] for r in rows)) for t in range(rows[0].shape[0])])


# (N, K, config): a tile spanning x, four tiles, split-K with a short last split
ODD = [(37, 100, C(16, 128)), (37, 100, C(16, 32)), (37, 100, C(8, 32, split_k=2))]
CASES = [(t, *ODD[i % len(ODD)]) for i, t in enumerate(TOKENS)]


@DTYPES
@pytest.mark.parametrize("normed", [False, True], ids=["plain", "norm"])
@pytest.mark.parametrize("tokens,n,k,config", CASES)
def test_gemv_pass(tokens, n, k, config, normed, dtype):
    w, x = randn(n, k, dtype=dtype, seed=n + tokens), randn(tokens, k, dtype=dtype)
    norm = randn(k, dtype=dtype, scale=0.1) + 1 if normed else None
    res = randn(tokens, n, dtype=dtype)
    out = res.clone()  # the residual in place, as the decoder adds it
    pm.gemv_pass(w, x, out, norm=norm, residual=out, config=config, pdl=PDL)
    ref = per_token(lambda xt, rt: gemv_reference(w, xt, norm=norm, residual=rt),
                    x, res)
    assert rel_err(out, ref) <= TOL[dtype]


@DTYPES
@pytest.mark.parametrize("tokens,n,k,config", CASES)
def test_gemv_silu_pass(tokens, n, k, config, dtype):
    w = randn(2 * n, k, dtype=dtype, seed=n)
    x = randn(tokens, k, dtype=dtype, scale=0.5)
    norm = randn(k, dtype=dtype, scale=0.1) + 1
    out = pm.gemv_silu_pass(w, x, poisoned(tokens, n, dtype=dtype), norm=norm,
                            config=config, pdl=PDL)
    ref = per_token(lambda xt: gemv_silu_reference(w, xt, norm=norm), x)
    assert rel_err(out, ref) <= TOL[dtype]


def int8(n, k, seed):
    return quant.quantize_int8(randn(n, k, dtype=torch.bfloat16, seed=seed))


@pytest.mark.parametrize("tokens,n,k,config", CASES[::2])
def test_int8_passes(tokens, n, k, config):
    """int8 weights widened exactly to BF16, the row scale on the sums: as close to
    the dequantized matrix's reference as BF16 weights are to theirs."""
    x = randn(tokens, k, dtype=torch.bfloat16, seed=k)
    norm = randn(k, dtype=torch.bfloat16, scale=0.1) + 1
    res = randn(tokens, n, dtype=torch.bfloat16)
    w, wg = int8(n, k, seed=1), int8(2 * n, k, seed=2)
    out = pm.gemv_pass(w, x, norm=norm, residual=res, config=config, pdl=PDL)
    ref = per_token(lambda xt, rt: gemv_reference(w, xt, norm=norm, residual=rt),
                    x, res)
    assert rel_err(out, ref) <= 1e-2
    out = pm.gemv_silu_pass(wg, x, norm=norm, config=config, pdl=PDL)
    assert rel_err(out, per_token(lambda xt: gemv_silu_reference(wg, xt, norm=norm),
                                  x)) <= 1e-2


def rotary_tables(capacity, head_dim, dtype, theta=500000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=DEVICE) / head_dim)
    angles = torch.arange(capacity, device=DEVICE)[:, None] * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# (tokens, config, last slot): at the cache's end; a pass whose first slots are before 0
ROPE = [(2, C(8, 32, split_k=2), 39), (5, C(16, 64), 39), (16, C(8, 64), 12)]


@DTYPES
@pytest.mark.parametrize("tokens,config,last", ROPE)
def test_qkv_rope_pass(tokens, config, last, dtype):
    heads, kv, d, k, capacity = 4, 2, 16, 100, 40
    w = randn((heads + 2 * kv) * d, k, dtype=dtype, seed=tokens)
    x, norm = randn(tokens, k, dtype=dtype), randn(k, dtype=dtype, scale=0.1) + 1
    cos, sin = rotary_tables(capacity, d, dtype)
    q = poisoned(tokens, heads * d, dtype=dtype)
    k_cache, v_cache = (poisoned(kv, capacity, d, dtype=dtype) for _ in range(2))
    ph.qkv_rope_pass(w, x, q, k_cache, v_cache, cos, sin,
                     torch.tensor([last], device=DEVICE), n_heads=heads, norm=norm,
                     config=config, pdl=PDL)
    written = torch.zeros(capacity, dtype=torch.bool)
    for t in range(tokens):
        slot = last - tokens + 1 + t
        rq, rk, rv = qkv_rope_reference(w, x[t], cos, sin, max(slot, 0), n_heads=heads,
                                        n_kv=kv, norm=norm)
        if slot >= 0:
            assert rel_err(q[t], rq) <= TOL[dtype]
            assert rel_err(k_cache[:, slot], rk) <= TOL[dtype]
            assert rel_err(v_cache[:, slot], rv) <= TOL[dtype]
            written[slot] = True
    assert k_cache[:, ~written].isnan().all() and v_cache[:, ~written].isnan().all()


@DTYPES
@pytest.mark.parametrize("mode", ["inline", "reduce-kernel", "accept-kernel"])
@pytest.mark.parametrize("tokens,weights", [(3, "dense"), (8, "int8"), (16, "dense")])
def test_lm_head_argmax_pass(tokens, weights, mode, dtype):
    """Each token's logits against the reference; then with `accept` the proposals
    taken up to the first that is not the kernel's own choice (none, the first two, all
    of them agreeing), the choices written after them, pos moved to the last slot
    written; by the last lm_head program, by one reduce program after, or by a program
    a token (`accept_kernel`, given a `PassArgmaxWorkspace`)."""
    if weights == "int8" and dtype is torch.float32:
        pytest.skip("int8 weights serve BF16 activations")
    vocab, k = 300, 100
    if weights == "int8":
        w = int8(vocab, k, seed=tokens)
    else:
        w = randn(vocab, k, dtype=dtype, seed=tokens)
    x, norm = randn(tokens, k, dtype=dtype), randn(k, dtype=dtype, scale=0.1) + 1
    logits = poisoned(tokens, vocab, dtype=dtype)
    row = torch.zeros(40, device=DEVICE, dtype=torch.long)
    pos = torch.tensor([20], device=DEVICE)
    inline, blocks = mode == "inline", -(-vocab // 16)
    ws = ph.PassArgmaxWorkspace(DEVICE, blocks, rows=tokens) \
        if mode == "accept-kernel" else None
    run = dict(norm=norm, config=C(16, 32), inline=inline, pdl=PDL, workspace=ws)
    ph.lm_head_argmax_pass(w, x, logits, row, pos, **run)
    ref = per_token(lambda xt: gemv_reference(w, xt, norm=norm), x)
    assert rel_err(logits, ref) <= TOL[dtype]
    choices = logits.float().argmax(-1)
    assert int(pos) == 21 and int(row[21]) == int(choices[-1])
    # a verify pass at slots 21 - tokens + 1 ... 21: proposals = slots after the first
    first = 21 - tokens + 1
    for agreeing in sorted({0, min(2, tokens - 1), tokens - 1}):
        row.zero_()
        row[first + 1: first + 1 + agreeing] = choices[:agreeing]
        row[first + 1 + agreeing: 22] = (choices[agreeing: tokens - 1] + 1) % vocab
        pos.fill_(21)
        ph.lm_head_argmax_pass(w, x, logits, row, pos, accept=True, **run)
        kept = agreeing + 1  # the agreeing proposals, then the target's own token
        assert int(pos) == first + kept, agreeing
        assert row[first + 1: first + 1 + kept].tolist() == choices[:kept].tolist()
        assert row[first + 1 + kept: 22].tolist() == \
            ((choices[kept: tokens - 1] + 1) % vocab).tolist()  # refused ones stay


# --------------------------------------------------------------------------------------
# Misuse, refused before a launch
# --------------------------------------------------------------------------------------


def test_a_pass_into_a_one_token_buffer_is_refused():
    """The check the step kernels share (`gemv.pass_outputs`): out or residual of one
    token's shape for a pass of 3, refused with both shapes named."""
    n, k = 16, 32
    w, x = randn(n, k), randn(3, k)
    with pytest.raises(ValueError, match=r"out of shape \(16,\).*pass of shape \(3, "):
        pm.gemv_pass(w, x, torch.zeros(n, device=DEVICE))
    with pytest.raises(ValueError, match=r"residual of shape \(16,\).*\(3, 16\)"):
        pm.gemv_pass(w, x, residual=torch.zeros(n, device=DEVICE))
    with pytest.raises(ValueError, match=r"out of shape \(3, 32\).*\(3, 16\)"):
        pm.gemv_silu_pass(randn(2 * n, k), x, torch.zeros(3, 2 * n, device=DEVICE))
    with pytest.raises(ValueError, match=r"logits of shape \(16,\).*\(3, 16\)"):
        ph.lm_head_argmax_pass(w, x, torch.zeros(n, device=DEVICE),
                               torch.zeros(8, device=DEVICE, dtype=torch.long),
                               torch.zeros(1, device=DEVICE, dtype=torch.long))


@pytest.mark.parametrize("x", [torch.zeros(32), torch.zeros(17, 32), torch.zeros(3, 31),
                               torch.zeros(32, 3).t()],
                         ids=["one-vector", "17-tokens", "wrong-k", "not-contiguous"])
def test_x_of_another_shape_is_refused(x):
    with pytest.raises(ValueError, match=r"x of shape .*\(tokens, 32\)"):
        pm.gemv_pass(randn(16, 32), x.to(DEVICE))


def test_other_misuse_is_refused():
    x = randn(3, 32)
    with pytest.raises(ValueError, match="weights of torch.bfloat16 for x of"):
        pm.gemv_pass(randn(16, 32, dtype=torch.bfloat16), x)
    with pytest.raises(ValueError, match="block_k=8"):
        C(16, 8)
    with pytest.raises(ValueError, match="not a power of two"):
        C(12, 64)
    with pytest.raises(ValueError, match="workspace too small"):
        pm.gemv_pass(randn(64, 64), randn(3, 64), config=C(16, 16, split_k=4),
                     workspace=common.Workspace(DEVICE))
    with pytest.raises(ValueError, match="no split-K"):
        ph.lm_head_argmax_pass(randn(16, 32), x, randn(3, 16), torch.zeros(8),
                               torch.zeros(1), config=C(16, 16, split_k=2))
    cache, table = randn(2, 8, 16), randn(8, 16)
    with pytest.raises(ValueError, match=r"q of shape \(128,\).*\(3, 64\)"):
        ph.qkv_rope_pass(randn(128, 32), x, randn(128), cache, cache, table, table,
                         torch.tensor([5]), n_heads=4)


def test_split_k_leaves_the_counters_at_zero_and_repeats_to_the_bit():
    w, x, config = randn(70, 200, seed=3), randn(5, 200), C(16, 32, split_k=4)
    ws = common.Workspace(DEVICE, 16 * 4 * 5 * 8, 5)
    first = pm.gemv_pass(w, x, config=config, workspace=ws, pdl=PDL)
    assert torch.all(ws.counters == 0)
    assert torch.equal(first, pm.gemv_pass(w, x, config=config, workspace=ws, pdl=PDL))


# --------------------------------------------------------------------------------------
# Compiled for the book's GPUs (no GPU needed)
# --------------------------------------------------------------------------------------

# Run without TRITON_INTERPRET: every pass kernel at 16 tokens, `mma_configs`' tiling
# (and the argmax's two reducers, one program or one a token),
# for Chapter 6's target and the 1B model; BF16 everywhere, int8 at the 1B shape, FP32
# at the target's on sm_90. A line a kernel; exit 1 if any spills.
AOT_SCRIPT = """
import sys, torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.pass_mma import gemv_pass, gemv_silu_pass, mma_configs
from gpuinfer.kernels.pass_mma_heads import (PassArgmaxWorkspace, lm_head_argmax_pass,
                                             qkv_rope_pass)
from gpuinfer.model.configs import model_config
from gpuinfer.model.quant import Int8Matrix
T = 16
target = model_config("tiny", vocab_size=8192, hidden_size=1024,
                      intermediate_size=2816, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=4)
spilled = 0
for sm in aot.TARGETS:
    runs = [("target", target, torch.bfloat16, False), ("1b", model_config("1b"),
            torch.bfloat16, False), ("1b", model_config("1b"), torch.bfloat16, True)]
    if sm == 90:
        runs.append(("target", target, torch.float32, False))
    for label, cfg, dt, int8 in runs:
        c = mma_configs(cfg, gpu=True, weights="int8" if int8 else
                        "fp32" if dt == torch.float32 else "bf16")
        t = lambda *s, d=dt: torch.empty(s, dtype=d)
        m = lambda n, k: Int8Matrix(t(n, k, d=torch.int8), t(n)) if int8 else t(n, k)
        h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        d = h // cfg.num_attention_heads
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        cache, table, pos = t(kv, 64, d), t(64, d), t(1, d=torch.long)
        x, pdl = t(T, h), aot.pdl_for(sm)
        with aot.compile_only(sm) as done:
            qkv_rope_pass(m((heads + 2 * kv) * d, h), x, t(T, heads * d), cache, cache,
                          table, table, pos, n_heads=heads, norm=t(h), config=c["qkv"],
                          pdl=pdl)
            gemv_pass(m(h, heads * d), t(T, heads * d), x, residual=x, config=c["o"],
                      pdl=pdl)
            gemv_silu_pass(m(2 * i, h), x, t(T, i), norm=t(h), config=c["gate_up"],
                           pdl=pdl)
            gemv_pass(m(h, i), t(T, i), x, residual=x, config=c["down"], pdl=pdl)
            lm_head_argmax_pass(m(v, h), x, t(T, v), t(64, d=torch.long), pos,
                                norm=t(h), config=c["lm_head"], inline=False, pdl=pdl)
            ws = PassArgmaxWorkspace("cpu", -(-v // c["lm_head"].block_n), rows=T)
            lm_head_argmax_pass(m(v, h), x, t(T, v), t(64, d=torch.long), pos,
                                norm=t(h), config=c["lm_head"], inline=False,
                                accept=True, pdl=pdl, workspace=ws)
        for name, _, kernel in done:
            assert aot.cubin_capability(kernel) == sm, name
            use = aot.resource_usage(kernel)
            spilled += use["stack"] > 0
            kind = str(dt)[6:] + (" int8" if int8 else "")
            print(f"sm_{sm} {label} {kind} {name} {use}")
sys.exit(1 if spilled else 0)
"""


def test_pass_kernels_compile_for_sm_80_89_90_without_spills():
    """What the interpreter cannot check: each kernel compiles for the A100, the L4 and
    Hopper (PDL on sm_90 only, `aot.pdl_for`), and its registers hold 16 tokens' tiles
    without spilling."""
    # 8 launches a run: 5 products, argmax_reduce, the lm_head again and accept_kernel
    lines, out = unspilled_lines(AOT_SCRIPT, 3 * 3 * 8 + 8)
    for sm in (80, 89, 90):
        for kernel in ("qkv_rope_pass_kernel", "gemv_pass_kernel",
                       "gemv_silu_pass_kernel", "lm_head_pass_kernel", "accept_kernel"):
            assert any(line.startswith(f"sm_{sm} ") and kernel in line
                       for line in lines), out


@triton.jit
def _both_norms(x_ptr, g_ptr, r_ptr, a_ptr, b_ptr, n, DT: tl.constexpr,
                BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    g = tl.load(g_ptr + i, mask=i < n)
    r = tl.load(r_ptr + i, mask=i < n)
    tl.store(a_ptr + i, tile.normed(x, g, r, DT), mask=i < n)
    tl.store(b_ptr + i, tile.normed_cvt(x, g, r, DT), mask=i < n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_pass_norm_rounds_by_conversion_to_the_same_bits(dtype):
    """The pass's products round x's norm by conversion instructions
    (`tile.normed_cvt`), the step's by integer operations (`tile.normed`): the same
    bits on 4 M values, a quarter of them ties (halfway between two of the dtype)."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(1 << 22, device=DEVICE, generator=g) * 8
    ties = x.view(torch.int32) & ~0xFFFF | 0x8000  # BF16's halfway points
    x[: 1 << 20] = ties[: 1 << 20].view(torch.float32)
    gain = 1 + 0.1 * torch.randn(x.shape, device=DEVICE, generator=g)
    rstd = torch.rand(x.shape, device=DEVICE, generator=g) * 4
    rstd[1 << 20: 1 << 21] = 1  # the ties reach the first rounding unscaled
    a, b = torch.empty_like(x), torch.empty_like(x)
    _both_norms[(triton.cdiv(x.numel(), 1024),)](
        x, gain, rstd, a, b, x.numel(), DT=tl.bfloat16 if dtype == torch.bfloat16
        else tl.float16, BLOCK=1024)
    same = a.view(torch.int32) == b.view(torch.int32)
    assert bool(same.all()), f"{int((~same).sum())} of {x.numel()} differ"
