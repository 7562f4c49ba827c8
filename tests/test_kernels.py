"""The Triton kernels of the decode step against their PyTorch references, on fresh
random inputs: the chapter's shapes where a CPU can afford them, and odd ones (N and K
not multiples of the block, split-K with a short last split). Outputs are poisoned with
NaN first, so an element a kernel fails to write fails the test.

Without a GPU the kernels run under Triton's interpreter (PDL off). The interpreter
rounds FP32 to BF16 by truncation and its tl.dot cannot multiply BF16; the kernels
round with `round_to` and the attention upcasts there, so BF16 results match
PyTorch's under the interpreter too.
"""

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import embed_head as am  # noqa: E402
from gpuinfer.kernels import attention as at  # noqa: E402
from gpuinfer.kernels import common  # noqa: E402
from gpuinfer.model import quant  # noqa: E402
from gpuinfer.kernels import qkv_rope as rotary  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig, gemv, gemv_reference  # noqa: E402
from gpuinfer.kernels.gemv import gemv_silu, gemv_silu_reference, tokens_of  # noqa: E402

from kernel_checks import (  # noqa: E402,F401
    DEVICE, compiled_run, graphed_chain_error, poisoned, quiet_numpy, randn, rel_err,
    run_output)
PDL = common.pdl_supported(DEVICE)  # on where it runs: an H100/H200
HALF = (torch.bfloat16, torch.float16)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def test_pdl_is_off_where_it_cannot_run():
    assert not common.pdl_supported("cpu")
    if not torch.cuda.is_available():
        assert common.INTERPRETED and not PDL


# --------------------------------------------------------------------------------------
# GEMV
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tiling", [dict(block_n=12), dict(block_k=48)])
def test_a_tiling_that_is_not_a_power_of_two_is_refused_when_made(tiling):
    with pytest.raises(ValueError, match="not a power of two"):
        GemvConfig(**tiling)

ODD = [  # (N, K, config): N, K not multiples of the block; splits with a short last one
    (37, 100, GemvConfig(16, 32)),
    (37, 100, GemvConfig(16, 32, split_k=3)),
    (5, 7, GemvConfig(8, 4, split_k=2)),
    (130, 96, GemvConfig(64, 64, split_k=2, num_warps=8)),
]


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("n,k,config", ODD)
def test_gemv_odd_shapes(n, k, config, dtype):
    w, x = randn(n, k, dtype=dtype, seed=n + k), randn(k, dtype=dtype)
    norm, res = randn(k, dtype=dtype, scale=0.1) + 1, randn(n, dtype=dtype)
    plain = gemv(w, x, poisoned(n, dtype=dtype), config=config, pdl=PDL)
    assert rel_err(plain, gemv_reference(w, x)) <= TOL[dtype]
    fused = gemv(w, x, poisoned(n, dtype=dtype), norm=norm, residual=res, config=config,
                 pdl=PDL)
    assert rel_err(fused, gemv_reference(w, x, norm=norm, residual=res)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,config", ODD[:2] + [(96, 64, GemvConfig(32, 64, 2))])
def test_gemv_silu_odd_shapes(n, k, config, dtype):
    w, x = randn(2 * n, k, dtype=dtype, seed=n), randn(k, dtype=dtype, scale=0.5)
    norm = randn(k, dtype=dtype, scale=0.1) + 1
    out = gemv_silu(w, x, poisoned(n, dtype=dtype), norm=norm, config=config, pdl=PDL)
    assert rel_err(out, gemv_silu_reference(w, x, norm=norm)) <= TOL[dtype]



def tiling(interpreted: GemvConfig, compiled: GemvConfig) -> GemvConfig:
    """Few large programs for the interpreter (each is a Python call); on a GPU a tile
    that fits the registers (a 1M-element tile would take ptxas minutes to compile)."""
    return compiled if torch.cuda.is_available() else interpreted


# The 1B step's matrices (lm_head, 1 GB in FP32, only on a GPU)
CHAPTER = [("qkv", 3072, 2048, tiling(GemvConfig(512, 2048),
                                      GemvConfig(8, 2048, 1, 8))),
           ("o", 2048, 2048, tiling(GemvConfig(512, 2048, 2),
                                    GemvConfig(8, 1024, 2, 4))),
           ("down", 2048, 8192, tiling(GemvConfig(512, 2048, 2),
                                       GemvConfig(8, 2048, 2, 8)))]


@pytest.mark.parametrize("name,n,k,config", CHAPTER, ids=[c[0] for c in CHAPTER])
def test_gemv_chapter_shapes(name, n, k, config):
    w, x = randn(n, k, seed=1), randn(k)
    res, norm = randn(n), randn(k, scale=0.1) + 1
    out = gemv(w, x, poisoned(n, dtype=torch.float32), norm=norm, residual=res,
               config=config, pdl=PDL)
    assert rel_err(out, gemv_reference(w, x, norm=norm, residual=res)) <= 1e-5


def test_gemv_silu_chapter_shape():
    w, x = randn(16384, 2048, seed=2), randn(2048, scale=0.5)
    norm = randn(2048, scale=0.1) + 1
    out = gemv_silu(w, x, poisoned(8192, dtype=torch.float32), norm=norm,
                    config=tiling(GemvConfig(256, 2048), GemvConfig(4, 2048, 1, 8)),
                    pdl=PDL)
    assert rel_err(out, gemv_silu_reference(w, x, norm=norm)) <= 1e-5


def test_residual_in_place_and_split_k_is_deterministic():
    n, k, config = 70, 200, GemvConfig(16, 32, split_k=4)
    w, x = randn(n, k, seed=3), randn(k)
    ws = common.Workspace(DEVICE, 16 * 4 * 5, 5)
    x0 = randn(n)
    first = x0.clone()
    gemv(w, x, first, residual=first, config=config, pdl=PDL, workspace=ws)
    assert rel_err(first, x0 + w @ x) <= 1e-5
    assert torch.all(ws.counters == 0)  # the last program of each block reset its count
    again = x0.clone()
    gemv(w, x, again, residual=again, config=config, pdl=PDL, workspace=ws)
    assert torch.equal(first, again)  # partials summed in split order, not atomically


def test_workspace_too_small_is_an_error():
    w, x = randn(64, 64), randn(64)
    with pytest.raises(ValueError, match="workspace too small"):
        gemv(w, x, config=GemvConfig(16, 16, split_k=4),
             workspace=common.Workspace(DEVICE))


# --------------------------------------------------------------------------------------
# q/k/v projection with rotary embedding and cache write
# --------------------------------------------------------------------------------------


def rotary_tables(capacity, head_dim, dtype, theta=500000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=DEVICE) / head_dim)
    angles = torch.arange(capacity, device=DEVICE)[:, None] * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


