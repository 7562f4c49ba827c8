"""A decode step with fixed shapes and fixed addresses, so that it can become a CUDA graph.

A CUDA graph replays recorded kernels with the *same arguments*: the same pointers, the
same shapes, the same scalars. Chapter 2's loop breaks all three every step: the KV cache
grows (new shapes, reallocated memory), the position is a Python int baked into the launch,
and each step's input is a fresh tensor. `StaticDecoder` fixes them:

- the KV cache is preallocated at its full capacity, a keys and a values tensor per layer,
  and each step writes its key and value into slot `pos` with `index_copy_`;
- attention reads the whole cache with a mask that hides the slots past `pos`, so its
  shapes never change;
- the position `pos` is a one-element tensor on the device, advanced in place;
- the token sequence lives in a preallocated `tokens` buffer: a step reads its input token
  from slot `pos` and writes its output token into slot `pos + 1`.

One decode step is then a fixed sequence of kernels on fixed buffers. How it is run (eagerly,
captured in a CUDA graph, compiled) is `gpuinfer.decode.runners`' business, not the decoder's.

The math is the `transformers` Llama forward, written out on the model's own weights (only
the stacked q/k/v and gate/up matrices are new tensors), so that in fp32 the tokens equal
those of Chapter 2's loops. Attention is `attention`: grouped-query heads folded so that
each key/value head is read once, computed either as transformers' eager attention (two
matmuls and a softmax) or by `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from gpuinfer.model.configs import head_dim


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


@dataclass
class LayerWeights:
    """One decoder layer's weights. q, k, v are stacked into one matrix, and gate and up into
    another, so that each pair of matmuls reading the same input is one matmul (one kernel)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # (heads + 2 * kv_heads) * head_dim rows
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # 2 * intermediate rows
    down: torch.Tensor


def layer_weights(model: LlamaForCausalLM) -> list[LayerWeights]:
    """Every layer's weights: the model's own tensors (detach() makes no copy), except the
    stacked q/k/v and gate/up matrices, which are new."""
    with torch.no_grad():
        return [LayerWeights(
            layer.input_layernorm.weight.detach(),
            torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                       layer.self_attn.v_proj.weight]),
            layer.self_attn.o_proj.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
            torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
            layer.mlp.down_proj.weight.detach(),
        ) for layer in model.model.layers]


