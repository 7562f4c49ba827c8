"""The Llama forward, written once: every decoder of the book runs this math.

`forward` is `transformers`' Llama forward, written out on the model's own weights
(only the stacked q/k/v and gate/up matrices are new tensors), so that in FP32 the
tokens equal those of Chapter 2's loops. It runs any number of tokens at any slots of a
preallocated KV cache: the prefill (the prompt at slots 0 ... T-1), a one-token decode
step (slot `pos`), and a speculative verify pass (k + 1 tokens), returning the logits
of the last position or of every one. The decoders differ in how they run it (eagerly,
compiled, captured), or in the kernels of their own step (`decode.triton_step`), not in
the math.

The weights' format is a value, `Weights.format`: the matrices a step streams are kept
as the model stores them (`AS_STORED`) or quantized (`INT8`); `linear` multiplies by
either. A new format (int4) is a new `WeightFormat` whose matrices have a `linear`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from gpuinfer.model.quant import Int8Matrix, quantize_int8
from gpuinfer.model.configs import check_llama, head_dim


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's math, op for op (in fp32, the cast to fp32 and back is a no-op)."""
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: (x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


ATTENTION = ("matmul", "sdpa")


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
              kernel: str = "matmul") -> torch.Tensor:
    """Attention of `heads` query heads on `kv_heads` key/value heads (grouped-query).

    q: (batch, T, heads, head_dim); keys, values: (batch, kv_heads, slots, head_dim); mask:
    (T * group, slots), additive, from `fold_mask`. Query head j uses key/value head
    j // group (group = heads // kv_heads), as transformers pairs them. Rather than repeating
    every key/value head `group` times (a copy of the cache, every layer, every step), the
    group's queries are folded into the query axis: key/value head h gets T x group queries,
    and the cache is read once. Returns (batch, T, heads * head_dim).

    kernel "matmul" is transformers' eager attention, op for op: q k^T times the scale, plus
    the mask, softmax in fp32, times v. "sdpa" hands the same to
    `F.scaled_dot_product_attention`, which picks a fused kernel (flash, memory-efficient or
    cuDNN) by dtype and shape.
    """
    batch, length, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    # (batch, T, kv, group, d) -> (batch, kv, T * group, d): row t * group + g is query t of
    # head kv * group + g.
    q = q.view(batch, length, kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    q = q.reshape(batch, kv_heads, length * group, head_dim)
    if kernel == "matmul":
        scores = torch.matmul(q, keys.transpose(2, 3)) * head_dim**-0.5 + mask
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(weights, values)
    elif kernel == "sdpa":
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                           scale=head_dim**-0.5)
    else:
        check_attention(kernel)
    o = o.view(batch, kv_heads, length, group, head_dim).permute(0, 2, 1, 3, 4)
    return o.reshape(batch, length, heads * head_dim)


def check_attention(kernel: str) -> None:
    """Refuse an attention kernel this module does not know, naming the ones it does."""
    if kernel not in ATTENTION:
        raise ValueError(f"unknown attention kernel {kernel!r}; one of {ATTENTION}")


def fold_mask(mask: torch.Tensor, group: int) -> torch.Tensor:
    """The (T, slots) mask of T queries, one row per folded query of `attention`:
    (T * group, slots)."""
    return mask.repeat_interleave(group, dim=0) if group > 1 else mask


@dataclass(frozen=True)
class WeightFormat:
    """How the matrices a step streams are stored: `quantize` maps a matrix to its
    stored form (None: as the model stores it). The embedding is never converted: a
    step reads one row of it."""

    name: str
    quantize: Callable[[torch.Tensor], object] | None = None

    def apply(self, matrix: torch.Tensor):
        return matrix if self.quantize is None else self.quantize(matrix)


AS_STORED = WeightFormat("bf16")  # the model's own dtype (BF16 in the book's runs)
INT8 = WeightFormat("int8", quantize_int8)  # weight-only, per output row (model.quant)
FORMATS = (AS_STORED, INT8)


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """x @ w.T for a matrix of any format: a tensor, or a stored form with `linear`."""
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w.linear(x)