ROPE = [(4, 2, 16, 64, 40, GemvConfig(8, 32, split_k=2)),  # the test model's heads
        (4, 4, 16, 48, 9, GemvConfig(16, 64)),  # no grouping, K = 48 in a 64-wide tile
        (32, 8, 64, 2048, 64, tiling(GemvConfig(256, 2048),  # the 1B model's heads
                                     GemvConfig(4, 2048, 2, 8)))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv,d,k,capacity,config", ROPE)
def test_qkv_rope_writes_q_and_cache_slot(heads, kv, d, k, capacity, config, dtype):
    w = randn((heads + 2 * kv) * d, k, dtype=dtype, seed=heads)
    x = randn(k, dtype=dtype)
    norm = randn(k, dtype=dtype, scale=0.1) + 1
    cos, sin = rotary_tables(capacity, d, dtype)
    slot = capacity - 2
    q = poisoned(heads * d, dtype=dtype)
    k_cache, v_cache = poisoned(kv, capacity, d, dtype=dtype), poisoned(kv, capacity, d,
                                                                        dtype=dtype)
    pos = torch.tensor([slot], device=DEVICE)
    rotary.qkv_rope(w, x, q, k_cache, v_cache, cos, sin, pos, n_heads=heads, norm=norm,
                    config=config, pdl=PDL)
    ref_q, ref_k, ref_v = rotary.qkv_rope_reference(w, x, cos, sin, slot, n_heads=heads,
                                                    n_kv=kv, norm=norm)
    assert rel_err(q, ref_q) <= TOL[dtype]
    assert rel_err(k_cache[:, slot], ref_k) <= TOL[dtype]
    assert rel_err(v_cache[:, slot], ref_v) <= TOL[dtype]
    others = torch.ones(capacity, dtype=torch.bool)
    others[slot] = False
    assert k_cache[:, others].isnan().all() and v_cache[:, others].isnan().all()


# --------------------------------------------------------------------------------------
# Decode attention
# --------------------------------------------------------------------------------------

ATTENTION = [(4, 2, 16, 100, 4, 16), (32, 8, 64, 130, 2, 32), (8, 8, 32, 64, 1, 64),
             (32, 8, 64, 201, 1, 256)]  # the last: a small cache, one program a head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "combine-kernel"])
@pytest.mark.parametrize("heads,kv,d,capacity,n_split,block_s", ATTENTION)
def test_decode_attention(heads, kv, d, capacity, n_split, block_s, inline, dtype):
    q = randn(heads * d, dtype=dtype, seed=capacity)
    k_cache, v_cache = randn(kv, capacity, d, dtype=dtype), randn(kv, capacity, d,
                                                                  dtype=dtype)
    ws = at.AttentionWorkspace(DEVICE, kv, heads // kv, d, n_split)
    # pos 0, the end of the first tile, a chunk boundary, the last slot
    for slot in sorted({0, block_s - 1, block_s, capacity // 3, capacity - 1} &
                       set(range(capacity))):
        pos = torch.tensor([slot], device=DEVICE)
        out = at.decode_attention(q, k_cache, v_cache, pos,
                                  poisoned(heads * d, dtype=dtype), n_split=n_split,
                                  block_s=block_s, inline_combine=inline, pdl=PDL,
                                  workspace=ws)
        ref = at.decode_attention_reference(q, k_cache, v_cache, slot)
        assert rel_err(out, ref) <= TOL[dtype], slot
        assert torch.all(ws.counters == 0)


def test_attention_ignores_slots_past_pos():
    q, k_cache, v_cache = randn(64, seed=5), randn(2, 50, 16), randn(2, 50, 16)
    pos = torch.tensor([20], device=DEVICE)
    first = at.decode_attention(q, k_cache, v_cache, pos, n_split=4, block_s=16)
    k_cache[:, 21:] = float("nan")
    v_cache[:, 21:] = float("nan")
    assert torch.equal(at.decode_attention(q, k_cache, v_cache, pos, n_split=4,
                                           block_s=16), first)


# Any grouped-query group, not only powers of two: Llama-3.2-3B puts 24 query heads on 8
# key/value heads, a group of 3. The kernels pad the group axis to a power of two
# (tl.arange's sizes must be); against the reference on fresh random inputs, the padded
# heads must change no result and write nothing: not past the output, not past the
# partials of the workspace.

GUARD = 4096.0  # exact in BF16 too, and far from any attention output
KV, HEAD_DIM, CAPACITY, N_SPLIT, BLOCK_S = 2, 16, 64, 4, 16
# One split's first slots; a short last split (37: 38 slots, not a multiple of
# BLOCK_S); every slot of every split.
POSITIONS = (5, 37, CAPACITY - 1)


def guarded(n: int, guard: int, dtype) -> torch.Tensor:
    """n elements of NaN (one the kernel fails to write fails the test), then `guard` of
    GUARD (one it writes past the end fails it too): the buffer; [:n] is the tensor
    handed to the kernel."""
    buffer = torch.full((n + guard,), float("nan"), device=DEVICE, dtype=dtype)
    buffer[n:] = GUARD
    return buffer


def untouched(buffer: torch.Tensor, n: int) -> bool:
    return bool((buffer[n:] == GUARD).all())


def run_any_group(group: int, inline: bool, dtype, seed: int, kv=KV, head_dim=HEAD_DIM,
        positions=POSITIONS):
    """Kernel against reference at each position: a fresh workspace whose partials end
    in a guard, an output that does too, each as long as 16 padded rows (GROUP_PAD's
    least) would reach past the last real one."""
    torch.manual_seed(seed)
    heads = kv * group
    q = torch.randn(heads * head_dim, device=DEVICE).to(dtype)
    k_cache = torch.randn(kv, CAPACITY, head_dim, device=DEVICE).to(dtype)
    v_cache = torch.randn(kv, CAPACITY, head_dim, device=DEVICE).to(dtype)
    ws = at.AttentionWorkspace(DEVICE, kv, group, head_dim, N_SPLIT)
    n_partials = ws.partials.numel()
    guard = 16 * (head_dim + 2)
    partials = guarded(n_partials, guard, torch.float32)
    ws.partials = partials[:n_partials]
    for slot in positions:
        out = guarded(heads * head_dim, guard, dtype)
        at.decode_attention(q, k_cache, v_cache, torch.tensor([slot], device=DEVICE),
                            out[: heads * head_dim], n_split=N_SPLIT, block_s=BLOCK_S,
                            inline_combine=inline, pdl=PDL, workspace=ws)
        ref = at.decode_attention_reference(q, k_cache, v_cache, slot)
        assert rel_err(out[: heads * head_dim], ref) <= TOL[dtype], (group, slot)
        assert untouched(out, heads * head_dim), (group, slot)
        assert untouched(partials, n_partials), (group, slot)
        assert torch.all(ws.counters == 0), (group, slot)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "combine-kernel"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 6, 8])
def test_decode_attention_any_group(group, inline, dtype):
    run_any_group(group, inline, dtype, seed=10 * group + inline)


def test_llama_3b_heads():
    """Llama-3.2-3B's attention: 24 query heads on 8 key/value heads of 128."""
    run_any_group(3, True, torch.bfloat16, seed=3, kv=8, head_dim=128, positions=(37,))


@pytest.mark.parametrize("sizes", [dict(head_dim=24), dict(block_s=48),
                                   dict(n_split=3)])
def test_other_sizes_must_still_be_powers_of_two(sizes):
    """Only the group is padded: head_dim, block_s and n_split are tl.arange sizes."""
    head_dim, block_s, n_split = (sizes.get("head_dim", 16), sizes.get("block_s", 16),
                                  sizes.get("n_split", 4))
    q, cache = torch.zeros(3 * head_dim), torch.zeros(1, 64, head_dim)
    name, value = next(iter(sizes.items()))
    with pytest.raises(ValueError, match=f"{name}={value} is not a power of two"):
        at.decode_attention(q, cache, cache, torch.tensor([0]), n_split=n_split,
                            block_s=block_s)


# --------------------------------------------------------------------------------------
# lm_head + argmax, embedding
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "reduce-kernel"])
def test_lm_head_argmax_first_index_wins_ties(inline, dtype):
    vocab, hidden, capacity = 1000, 64, 30
    w, norm = randn(vocab, hidden, dtype=dtype, seed=7), randn(hidden, dtype=dtype,
                                                               scale=0.1) + 1
    w[901] = w[123] = 3 * w[123]  # two equal largest logits: torch.argmax takes 123
    x = (w[123].float() / norm.float()).to(dtype)
    tokens = torch.zeros(capacity, device=DEVICE, dtype=torch.long)
    pos, logits = torch.tensor([11], device=DEVICE), poisoned(vocab, dtype=dtype)
    ws = am.ArgmaxWorkspace(DEVICE, 16, block_r=4)  # 16 blocks in 4 chunks
    am.lm_head_argmax(w, x, logits, tokens, pos, norm=norm, config=GemvConfig(64, 32),
                      inline=inline, pdl=PDL, workspace=ws)
    ref_logits, ref_token = am.lm_head_argmax_reference(w, x, norm=norm)
    assert ref_token == 123
    assert rel_err(logits, ref_logits) <= TOL[dtype]
    assert tokens[12].item() == 123 and pos.item() == 12
    assert tokens[:12].eq(0).all() and tokens[13:].eq(0).all()


