"""The fused q/k/v + rotary + attention kernel of issue 58 (`kernels.attention_block`):
under Triton's interpreter (on the GPU where there is one) it equals the two-kernel
chain it replaces (`qkv_rope` then `decode_attention`), q and the cache writes to the
bit, at a small Llama shape and an odd one (a group of 3, K in several tiles, a cache
longer than a tile) at the first slot, a middle one, the last and one past the cache;
misuse is refused; and it compiles for sm_80, sm_89 and sm_90 at the 1B shape without
spills (PDL on sm_90 only)."""

import importlib

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import attention_block as ab  # noqa: E402

if not torch.cuda.is_available() and not ab.INTERPRETED:  # decorated before us
    ab = importlib.reload(ab)

from gpuinfer.kernels import attention as at  # noqa: E402
from gpuinfer.kernels import qkv_rope as qr  # noqa: E402
from gpuinfer.kernels.common import Workspace, pdl_supported  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig  # noqa: E402
from gpuinfer.model.quant import quantize_int8  # noqa: E402

from kernel_checks import (  # noqa: E402,F401
    DEVICE, compiled_run, fixed_randn, quiet_numpy, rel_err, run_output)
PDL = pdl_supported(DEVICE)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rotary_tables(capacity, head_dim, dtype, theta=500000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2) / head_dim)
    emb = torch.arange(capacity)[:, None] * inv[None]
    emb = torch.cat([emb, emb], -1)
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


class Layer:
    """A layer's q/k/v inputs: weights, x, norm, a filled cache and rotary tables."""

    def __init__(self, heads, kv, d, hidden, capacity, dtype, int8=False):
        self.heads, self.kv, self.d = heads, kv, d
        w = fixed_randn((heads + 2 * kv) * d, hidden, dtype=dtype, scale=0.1, seed=1)
        self.w = quantize_int8(w) if int8 else w
        self.x = fixed_randn(hidden, dtype=dtype, seed=2)
        self.norm = fixed_randn(hidden, dtype=dtype, scale=0.1, seed=3) + 1
        self.k_cache = fixed_randn(kv, capacity, d, dtype=dtype, seed=4)
        self.v_cache = fixed_randn(kv, capacity, d, dtype=dtype, seed=5)
        self.cos, self.sin = rotary_tables(capacity, d, dtype)

    def chain(self, slot, config):
        """The two kernels the fused one replaces: (out, q, k_cache, v_cache)."""
        q = torch.full((self.heads * self.d,), float("nan"), device=DEVICE,
                       dtype=self.x.dtype)
        k, v = self.k_cache.clone(), self.v_cache.clone()
        pos = torch.tensor([slot], device=DEVICE)
        qr.qkv_rope(self.w, self.x, q, k, v, self.cos, self.sin, pos, n_heads=self.heads,
                    norm=self.norm, config=config, pdl=PDL)
        out = at.decode_attention(q, k, v, pos, n_split=1, block_s=64, pdl=PDL)
        return out, q, k, v

    def fused(self, slot, config, block_s, interleave, workspace):
        q = torch.full((self.heads * self.d,), float("nan"), device=DEVICE,
                       dtype=self.x.dtype)
        out = torch.full_like(q, float("nan"))
        k, v = self.k_cache.clone(), self.v_cache.clone()
        pos = torch.tensor([slot], device=DEVICE)
        ab.qkv_rope_attention(self.w, self.x, q, k, v, self.cos, self.sin, pos, out,
                              n_heads=self.heads, norm=self.norm, config=config,
                              block_s=block_s, interleave=interleave, pdl=PDL,
                              workspace=workspace)
        return out, q, k, v


