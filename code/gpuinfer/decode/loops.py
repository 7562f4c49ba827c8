"""Greedy decode loops, from naive to lean: the variants Chapter 2 measures.

Every variant has the same signature, `fn(model, prompt_ids, new_tokens)`, and returns the
generated token ids (not the prompt) as an int64 CPU tensor of shape (batch, new_tokens). All
of them pick the next token by greedy argmax and ignore EOS, so every variant does the same
work and, in FP32, must produce exactly the same tokens.

- `decode_naive` (V0): no KV cache; the whole sequence is recomputed every step, and each
  token is read back to the host (`.item()`) for a Python-side stop check.
- `decode_kv_cache` (V1): the `transformers` KV cache (`DynamicCache`): one new token per step.
- `decode_no_sync` (V2): V1 without per-step host syncs: the next token stays on the device,
  tokens go to a preallocated device buffer, and the host reads them once at the end.
- `decode_static_cache`: V2 with a preallocated `StaticCache` (fixed shapes: Chapter 3's
  starting point for CUDA graphs).
- `decode_lean`: the same model's layers called directly, without the per-call bookkeeping of
  `LlamaForCausalLM.forward` (mask construction, rotary recomputation, output objects), with a
  preallocated KV buffer and a precomputed rotary table.
- V3, the precision ablation, is the fastest of these run on `bf16_copy(model)`.
- `BASELINES`: stock `transformers` `generate()` (`gpuinfer.model.stock_generate`), with its
  default dynamic cache and with `cache_implementation="static"`: the baselines a reader
  would pick.

Each loop iterates over `gpuinfer.measure.steps.decode_steps(...)`, which marks every decode step
for the profiler and for `step_clock`. `gpuinfer.measure.rounds.split_rounds` uses those marks
to time the loops in interleaved rounds with each generation split in two: its prefill, and
its decode steps.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from transformers import DynamicCache, StaticCache

from gpuinfer.measure.steps import annotate, decode_steps
from gpuinfer.model.configs import head_dim
from gpuinfer.model.stock_generate import (STOCK_LABELS, cache_kwarg, decode_generate,
                                           decode_generate_static)

DecodeFn = Callable[[torch.nn.Module, torch.Tensor, int], torch.Tensor]


def _empty_result(prompt_ids: torch.Tensor) -> torch.Tensor:
    return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)


@torch.no_grad()
def decode_naive(model, prompt_ids: torch.Tensor, new_tokens: int, eos_token_id=None):
    """The naive loop (V0): no KV cache, the whole sequence recomputed every step, one
    host sync per step."""
    if new_tokens == 0:
        return _empty_result(prompt_ids)
    ids = prompt_ids
    generated: list[list[int]] = []
    for _ in decode_steps(range(new_tokens)):
        logits = model(input_ids=ids).logits  # logits for every position, every step
        next_id = logits[:, -1, :].argmax(dim=-1)  # (batch,)
        tokens = [t.item() for t in next_id]  # host sync: copy to the host, wait for the GPU
        generated.append(tokens)
        # The Python-side stop check that needs those values (EOS is ignored by default, so
        # that every variant generates the same number of tokens).
        if eos_token_id is not None and all(t == eos_token_id for t in tokens):
            break
        ids = torch.cat([ids, next_id[:, None]], dim=1)
    return torch.tensor(generated, dtype=torch.int64).T.contiguous()


@torch.no_grad()
def decode_kv_cache(model, prompt_ids: torch.Tensor, new_tokens: int, eos_token_id=None):
    """The KV-cache loop (V1): a DynamicCache keeps every layer's keys and values; each
    step feeds one token."""
    if new_tokens == 0:
        return _empty_result(prompt_ids)
    cache = {cache_kwarg(model): DynamicCache()}
    with annotate("prefill"):
        logits = model(input_ids=prompt_ids, use_cache=True, **cache).logits
    next_id = logits[:, -1, :].argmax(dim=-1)
    generated = [[t.item() for t in next_id]]
    for _ in decode_steps(range(1, new_tokens)):
        logits = model(input_ids=next_id[:, None], use_cache=True, **cache).logits
        next_id = logits[:, -1, :].argmax(dim=-1)
        tokens = [t.item() for t in next_id]  # the same per-step host sync as V0
        generated.append(tokens)
        if eos_token_id is not None and all(t == eos_token_id for t in tokens):
            break
    return torch.tensor(generated, dtype=torch.int64).T.contiguous()


def _decode_on_device(model, prompt_ids: torch.Tensor, new_tokens: int, cache) -> torch.Tensor:
    """The sync-free loop shared by V2 and the static-cache variant."""
    batch, prompt_len = prompt_ids.shape
    out = torch.empty((batch, new_tokens), dtype=torch.int64, device=prompt_ids.device)
    if new_tokens == 0:
        return out.cpu()
    # The attention mask of the steps, built once and added to the scores: 0 where the new
    # token may look, the most negative float at a StaticCache's unfilled tail. Left to
    # transformers it is rebuilt at every step, and transformers 5.17 builds it with
    # `torch.tensor(0.0, device=...)`: a copy from the host, which PyTorch ends with a sync.
    total = prompt_len + new_tokens
    mask = torch.full((batch, 1, 1, total), torch.finfo(model.dtype).min, device=out.device)
    mask[..., :prompt_len] = 0
    static = isinstance(cache, StaticCache)  # its keys span every slot, filled or not
    cache = {cache_kwarg(model): cache}
    with annotate("prefill"):
        logits = model(input_ids=prompt_ids, use_cache=True, **cache).logits
    next_id = logits[:, -1:, :].argmax(dim=-1)  # (batch, 1): stays on the device
    out[:, 0:1] = next_id
    for i in decode_steps(range(1, new_tokens)):
        position = prompt_len + i - 1
        mask[..., position] = 0  # a fill on the device: the new token may see itself
        step_mask = mask if static else mask[..., : position + 1]  # a view
        logits = model(input_ids=next_id, attention_mask=step_mask, use_cache=True,
                       **cache).logits
        next_id = logits[:, -1:, :].argmax(dim=-1)
        out[:, i : i + 1] = next_id  # a device-to-device copy: the host never waits
    return out.cpu()  # the one host sync of the whole generation


@torch.no_grad()
def decode_no_sync(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The loop without syncs (V2): V1 without per-step syncs; tokens collect on the
    device and are read once."""
    return _decode_on_device(model, prompt_ids, new_tokens, DynamicCache())