def test_lm_head_argmax_random_logits():
    w, x = randn(777, 48, seed=8), randn(48)
    buffer = torch.zeros(6, device=DEVICE, dtype=torch.long)
    tokens = buffer[:4]  # capacity 4
    pos = torch.tensor([2], device=DEVICE)
    logits = poisoned(777, dtype=torch.float32)
    am.lm_head_argmax(w, x, logits, tokens, pos, config=GemvConfig(32, 16), pdl=PDL)
    assert tokens[3].item() == int((w @ x).argmax()) and pos.item() == 3
    am.lm_head_argmax(w, x, logits, tokens, pos, config=GemvConfig(32, 16), pdl=PDL)
    assert pos.item() == 4 and buffer[4:].eq(0).all()  # no write past the capacity


@pytest.mark.parametrize("hidden,block", [(64, 32), (100, 64), (2048, 1024)])
def test_embed_reads_token_at_pos(hidden, block):
    table = randn(50, hidden, seed=hidden)
    tokens = torch.tensor([3, 41, 7], device=DEVICE)
    x = poisoned(hidden, dtype=torch.float32)
    am.embed(table, tokens, torch.tensor([1], device=DEVICE), x, block=block, pdl=PDL)
    assert torch.equal(x, table[41])


# --------------------------------------------------------------------------------------
# int8 weights, one scale per row: the same kernels, against the same references
# --------------------------------------------------------------------------------------


def int8(n, k, seed):
    return quant.quantize_int8(randn(n, k, dtype=torch.bfloat16, seed=seed))


@pytest.mark.parametrize("n,k,config", ODD)
def test_int8_gemv_odd_shapes(n, k, config):
    w, x = int8(n, k, seed=n + k), randn(k, dtype=torch.bfloat16)
    norm, res = randn(k, dtype=torch.bfloat16, scale=0.1) + 1, randn(n,
                                                                     dtype=torch.bfloat16)
    out = gemv(w, x, poisoned(n, dtype=torch.bfloat16), norm=norm, residual=res,
               config=config, pdl=PDL)
    assert rel_err(out, gemv_reference(w, x, norm=norm, residual=res)) <= 1e-2
    # and the reference is the product with the matrix the int8 one stands for
    dense = gemv_reference(w.dequantized(), x, norm=norm, residual=res)
    assert rel_err(out, dense) <= 1e-2