# (heads, kv, d, hidden, capacity, config, block_s, interleave): a small Llama (group 2,
# K in one tile, the cache in one tile, consumers last), an odd one (group 3, K = 100 in
# 4 tiles of 32, 4 pairs a producer, a cache of 37 slots in tiles of 16, interleaved)
SHAPES = [(4, 2, 32, 128, 40, GemvConfig(16, 128), 64, False),
          (6, 2, 16, 100, 37, GemvConfig(4, 32), 16, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv,d,hidden,capacity,config,block_s,interleave", SHAPES,
                         ids=["small", "odd"])
def test_fused_equals_the_chain(heads, kv, d, hidden, capacity, config, block_s,
                                interleave, dtype):
    layer = Layer(heads, kv, d, hidden, capacity, dtype)
    ws = Workspace(DEVICE, 1, kv)
    for slot in (0, capacity // 2, capacity - 1):
        out, q, k, v = layer.fused(slot, config, block_s, interleave, ws)
        c_out, c_q, c_k, c_v = layer.chain(slot, config)
        assert torch.equal(q, c_q) and torch.equal(k, c_k) and torch.equal(v, c_v), slot
        assert rel_err(out, c_out) <= TOL[dtype], slot
        ref, ref_k, ref_v = ab.qkv_rope_attention_reference(
            layer.w, layer.x, layer.k_cache, layer.v_cache, layer.cos, layer.sin, slot,
            n_heads=heads, norm=layer.norm)
        assert rel_err(out, ref) <= TOL[dtype], slot
        assert rel_err(k[:, slot], ref_k[:, slot]) <= TOL[dtype], slot
        assert torch.all(ws.counters == 0), slot  # reset for the next launch


def test_int8_weights_equal_the_chain():
    layer = Layer(4, 2, 32, 128, 40, torch.bfloat16, int8=True)
    config = GemvConfig(8, 128)
    out, q, k, v = layer.fused(39, config, 64, False, Workspace(DEVICE, 1, 2))
    c_out, c_q, c_k, c_v = layer.chain(39, config)
    assert torch.equal(q, c_q) and torch.equal(k, c_k) and torch.equal(v, c_v)
    assert rel_err(out, c_out) <= 1e-2


def test_past_the_cache_writes_nothing_and_attends_to_every_slot():
    """pos is read unchecked (a replay runs whatever it holds): past the cache, as the
    chain does, nothing is written and the attention sees all the slots."""
    layer = Layer(4, 2, 32, 128, 40, torch.float32)
    config = GemvConfig(16, 128)
    out, _, k, v = layer.fused(45, config, 64, False, Workspace(DEVICE, 1, 2))
    assert torch.equal(k, layer.k_cache) and torch.equal(v, layer.v_cache)
    assert rel_err(out, layer.chain(45, config)[0]) <= 1e-5


def _call(**change):
    layer = Layer(4, 2, 32, 128, 40, torch.float32)
    args = dict(w=layer.w, x=layer.x, q=torch.empty(128, device=DEVICE),
                k_cache=layer.k_cache, v_cache=layer.v_cache, cos=layer.cos,
                sin=layer.sin, pos=torch.tensor([3], device=DEVICE))
    kwargs = dict(n_heads=4, config=GemvConfig(16, 128), block_s=64)
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value(layer) if callable(value) else value
    return lambda: ab.qkv_rope_attention(**args, **kwargs)


@pytest.mark.parametrize("call,match", [
    (_call(n_heads=3), "do not group"),
    (_call(n_heads=2), r"is not q, k, v of 2/2 heads"),
    (_call(config=GemvConfig(16, 64, split_k=2)), "does not split K"),
    (_call(config=GemvConfig(32, 128)), "block_n=32 pairs span heads"),
    (_call(block_s=8), "block_s >= 16"),
    (_call(block_s=48), "not a power of two"),
    (_call(x=lambda l: l.x[None].repeat(2, 1)), "one token"),
    (_call(q=torch.empty(64)), r"q of shape \(64,\)"),
    (_call(cos=lambda l: l.cos[:20]), "rotary tables"),
    (_call(v_cache=lambda l: l.v_cache[:, :20]), "is not k_cache's shape"),
    (_call(k_cache=lambda l: l.k_cache.transpose(1, 2).contiguous().transpose(1, 2),
           v_cache=lambda l: l.v_cache.transpose(1, 2).contiguous().transpose(1, 2)),
     "contiguous"),
    (_call(pos=torch.tensor([1, 2])), "one element"),
    (_call(workspace=Workspace(DEVICE, 1, 1)), "workspace too small"),
])
def test_misuse_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# Compiled (no TRITON_INTERPRET): the 1B shape (32/8 heads of 64, hidden 2048, a cache
# of 256 slots) with the GPU default tiling on each target, PDL as the book sets it;
# on sm_90 also int8 weights and the 64-slot tile.
AOT_SCRIPT = """
import sys, torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.attention_block import default_block, qkv_rope_attention
from gpuinfer.model.quant import Int8Matrix
t = lambda *shape, dt=torch.bfloat16: torch.empty(shape, dtype=dt)
H, KV, D, HID, CAP = 32, 8, 64, 2048, 256
bad = 0
runs = [(cap, "bf16", 256) for cap in aot.TARGETS] + [(90, "int8", 256), (90, "bf16", 64)]
for cap, weights, block_s in runs:
    rows = (H + 2 * KV) * D
    w = Int8Matrix(t(rows, HID, dt=torch.int8), t(rows)) if weights == "int8" \\
        else t(rows, HID)
    with aot.compile_only(cap) as done:
        qkv_rope_attention(w, t(HID), t(H * D), t(KV, CAP, D), t(KV, CAP, D), t(CAP, D),
                           t(CAP, D), t(1, dt=torch.long), n_heads=H, norm=t(HID),
                           config=default_block(True)["config"], block_s=block_s,
                           pdl=aot.pdl_for(cap))
    kernel = done[-1][2]
    assert aot.cubin_capability(kernel) == cap
    use = aot.resource_usage(kernel)
    bad += use["stack"] > 0
    pdl = "griddepcontrol" in kernel.asm["ptx"]
    print(f"sm_{cap} {weights} block_s {block_s} PDL {pdl}: {use}")
sys.exit(1 if bad else 0)
"""


def test_compiles_for_sm_80_89_90_without_spills():
    proc = compiled_run(AOT_SCRIPT, timeout=300)
    out = run_output(proc)
    print(out)
    assert proc.returncode == 0, out
    for cap, pdl in ((80, False), (89, False), (90, True)):
        assert f"sm_{cap} bf16 block_s 256 PDL {pdl}:" in out, out
    assert "sm_90 int8 block_s 256 PDL True:" in out and "sm_90 bf16 block_s 64" in out