@torch.no_grad()
def decode_static_cache(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The static cache (V2s): V2 with a StaticCache, KV buffers of the final length,
    allocated once, updated in place."""
    max_len = prompt_ids.shape[1] + new_tokens
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    return _decode_on_device(model, prompt_ids, new_tokens, cache)


class PreallocatedKV:
    """A KV cache of fixed capacity that the Llama attention layers write into in place.

    It implements the one method the attention layers call, `update`: the new keys and values
    are copied into buffers allocated once for the whole generation, and the layer gets back
    views of the filled part. Unlike `DynamicCache` (a `torch.cat` per layer and step, which
    allocates and copies the whole cache again) nothing is allocated per step, and unlike
    `StaticCache` no attention mask over the empty tail is needed.
    """

    def __init__(self, num_layers: int, batch: int, heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (batch, heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0  # tokens stored before the current step; the loop advances it

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]


def _rotary_table(model, length: int, device, dtype):
    """cos and sin of every position, computed once by the model's own rotary module."""
    positions = torch.arange(length, device=device)[None, :]
    probe = torch.empty((1, length, 1), device=device, dtype=dtype)
    return model.model.rotary_emb(probe, position_ids=positions)  # each (1, length, head_dim)


def decode_lean(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The model's own layers called directly: no per-step masks, rotary, or allocations.

    The arithmetic is that of `LlamaForCausalLM.forward` op for op (the same modules with the
    same inputs), so the tokens are the same; what goes is the Python around it. Inference
    mode also skips autograd's per-op bookkeeping (version counters, view tracking).
    """
    with torch.inference_mode():
        out = _decode_lean(model, prompt_ids, new_tokens)
    return out.clone()  # a normal tensor: inference-mode tensors are awkward outside it


def _decode_lean(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    batch, prompt_len = prompt_ids.shape
    out = torch.empty((batch, new_tokens), dtype=torch.int64, device=prompt_ids.device)
    if new_tokens == 0:
        return out.cpu()
    llama, config = model.model, model.config
    attention = config._attn_implementation
    if attention not in ("sdpa", "eager"):  # the prompt's causal mask: a flag, or written out
        raise ValueError(f"decode_lean needs SDPA or eager attention, not {attention!r}")
    capacity = prompt_len + new_tokens
    dtype = model.lm_head.weight.dtype
    kv = PreallocatedKV(config.num_hidden_layers, batch, config.num_key_value_heads, capacity,
                        head_dim(config), dtype, prompt_ids.device)
    cos, sin = _rotary_table(model, capacity, prompt_ids.device, dtype)
    cache_kw = cache_kwarg(llama.layers[0])

    def forward(ids: torch.Tensor, start: int, mask=None) -> torch.Tensor:
        """Hidden states -> logits for tokens at positions start..start+len-1."""
        end = start + ids.shape[1]
        rope = (cos[:, start:end], sin[:, start:end])  # views of the table: no kernels
        hidden = llama.embed_tokens(ids)
        for layer in llama.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rope,
                           use_cache=True, **{cache_kw: kv})
        kv.length = end
        return model.lm_head(llama.norm(hidden))

    # A mask is needed only to hide the future inside the prompt: SDPA then uses its causal
    # flag, eager attention adds this one (the smallest float where a key is hidden, as
    # transformers writes it); a single new token may see every cached one.
    mask = None
    if attention == "eager":
        hidden_future = torch.ones(prompt_len, prompt_len, dtype=torch.bool,
                                   device=prompt_ids.device).triu(1)
        mask = torch.zeros(prompt_len, prompt_len, dtype=dtype, device=prompt_ids.device)
        mask = mask.masked_fill(hidden_future, torch.finfo(dtype).min)[None, None]
    with annotate("prefill"):
        logits = forward(prompt_ids, 0, mask)  # every prompt position, as V0 computes them
    torch.argmax(logits[:, -1:, :], dim=-1, out=out[:, 0:1])
    for i in decode_steps(range(1, new_tokens)):
        logits = forward(out[:, i - 1 : i], prompt_len + i - 1)
        torch.argmax(logits[:, -1:, :], dim=-1, out=out[:, i : i + 1])
    return out.cpu()


def bf16_copy(model):
    """A BF16 copy of a model (V3, the precision ablation); the FP32 model is left as it is."""
    return copy.deepcopy(model).to(torch.bfloat16)


LOOPS: dict[str, DecodeFn] = {  # Chapter 2's loops (their labels: gpuinfer.report.labels)
    "naive": decode_naive,
    "kv_cache": decode_kv_cache,
    "no_sync": decode_no_sync,
    "static_cache": decode_static_cache,
    "lean": decode_lean,
}
BASELINES: dict[str, DecodeFn] = {
    STOCK_LABELS["dynamic"]: decode_generate,
    STOCK_LABELS["static"]: decode_generate_static,
}