@pytest.mark.parametrize("n,k,config", ODD[:2] + [(96, 64, GemvConfig(32, 64, 2))])
def test_int8_gemv_silu_odd_shapes(n, k, config):
    w, x = int8(2 * n, k, seed=n), randn(k, dtype=torch.bfloat16, scale=0.5)
    norm = randn(k, dtype=torch.bfloat16, scale=0.1) + 1
    out = gemv_silu(w, x, poisoned(n, dtype=torch.bfloat16), norm=norm, config=config,
                    pdl=PDL)
    assert rel_err(out, gemv_silu_reference(w, x, norm=norm)) <= 1e-2


@pytest.mark.parametrize("heads,kv,d,k,capacity,config", ROPE[:2])
def test_int8_qkv_rope(heads, kv, d, k, capacity, config):
    dt = torch.bfloat16
    w, x = int8((heads + 2 * kv) * d, k, seed=heads), randn(k, dtype=dt)
    cos, sin = rotary_tables(capacity, d, dt)
    q = poisoned(heads * d, dtype=dt)
    k_cache, v_cache = poisoned(kv, capacity, d, dtype=dt), poisoned(kv, capacity, d,
                                                                     dtype=dt)
    rotary.qkv_rope(w, x, q, k_cache, v_cache, cos, sin, torch.tensor([3], device=DEVICE),
                    n_heads=heads, config=config, pdl=PDL)
    ref_q, ref_k, ref_v = rotary.qkv_rope_reference(w, x, cos, sin, 3, n_heads=heads,
                                                    n_kv=kv)
    assert rel_err(q, ref_q) <= 1e-2
    assert rel_err(k_cache[:, 3], ref_k) <= 1e-2 and rel_err(v_cache[:, 3], ref_v) <= 1e-2


def every_int8_value(n, k):
    """An Int8Matrix whose rows hold every int8 value, -128 included (quantize_int8
    never makes it; the widening must still be exact), scales of both signs."""
    q = (torch.arange(n * k, device=DEVICE) % 256 - 128).to(torch.int8).view(n, k)
    scale = randn(n, dtype=torch.bfloat16, scale=0.01, seed=n)
    return quant.Int8Matrix(q, scale)


@pytest.mark.parametrize("n,k,config", [(64, 256, GemvConfig(8, 256)),
                                        (33, 512, GemvConfig(4, 128, num_warps=8))])
def test_int8_widening_through_the_bits_is_exact(n, k, config):
    """widen's two ways, through the float bits and by conversion instructions, give
    the same sums to the bit, every byte value included."""
    w, x = every_int8_value(n, k), randn(k, dtype=torch.bfloat16)
    bits, convert = (gemv(w, x, poisoned(n, dtype=torch.bfloat16), config=config,
                          pdl=PDL, int8_widen=way) for way in ("bits", "convert"))
    assert torch.equal(bits, convert)
    assert rel_err(bits, gemv_reference(w, x)) <= 1e-2


def test_int8_widen_must_be_named():
    with pytest.raises(ValueError, match="int8_widen='fast': one of"):
        gemv(int8(8, 16, seed=1), randn(16, dtype=torch.bfloat16), int8_widen="fast")


def test_int8_lm_head_argmax():
    w, x = int8(777, 48, seed=10), randn(48, dtype=torch.bfloat16)
    tokens = torch.zeros(4, device=DEVICE, dtype=torch.long)
    pos, logits = torch.tensor([0], device=DEVICE), poisoned(777, dtype=torch.bfloat16)
    am.lm_head_argmax(w, x, logits, tokens, pos, config=GemvConfig(32, 16), pdl=PDL)
    ref_logits, _ = am.lm_head_argmax_reference(w, x)
    assert rel_err(logits, ref_logits) <= 1e-2
    assert tokens[1].item() == int(logits.float().argmax())


# --------------------------------------------------------------------------------------
# Passes: the T tokens at slots pos - T + 1 ... pos in one launch (a verify pass), each
# token computed exactly as a one-token launch at its slot computes it (torch.equal)
# --------------------------------------------------------------------------------------

T = 3  # a pass's tokens: not a power of two, so the kernels' rows are padded (to 4)

PASS_GEMV = [  # (N, K, config): each way `tile.rows_dots` takes a pass
    (37, 100, GemvConfig(16, 128)),  # one tile spans x: kept, the next x loaded ahead
    (37, 100, GemvConfig(16, 32)),  # four tiles: token after token
    (37, 100, GemvConfig(16, 32, split_k=2)),  # split-K, two tiles a split
    (37, 100, GemvConfig(16, 64, split_k=2)),  # split-K, one tile a split
]


def launches_by_token(launch, *passes):
    """`launch(t, *rows)` once for each token t of a pass, on row t of each of `passes`
    (their copies: the pass's own buffers are left to the pass)."""
    copies = [p.clone() for p in passes]
    for t in range(copies[0].shape[0]):
        launch(t, *(c[t] for c in copies))
    return copies


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("normed", [False, True], ids=["plain", "norm"])
@pytest.mark.parametrize("n,k,config", PASS_GEMV)
def test_gemv_pass_is_its_tokens_steps(n, k, config, normed, dtype):
    """out += W @ [RMSNorm](x) for T tokens at once, the residual in place (as the
    decoder adds it): each row the one-token launch's, to the bit."""
    w, x = randn(n, k, dtype=dtype, seed=n + k), randn(T, k, dtype=dtype)
    norm = randn(k, dtype=dtype, scale=0.1) + 1 if normed else None
    res = randn(T, n, dtype=dtype)
    out = res.clone()
    (steps,) = launches_by_token(
        lambda t, o: gemv(w, x[t], o, norm=norm, residual=o, config=config, pdl=PDL), out)
    gemv(w, x, out, norm=norm, residual=out, config=config, pdl=PDL)
    assert torch.equal(out, steps)
    ref = gemv_reference(w, x[T - 1], norm=norm, residual=res[T - 1])
    assert rel_err(out[T - 1], ref) <= TOL[dtype]