@dataclass
class LayerWeights:
    """One decoder layer's weights. q, k, v are stacked into one matrix, and gate and up into
    another, so that each pair of matmuls reading the same input is one matmul (one kernel)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor | Int8Matrix  # (heads + 2 * kv_heads) * head_dim rows
    o: torch.Tensor | Int8Matrix
    post_norm: torch.Tensor
    gate_up: torch.Tensor | Int8Matrix  # 2 * intermediate rows
    down: torch.Tensor | Int8Matrix

    MATRICES = ("qkv", "o", "gate_up", "down")


@dataclass
class Weights:
    """A Llama's weights in one format, with the shapes the forward needs."""

    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor | Int8Matrix  # the embedding itself when tied and as stored
    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    format: WeightFormat = field(default=AS_STORED)

    def converted(self, fmt: WeightFormat) -> Weights:
        """These weights with every streamed matrix stored in `fmt` (new tensors)."""
        if self.format is not AS_STORED:
            raise ValueError(f"weights already {self.format.name}; convert from the "
                             "model's own")
        layers = [replace(w, **{m: fmt.apply(getattr(w, m)) for m in LayerWeights.MATRICES})
                  for w in self.layers]
        return replace(self, layers=layers, lm_head=fmt.apply(self.lm_head), format=fmt)

    def streamed(self) -> list:
        """Every weight a step reads in full: the layers' and the final norm and lm_head."""
        return [w for layer in self.layers for w in vars(layer).values()] + [
            self.norm, self.lm_head]

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


def weights_of(model: LlamaForCausalLM, fmt: WeightFormat = AS_STORED) -> Weights:
    """`model`'s weights: its own tensors (detach() makes no copy), except the stacked
    q/k/v and gate/up matrices, which are new; then stored in `fmt`."""
    check_llama(model.config)
    cfg, llama = model.config, model.model
    with torch.no_grad():
        layers = [LayerWeights(
            layer.input_layernorm.weight.detach(),
            torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                       layer.self_attn.v_proj.weight]),
            layer.self_attn.o_proj.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
            torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
            layer.mlp.down_proj.weight.detach(),
        ) for layer in llama.layers]
    weights = Weights(llama.embed_tokens.weight.detach(), layers, llama.norm.weight.detach(),
                      model.lm_head.weight.detach(), cfg.num_attention_heads,
                      cfg.num_key_value_heads, head_dim(cfg), cfg.rms_norm_eps)
    return weights if fmt is AS_STORED else weights.converted(fmt)


def rotary_table(model: LlamaForCausalLM, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every slot, (capacity, head_dim) each, by the model's own rotary
    module (so that every rope scaling transformers knows is honoured)."""
    probe = model.lm_head.weight
    with torch.no_grad():
        slots = torch.arange(capacity, device=probe.device)[None]
        cos, sin = model.model.rotary_emb(probe, slots)
    return cos[0].contiguous(), sin[0].contiguous()


@dataclass
class KVCache:
    """A preallocated cache: per layer, keys and values (batch, kv_heads, capacity, d),
    with the rotary table and slot indices of its capacity."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor


def forward(w: Weights, cache: KVCache, input_ids: torch.Tensor, positions: torch.Tensor,
            *, attention_kernel: str = "matmul", every_position: bool = False
            ) -> torch.Tensor:
    """Logits of the last input position (batch, vocab), or of every one (batch, T, vocab);
    writes the inputs' keys and values into the cache.

    input_ids: (batch, T) token ids at the slots `positions` (T,), a device tensor.
    """
    batch, length = input_ids.shape
    h, kv, d = w.n_heads, w.n_kv_heads, w.head_dim
    x = F.embedding(input_ids, w.embed)
    cos = cache.cos.index_select(0, positions)[:, None, :]  # (T, 1, d): all heads
    sin = cache.sin.index_select(0, positions)[:, None, :]
    # Query t sees every slot up to its own position and none after: an additive mask
    # over the whole cache, made once per call and shared by the layers.
    visible = cache.slots[None, :] <= positions[:, None]  # (T, capacity)
    mask = torch.where(visible, 0.0, float("-inf")).to(x.dtype)
    mask = fold_mask(mask, h // kv)  # one row per folded query (see `attention`)
    for i, layer in enumerate(w.layers):
        qkv = linear(rms_norm(x, layer.input_norm, w.eps), layer.qkv)
        qkv = qkv.view(batch, length, h + 2 * kv, d)
        qk = qkv[:, :, : h + kv]  # rotary on the queries and keys at once
        qk = qk * cos + rotate_half(qk) * sin
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]
        cache.keys[i].index_copy_(2, positions, k.transpose(1, 2))
        cache.values[i].index_copy_(2, positions, v.transpose(1, 2))
        o = attention(q, cache.keys[i], cache.values[i], mask, attention_kernel)
        x = x + linear(o, layer.o)
        gate_up = linear(rms_norm(x, layer.post_norm, w.eps), layer.gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + linear(F.silu(gate) * up, layer.down)
    last = x if every_position else x[:, -1]
    return linear(rms_norm(last, w.norm, w.eps), w.lm_head)