class StaticDecoder:
    """Greedy decoding of a LlamaForCausalLM with a preallocated KV cache.

    `capacity` is the number of token slots: prompt plus new tokens must fit. All state is
    in tensors allocated once (`k_cache`, `v_cache`, `tokens`, `pos`), so every call of
    `decode_step` launches the same kernels on the same addresses. `attention` picks the
    attention kernel (see `attention`).
    """

    def __init__(self, model: LlamaForCausalLM, batch: int, capacity: int, *,
                 attention: str = "matmul"):
        cfg, llama = model.config, model.model
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise NotImplementedError("StaticDecoder covers Llamas without biases")
        check_attention(attention)  # now, not at the first step
        self.batch, self.capacity, self.attention = batch, capacity, attention
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = head_dim(cfg)
        self.eps = cfg.rms_norm_eps
        # The model's weights, shared (detach() makes no copy), except the two stacked ones.
        self.embed = llama.embed_tokens.weight.detach()
        self.layers = layer_weights(model)
        self.norm = llama.norm.weight.detach()
        self.lm_head = model.lm_head.weight.detach()
        dev, dtype = self.lm_head.device, self.lm_head.dtype

        cache_shape = (batch, self.n_kv_heads, capacity, self.head_dim)
        # One tensor per layer, not one for all: a compiled step then writes each new key in
        # place, where a write into a slice of one big tensor costs a copy of all of it.
        # Zeros, not empty: masked slots get weight exactly 0, and 0 * NaN would be NaN.
        self.k_cache = [torch.zeros(cache_shape, device=dev, dtype=dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(cache_shape, device=dev, dtype=dtype) for _ in self.layers]
        self.tokens = torch.zeros(batch, capacity, device=dev, dtype=torch.long)
        self.pos = torch.zeros(1, device=dev, dtype=torch.long)
        self.slots = torch.arange(capacity, device=dev)
        # cos and sin of every slot, computed once by the model's own rotary module.
        cos, sin = llama.rotary_emb(self.lm_head, self.slots[None])
        self.cos, self.sin = cos[0], sin[0]  # (capacity, head_dim)
        for t in self.tensors():
            # The address of each of these never changes. Telling torch.compile so lets
            # cudagraph trees use them in place (no copy into the graph's own inputs) and
            # accept the in-place writes into the cache, tokens and pos.
            torch._dynamo.mark_static_address(t)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step reads or writes."""
        weights = [w for layer in self.layers for w in vars(layer).values()]
        return weights + self.k_cache + self.v_cache + [
            self.embed, self.norm, self.lm_head, self.tokens, self.pos, self.slots, self.cos,
            self.sin]

    @property
    def cache_bytes(self) -> int:
        """Bytes of the preallocated keys and values, all layers."""
        return sum(t.numel() * t.element_size() for t in self.k_cache + self.v_cache)

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits of the last input position; writes the inputs' keys and values to the cache.

        input_ids: (batch, T) token ids at the slots `positions` (T,), a device tensor.
        """
        batch, length = input_ids.shape
        h, kv = self.n_heads, self.n_kv_heads
        x = F.embedding(input_ids, self.embed)
        cos = self.cos.index_select(0, positions)[:, None, :]  # (T, 1, head_dim): all heads
        sin = self.sin.index_select(0, positions)[:, None, :]
        # Query t sees every slot up to its own position and none after: an additive mask
        # over the whole cache, made once per step and shared by the layers.
        visible = self.slots[None, :] <= positions[:, None]  # (T, capacity)
        mask = torch.where(visible, 0.0, float("-inf")).to(x.dtype)
        mask = fold_mask(mask, h // kv)  # one row per folded query (see `attention`)
        for i, w in enumerate(self.layers):
            qkv = F.linear(rms_norm(x, w.input_norm, self.eps), w.qkv)
            qkv = qkv.view(batch, length, h + 2 * kv, self.head_dim)
            qk = qkv[:, :, : h + kv]  # rotary on the queries and keys at once
            qk = qk * cos + rotate_half(qk) * sin
            q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]
            self.k_cache[i].index_copy_(2, positions, k.transpose(1, 2))
            self.v_cache[i].index_copy_(2, positions, v.transpose(1, 2))
            o = attention(q, self.k_cache[i], self.v_cache[i], mask, self.attention)
            x = x + F.linear(o, w.o)
            gate, up = F.linear(rms_norm(x, w.post_norm, self.eps), w.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w.down)
        return F.linear(rms_norm(x[:, -1], self.norm, self.eps), self.lm_head)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Reset the state to a new prompt: fill the cache, write the first new token, set pos.
        Returns the logits of the last prompt position.

        Run eagerly (its shapes depend on the prompt length). Everything is written in
        place, so a graph captured earlier stays valid. Slots past the prompt keep stale
        keys and values, which the mask hides until a step overwrites them.
        """
        length = prompt_ids.shape[1]
        if prompt_ids.shape[0] != self.batch or length >= self.capacity:
            raise ValueError(f"prompt {tuple(prompt_ids.shape)} does not fit "
                             f"{self.batch=} {self.capacity=}")
        self.tokens[:, :length].copy_(prompt_ids)
        logits = self.logits(self.tokens[:, :length], self.slots[:length])
        self.tokens[:, length] = logits.argmax(-1)
        self.pos.fill_(length)
        return logits

    def decode_step(self) -> torch.Tensor:
        """One greedy step, all on the device: read tokens[pos], write tokens[pos + 1], pos += 1.

        No host value is read (no `.item()`, no Python branch on a tensor), so the step
        has no sync, no graph break, and the same kernels and addresses every time.
        """
        token = self.tokens.index_select(1, self.pos)  # (batch, 1)
        next_token = self.logits(token, self.pos).argmax(-1, keepdim=True)
        self.tokens.index_copy_(1, self.pos + 1, next_token)
        self.pos.add_(1)
        return next_token

    def step_logits(self, token: torch.Tensor) -> torch.Tensor:
        """The step with a given input token (batch, 1) instead of the last one generated:
        its logits (batch, vocab), the cache written and pos advanced (teacher forcing)."""
        logits = self.logits(token, self.pos)
        self.pos.add_(1)
        return logits


def capacity_for(prompt_len: int, new_tokens: int, multiple: int = 64) -> int:
    """Slots for prompt + new tokens, rounded up so that nearby lengths share one decoder
    (and the mask rows stay aligned for the attention kernel)."""
    need = prompt_len + new_tokens
    return -(-need // multiple) * multiple


def decode_step_with_breaks(decoder: StaticDecoder) -> torch.Tensor:
    """The same step as a first draft often writes it: three graph breaks.

    Kept as a counter-example; `graph_breaks` counts its breaks in Chapter 3.
    """
    token = decoder.tokens.index_select(1, decoder.pos)
    logits = decoder.logits(token, decoder.pos)
    if torch.isnan(logits).any():  # 1. a Python branch on a device value: sync and break
        raise RuntimeError("NaN logits")
    next_token = logits.argmax(-1, keepdim=True)
    position = decoder.pos.item()  # 2. .item(): the host waits for the GPU, and a break
    decoder.tokens[:, position + 1] = next_token[:, 0]
    print(f"decoded position {position}")  # 3. print: a host side effect, and a break
    decoder.pos.add_(1)
    return next_token


def graph_breaks(fn, *args) -> tuple[int, list[tuple[int, str, str]]]:
    """Run `fn(*args)` under `torch._dynamo.explain`: the number of graphs it compiles to and,
    for every graph break, (line number, source line, dynamo's reason).

    It executes fn once (with its side effects) and resets dynamo's caches before and after:
    functions compiled earlier compile again on their next call.
    """
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # explain reports the breaks; skip dynamo's warnings
    try:
        explanation = torch._dynamo.explain(fn)(*args)
    finally:
        dynamo_log.setLevel(level)
    breaks = []
    for reason in explanation.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        where = (frame.lineno, (frame.line or "").strip()) if frame else (0, "")
        breaks.append((*where, reason.reason.splitlines()[0]))
    return explanation.graph_count, breaks