@pytest.mark.parametrize("n,k,config", [PASS_GEMV[0], PASS_GEMV[2], PASS_GEMV[3]])
def test_int8_gemv_pass_is_its_tokens_steps(n, k, config):
    w, x = int8(n, k, seed=n + k), randn(T, k, dtype=torch.bfloat16)
    norm = randn(k, dtype=torch.bfloat16, scale=0.1) + 1
    res = randn(T, n, dtype=torch.bfloat16)
    out = poisoned(T, n, dtype=torch.bfloat16)
    (steps,) = launches_by_token(
        lambda t, o: gemv(w, x[t], o, norm=norm, residual=res[t], config=config,
                          pdl=PDL), out)
    gemv(w, x, out, norm=norm, residual=res, config=config, pdl=PDL)
    assert torch.equal(out, steps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n,k,config", [PASS_GEMV[0], PASS_GEMV[2]])
def test_gemv_silu_pass_is_its_tokens_steps(n, k, config, dtype):
    w, x = randn(2 * n, k, dtype=dtype, seed=n), randn(T, k, dtype=dtype, scale=0.5)
    norm = randn(k, dtype=dtype, scale=0.1) + 1
    out = poisoned(T, n, dtype=dtype)
    (steps,) = launches_by_token(
        lambda t, o: gemv_silu(w, x[t], o, norm=norm, config=config, pdl=PDL), out)
    assert torch.equal(gemv_silu(w, x, out, norm=norm, config=config, pdl=PDL), steps)
    assert rel_err(out[T - 1], gemv_silu_reference(w, x[T - 1], norm=norm)) <= TOL[dtype]


def test_a_split_k_pass_needs_partials_for_every_token():
    """A workspace sized for one token's split-K partials is refused for a pass of T
    (workspace_for counts a row of partials per token), and a workspace sized for T
    serves a pass and leaves its counters at zero."""
    n, k, config = 37, 100, GemvConfig(16, 32, split_k=2)
    blocks, splits = config.grid(n, k)
    w, x = randn(n, k, seed=4), randn(T, k)
    one = common.Workspace(DEVICE, blocks * splits * config.block_n, blocks)
    with pytest.raises(ValueError, match="workspace too small"):
        gemv(w, x, config=config, workspace=one)
    ws = common.Workspace(DEVICE, blocks * splits * config.block_n * 4, blocks)
    out = gemv(w, x, config=config, workspace=ws, pdl=PDL)
    assert out.shape == (T, n) and torch.all(ws.counters == 0)
    assert rel_err(out[2], gemv_reference(w, x[2])) <= 1e-5


@pytest.mark.parametrize("x", [torch.zeros(1, T, 16), torch.zeros(T, 17),
                               torch.zeros(16, T).t(), torch.zeros(())],
                         ids=["3-d", "wrong-k", "not-contiguous", "0-d"])
def test_tokens_of_refuses_other_shapes(x):
    with pytest.raises(ValueError, match=r"x of shape .*\(16,\) or \(tokens, 16\)"):
        tokens_of(x, 16)
    with pytest.raises(ValueError, match="x of shape"):  # before any launch
        gemv(torch.zeros(8, 16, device=DEVICE), x.to(DEVICE))
    assert tokens_of(torch.zeros(16), 16) == 1 and tokens_of(torch.zeros(T, 16), 16) == T


OUT_OF_SHAPE = ["gemv-out", "gemv-residual", "gemv_silu-out", "attention-out"]


@pytest.mark.parametrize("which", OUT_OF_SHAPE)
def test_a_pass_into_a_one_token_buffer_is_refused(which):
    """x of T tokens with an out (or residual) of one token's shape: refused with the
    shapes named, before the kernel writes T rows into it. The buffers here are views
    of longer ones, so that a write past them (what the kernels did before the check)
    would land inside memory the test owns, and show."""
    n, k = 16, 32
    longer = torch.zeros(4096, device=DEVICE)  # longer than any pass writes here
    one_row = longer[:n]
    x = randn(T, k, seed=6)
    width = 4 * 16 if which == "attention-out" else n
    both = rf"of shape \({width},\) for a pass of shape \({T}, {width}\)"
    with pytest.raises(ValueError, match=both):
        if which == "gemv-out":
            gemv(randn(n, k), x, one_row, config=GemvConfig(16, 32))
        elif which == "gemv-residual":
            gemv(randn(n, k), x, torch.zeros(T, n, device=DEVICE), residual=one_row,
                 config=GemvConfig(16, 32))
        elif which == "gemv_silu-out":
            gemv_silu(randn(2 * n, k), x, one_row, config=GemvConfig(16, 32))
        else:
            q = randn(T, 4 * 16)
            cache = randn(2, 8, 16)
            at.decode_attention(q, cache, cache, torch.tensor([5], device=DEVICE),
                                longer[: 4 * 16], n_split=1, block_s=16)
    assert longer[n:].eq(0).all()  # nothing written past the buffer


PASS_ROPE = [(GemvConfig(8, 64), 11), (GemvConfig(8, 32, split_k=2), T - 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config,pos", PASS_ROPE, ids=["one-tile-last-slot",
                                                       "split-k-first-slot"])
def test_qkv_rope_pass_is_its_tokens_steps(config, pos, dtype):
    """Row t's query, key and value at slot pos - T + 1 + t, rotated at that position:
    the same q rows and the same cache, every slot, as T one-token launches."""
    heads, kv, d, k, capacity = 4, 2, 16, 64, 12
    w = randn((heads + 2 * kv) * d, k, dtype=dtype, seed=pos)
    x, norm = randn(T, k, dtype=dtype), randn(k, dtype=dtype, scale=0.1) + 1
    cos, sin = rotary_tables(capacity, d, dtype)
    q = poisoned(T, heads * d, dtype=dtype)
    k_cache, v_cache = randn(kv, capacity, d, dtype=dtype), randn(kv, capacity, d,
                                                                  dtype=dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    (want_q,) = launches_by_token(
        lambda t, qt: rotary.qkv_rope(w, x[t], qt, want_k, want_v, cos, sin,
                                      torch.tensor([pos - T + 1 + t], device=DEVICE),
                                      n_heads=heads, norm=norm, config=config, pdl=PDL),
        q)
    rotary.qkv_rope(w, x, q, k_cache, v_cache, cos, sin, torch.tensor([pos], device=DEVICE),
                    n_heads=heads, norm=norm, config=config, pdl=PDL)
    assert torch.equal(q, want_q)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert not torch.equal(k_cache[:, pos], k_cache[:, pos - 1])  # a test of something


def test_qkv_rope_refuses_a_q_of_another_pass():
    w, x = randn(8 * 16, 64, seed=1), randn(T, 64)
    cos, sin = rotary_tables(8, 16, torch.float32)
    cache = torch.zeros(2, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=rf"q of shape \(64,\) for a pass of shape "
                                         rf"\({T}, 64\)"):
        rotary.qkv_rope(w, x, torch.zeros(64, device=DEVICE), cache, cache.clone(), cos,
                        sin, torch.tensor([4], device=DEVICE), n_heads=4)


PASS_ATTENTION = [(1, 16, True), (1, 64, True), (4, 16, True), (4, 16, False)]


@pytest.mark.parametrize("n_split,block_s,inline", PASS_ATTENTION,
                         ids=["one-split-tiles", "one-split-one-tile", "split-inline",
                              "split-combine-kernel"])
def test_decode_attention_pass_is_its_tokens_steps(n_split, block_s, inline):
    """Token t of the pass attends to the slots up to its own (pos - T + 1 + t): the
    one-token launch's output at that slot, to the bit; passes whose slots open the
    cache, straddle a tile's edge, and end it."""
    heads, kv, d, capacity = 4, 2, 16, 40
    q = randn(T, heads * d, seed=n_split + block_s)
    k_cache, v_cache = randn(kv, capacity, d), randn(kv, capacity, d)
    ws = at.AttentionWorkspace(DEVICE, kv, heads // kv, d, n_split, rows=T)
    for pos in (T - 1, 17, capacity - 1):
        out = poisoned(T, heads * d, dtype=torch.float32)
        (steps,) = launches_by_token(
            lambda t, o: at.decode_attention(
                q[t], k_cache, v_cache, torch.tensor([pos - T + 1 + t], device=DEVICE),
                o, n_split=n_split, block_s=block_s, inline_combine=inline, pdl=PDL), out)
        at.decode_attention(q, k_cache, v_cache, torch.tensor([pos], device=DEVICE), out,
                            n_split=n_split, block_s=block_s, inline_combine=inline,
                            pdl=PDL, workspace=ws)
        assert torch.equal(out, steps), pos
        assert torch.all(ws.counters == 0), pos
        ref = at.decode_attention_reference(q[0], k_cache, v_cache, pos - T + 1)
        assert rel_err(out[0], ref) <= 1e-5, pos  # the first token sees no later slot


def test_an_attention_workspace_for_fewer_tokens_is_refused():
    q, cache = randn(T, 64, seed=2), randn(2, 16, 16)
    ws = at.AttentionWorkspace(DEVICE, 2, 2, 16, 4, rows=T - 1)
    with pytest.raises(ValueError, match=f"number of tokens \\({T - 1}, not {T}\\)"):
        at.decode_attention(q, cache, cache, torch.tensor([8], device=DEVICE), n_split=4,
                            block_s=16, workspace=ws)


@pytest.mark.parametrize("pos", [T - 1, 7])
def test_embed_pass_reads_the_tokens_at_its_slots(pos):
    table = randn(50, 100, seed=pos)
    tokens = torch.tensor([3, 41, 7, 0, 49, 12, 5, 30], device=DEVICE)
    x = poisoned(T, 100, dtype=torch.float32)
    (steps,) = launches_by_token(
        lambda t, row: am.embed(table, tokens, torch.tensor([pos - T + 1 + t],
                                                            device=DEVICE), row, block=64,
                                pdl=PDL), x)
    am.embed(table, tokens, torch.tensor([pos], device=DEVICE), x, block=64, pdl=PDL)
    assert torch.equal(x, steps)
    assert torch.equal(x, table[tokens[pos - T + 1: pos + 1]])


# The lm_head of a pass: 100 logits in 4 blocks of 32, each token's maximum where the
# test puts it: x_t = W[c_t] / g, so that RMSNorm(x_t) = rstd * W[c_t] and logit c_t is
# |W[c_t]|^2 (times rstd) against the other rows' random products.
VOCAB, HIDDEN, HEAD = 100, 48, GemvConfig(32, 64)
CHOICES = (11, 57, 3, 80)  # blocks 0, 1, 0, 2


def argmax_rows(choices, dtype=torch.float32):
    w = randn(VOCAB, HIDDEN, dtype=dtype, seed=8)
    norm = randn(HIDDEN, dtype=dtype, scale=0.1) + 1
    x = torch.stack([(w[c].float() / norm.float()).to(dtype) for c in choices])
    for c, row in zip(choices, x):  # each token's argmax is where it was put
        assert am.lm_head_argmax_reference(w, row, norm=norm)[1] == c
    return w, norm, x


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "reduce-kernel"])
def test_lm_head_argmax_pass_is_its_tokens_steps(inline):
    """Without `accept`: each row of logits the one-token launch's; the last token's
    choice written after it, pos += 1, no other slot written."""
    w, norm = randn(VOCAB, HIDDEN, seed=9), randn(HIDDEN, scale=0.1) + 1
    x = randn(T, HIDDEN)
    capacity, pos = 10, 6
    tokens = torch.arange(capacity, device=DEVICE) + 500
    logits = poisoned(T, VOCAB, dtype=torch.float32)
    (steps,) = launches_by_token(
        lambda t, row: am.lm_head_argmax(w, x[t], row, tokens.clone(),
                                         torch.tensor([pos], device=DEVICE), norm=norm,
                                         config=HEAD, inline=inline, pdl=PDL), logits)
    at_pos = torch.tensor([pos], device=DEVICE)
    ws = am.ArgmaxWorkspace(DEVICE, 4, block_r=2, rows=T)  # 4 blocks in 2 chunks
    am.lm_head_argmax(w, x, logits, tokens, at_pos, norm=norm, config=HEAD,
                      inline=inline, pdl=PDL, workspace=ws)
    assert torch.equal(logits, steps)
    want = torch.arange(capacity, device=DEVICE) + 500
    want[pos + 1] = int(steps[T - 1].argmax())
    assert torch.equal(tokens, want) and int(at_pos) == pos + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "reduce-kernel"])
def test_lm_head_argmax_accepts_proposals_up_to_the_first_disagreement(inline, dtype):
    """A verify pass of 4 tokens at slots 3 ... 6 whose proposals (slots 4 ... 6) equal
    the choices after the tokens before them for the first j, then do not: the choices
    written at slots 4 ... 4 + j (the last the target's own), the rest left as they
    were, pos moved to slot 4 + j (j = 3: every proposal and the bonus token)."""
    rows = len(CHOICES)
    w, norm, x = argmax_rows(CHOICES, dtype)
    capacity, pos = 10, 6
    first = pos - rows + 1
    ws = am.ArgmaxWorkspace(DEVICE, 4, block_r=2, rows=rows)
    for j in range(rows):
        before = torch.arange(capacity, device=DEVICE) + 500
        for i in range(rows - 1):  # the proposal after token i
            before[first + 1 + i] = CHOICES[i] if i < j else (CHOICES[i] + 1) % VOCAB
        tokens, at_pos = before.clone(), torch.tensor([pos], device=DEVICE)
        logits = poisoned(rows, VOCAB, dtype=dtype)
        am.lm_head_argmax(w, x, logits, tokens, at_pos, norm=norm, config=HEAD,
                          inline=inline, accept=True, pdl=PDL, workspace=ws)
        want = before.clone()
        want[first + 1: first + j + 2] = torch.tensor(CHOICES[: j + 1])
        assert torch.equal(tokens, want), j
        assert int(at_pos) == first + j + 1, j
        assert logits.argmax(-1).tolist() == list(CHOICES), j


def test_an_accepted_pass_at_the_end_of_the_tokens_writes_nothing_past_them():
    """Every proposal accepted at the last slot: the bonus token has no slot, none is
    written past the tokens, and pos still moves past them (a replay's later steps
    find it there and write nothing; the decoder's host count refuses them)."""
    w, norm, x = argmax_rows(CHOICES[:T])
    capacity = 8
    buffer = torch.full((capacity + 2,), -7, device=DEVICE)
    tokens = buffer[:capacity]
    tokens[capacity - T + 1:] = torch.tensor(CHOICES[: T - 1])
    pos = torch.tensor([capacity - 1], device=DEVICE)
    am.lm_head_argmax(w, x, poisoned(T, VOCAB, dtype=torch.float32), tokens, pos,
                      norm=norm, config=HEAD, accept=True, pdl=PDL)
    assert tokens[capacity - T + 1:].tolist() == list(CHOICES[: T - 1])
    assert buffer[capacity:].eq(-7).all() and int(pos) == capacity


def test_an_argmax_workspace_for_fewer_tokens_is_refused():
    w, x = randn(VOCAB, HIDDEN, seed=1), randn(T, HIDDEN)
    tokens, pos = torch.zeros(8, device=DEVICE, dtype=torch.long), torch.tensor(
        [4], device=DEVICE)
    ws = am.ArgmaxWorkspace(DEVICE, 4, rows=T - 1)
    with pytest.raises(ValueError, match=f"need {T} x 4"):
        am.lm_head_argmax(w, x, poisoned(T, VOCAB, dtype=torch.float32), tokens, pos,
                          config=HEAD, workspace=ws)
    with pytest.raises(ValueError, match=rf"logits of shape \({VOCAB},\) for a pass of "
                                         rf"shape \({T}, {VOCAB}\)"):
        am.lm_head_argmax(w, x, poisoned(VOCAB, dtype=torch.float32), tokens, pos,
                          config=HEAD)
    assert int(pos) == 4 and tokens.eq(0).all()


# --------------------------------------------------------------------------------------
# Compiled for the book's GPUs (no GPU needed), and on the GPU itself
# --------------------------------------------------------------------------------------

# Run without TRITON_INTERPRET, so that the kernels compile: aot's report (every
# target), then the embedding kernel with PDL for an A100, which must not compile.
AOT_SCRIPT = """
import contextlib, io, sys, torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.embed_head import embed
code = aot.main()
t = lambda *shape, dt=torch.bfloat16: torch.empty(shape, dtype=dt)
print("sm_80 with PDL:", end=" ")
try:  # Triton prints the whole PTX on a ptxas error: not here
    with contextlib.redirect_stdout(io.StringIO()), aot.compile_only(80):
        embed(t(64, 1024), t(8, dt=torch.long), t(1, dt=torch.long), t(1024), pdl=True)
    print("compiled")
except Exception as e:
    print(type(e).__name__, e)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def aot_output():
    """(exit code, output) of AOT_SCRIPT: one process, so its imports are paid once."""
    proc = compiled_run(AOT_SCRIPT, timeout=300)
    return proc.returncode, run_output(proc)


def test_kernels_compile_for_sm_80_89_90_without_spills(aot_output):
    """Every kernel of the 1B step, default tiling, BF16 and int8, compiled for the
    A100 (sm_80) and the L4 / RTX 40xx (sm_89) with PDL off and for Hopper (sm_90)
    with it on, as the book runs them: what the interpreter cannot check. No kernel
    may spill registers (aot exits 1 if one does)."""
    code, out = aot_output
    assert code == 0, out
    steps, rows = {}, []
    for line in out.splitlines():
        if " weights, PDL " in line:
            steps[line[:-1]] = rows = []
        elif line.startswith("  "):
            rows.append(line)
    assert list(steps) == [f"sm_{sm}, {weights} weights, PDL {pdl}"
                           for sm, pdl in ((80, "off"), (89, "off"), (90, "on"))
                           for weights in ("bf16", "int8")], out
    for rows in steps.values():
        step = "\n".join(rows)
        assert step.count("gemv") == 3 and "qkv_rope_kernel" in step, out
        assert step.count("'stack': 0,") == len(rows), out


PDL_ORDER_SCRIPT = """
import torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.gemv import gemv, gemv_silu
from gpuinfer.kernels.pass_mma import MmaConfig, gemv_pass
from gpuinfer.kernels.qkv_rope import qkv_rope
H, I, HEADS, KV, D, CAP = 256, 512, 4, 2, 64, 64
t = lambda *s, dt=torch.bfloat16: torch.empty(s, dtype=dt)
cache, table, pos = t(KV, CAP, D), t(CAP, D), t(1, dt=torch.long)
with aot.compile_only(90) as done:
    gemv(t(H, I), t(I), x := t(H), residual=x, pdl=True)
    gemv_silu(t(2 * I, H), t(H), t(I), norm=t(H), pdl=True)
    qkv_rope(t((HEADS + 2 * KV) * D, H), t(H), t(HEADS * D), cache, cache, table, table,
             pos, n_heads=HEADS, norm=t(H), pdl=True)
    gemv_pass(t(H, I), t(5, I), x := t(5, H), residual=x, config=MmaConfig(8, 256),
              pdl=True)
for name, _, kernel in done:
    ptx = kernel.asm["ptx"]
    print(name, *(ptx.find(op) for op in ("griddepcontrol.launch_dependents",
                                          "ld.global", "griddepcontrol.wait")))
"""


def test_products_let_the_next_kernel_launch_before_they_load():
    """Under PDL a product's kernel, the step's or a pass's, lets the next kernel
    launch before its first load, so that the next kernel's weights are in flight
    while this one waits for x (the target's step 4 % faster on an H100, NOTES-57);
    its weights still load before its own wait."""
    proc = compiled_run(PDL_ORDER_SCRIPT)
    out = run_output(proc)
    assert proc.returncode == 0, out
    found = {name: [int(i) for i in at] for name, *at in
             (line.split() for line in proc.stdout.splitlines())}
    assert set(found) == {"gemv_kernel", "gemv_silu_kernel", "qkv_rope_kernel",
                          "gemv_pass_kernel"}, out
    for name, (launch, first_load, wait) in found.items():
        assert 0 <= launch < first_load < wait, (name, out)


def test_pdl_does_not_compile_for_sm_80(aot_output):
    """PDL's griddepcontrol instructions need sm_90: why `pdl_supported` (and
    aot.pdl_for) turn it off below Hopper."""
    _, out = aot_output
    assert "sm_80 with PDL: PTXASError" in out, out
    assert "Instruction 'griddepcontrol' requires .target sm_90 or higher" in out, out


@pytest.mark.gpu
def test_lm_head_chapter_shape_on_gpu():
    w = randn(128256, 2048, dtype=torch.bfloat16, seed=9)
    x = randn(2048, dtype=torch.bfloat16)
    norm = randn(2048, dtype=torch.bfloat16, scale=0.1) + 1
    tokens = torch.zeros(8, device=DEVICE, dtype=torch.long)
    pos = torch.tensor([0], device=DEVICE)
    logits = poisoned(128256, dtype=torch.bfloat16)
    am.lm_head_argmax(w, x, logits, tokens, pos, norm=norm,
                      config=GemvConfig(8, 2048, num_warps=8), pdl=PDL)
    ref_logits, ref_token = am.lm_head_argmax_reference(w, x, norm=norm)
    assert rel_err(logits, ref_logits) <= 1e-2
    assert tokens[1].item() == int(logits.float().argmax())


@pytest.mark.gpu
def test_pdl_chain_in_a_cuda_graph():
    """Ten dependent GEMVs, each reading the last one's output, launched with PDL and
    replayed from a CUDA graph: the PDL wait must order them."""
    config = GemvConfig(8, 1024, split_k=2, num_warps=4)
    work = common.Workspace(DEVICE, 1 << 16, 256)

    def product(w, x, out):
        gemv(w, x, out, config=config, pdl=PDL, workspace=work)

    assert graphed_chain_error(product, gemv_reference, scale=0.03) <= 2e-2


# Without TRITON_INTERPRET too: kernels compiled ahead, in parallel, for sm_90, then
# launched (as compilations again, under aot.compile_only), compile nothing more.
AHEAD_SCRIPT = """
import torch, triton
from gpuinfer.kernels import aot
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.kernels.embed_head import embed
from gpuinfer.kernels.gemv import GemvConfig, gemv
t = lambda *shape, dt=torch.bfloat16: torch.empty(shape, dtype=dt)
x, w, out = t(256), t(64, 256), t(64)
def launches():
    embed(t(64, 256), t(8, dt=torch.long), t(1, dt=torch.long), x, pdl=True)
    for c in (GemvConfig(8, 256, 1, 4), GemvConfig(16, 256, 1, 4), GemvConfig(8, 256, 1, 4)):
        gemv(w, x, out, config=c, pdl=True)
compiles = []
triton.knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiles.append(1)
with aot.compile_only(90) as launched:
    ahead = compile_ahead(launches)
    print("ahead", ahead, len(compiles), len(launched))
    compiles.clear()
    launches()
    print("then", len(compiles), len(launched))
    def broken():
        gemv(w, x, out, config=GemvConfig(32, 256, 1, 4), pdl=True)
        raise RuntimeError("a launcher that fails")
    print("failing", compile_ahead(broken))
"""


def test_kernels_compiled_ahead_are_not_compiled_again():
    proc = compiled_run(AHEAD_SCRIPT, timeout=300)
    returncode, out = proc.returncode, run_output(proc)
    assert returncode == 0, out
    # three kernels (a gemv tiling twice), compiled ahead; no launch ran while compiling
    assert "ahead 3 3 0" in out, out
    assert "then 0 4" in out, out  # launched now, compiled before
    # a launcher that raises: a warning, and its launches compile when they run
    assert "failing 0" in out and "not compiled ahead (RuntimeError" in out, out
