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

The math is the book's one Llama forward (`gpuinfer.model.llama.forward`), on the
model's own weights. Attention is `model.llama.attention`: grouped-query heads folded so
that each key/value head is read once, computed either as transformers' eager attention
(two matmuls and a softmax) or by `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import logging

import torch

from gpuinfer.decode.interface import (WeightsSeen, check_capacity, check_ids,
                                       check_prompt, check_step, generate)
from gpuinfer.model.configs import load_llama
from gpuinfer.model.llama import (AS_STORED, KVCache, WeightFormat, check_attention,
                                  forward, rotary_table, weights_of)


class StaticDecoder:
    """Greedy decoding of a LlamaForCausalLM with a preallocated KV cache.

    `capacity` is the number of token slots: prompt plus new tokens must fit. All state is
    in tensors allocated once (`cache`, `tokens`, `pos`), so every call of
    `device_step` launches the same kernels on the same addresses. `attention` picks the
    attention kernel (see `attention`). `model`: a LlamaForCausalLM, or a checkpoint
    folder, loaded on `device` (default: the GPU if there is one); a model must already
    be on `device` when one is given.

    The decoder shares the model's tensors but stacks q/k/v and gate/up into copies: a
    change to the weights is refused at the next prefill, and a `load_state_dict` at the
    next checked step (`interface.WeightsSeen`). Writes that bypass PyTorch's version
    counter (`p.data.mul_(...)`, writes to a model whose tensors were made inside
    `torch.inference_mode`) cannot be seen without reading every weight: after one,
    build the decoder again (`StaticDecoder(model, batch, capacity)`, or
    `runners.decoder_for(model, ..., rebuild=True)`).
    """

    def __init__(self, model, batch: int, capacity: int, *, attention: str = "matmul",
                 weights: WeightFormat = AS_STORED, device=None):
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch={batch!r}: a number of sequences, an int >= 1")
        if device is None and not hasattr(model, "config"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model = load_llama(model, device=device)  # a module: checked to be on `device`
        check_attention(attention)  # now, not at the first step
        check_capacity(model.config, capacity)
        self.batch, self.capacity, self.attention = batch, capacity, attention
        self.seen = WeightsSeen(model)  # checked at every prefill, reloads at every step
        # The model's weights, shared (detach() makes no copy), except the stacked ones.
        self.weights = weights_of(model, weights)
        w = self.weights
        self.vocab = w.embed.shape[0]
        self.host_pos: int | None = None  # no prompt yet
        dev, dtype = w.embed.device, w.embed.dtype
        cache_shape = (batch, w.n_kv_heads, capacity, w.head_dim)
        # One tensor per layer, not one for all: a compiled step then writes each new key in
        # place, where a write into a slice of one big tensor costs a copy of all of it.
        # Zeros, not empty: masked slots get weight exactly 0, and 0 * NaN would be NaN.
        def zeros():
            return torch.zeros(cache_shape, device=dev, dtype=dtype)
        cos, sin = rotary_table(model, capacity)  # cos and sin of every slot
        self.cache = KVCache([zeros() for _ in w.layers], [zeros() for _ in w.layers],
                             cos, sin, torch.arange(capacity, device=dev))
        self.tokens = torch.zeros(batch, capacity, device=dev, dtype=torch.long)
        self.pos = torch.zeros(1, device=dev, dtype=torch.long)
        for t in self.tensors():
            # The address of each of these never changes. Telling torch.compile so lets
            # cudagraph trees use them in place (no copy into the graph's own inputs) and
            # accept the in-place writes into the cache, tokens and pos.
            torch._dynamo.mark_static_address(t)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step reads or writes."""
        c = self.cache
        weights = [t for t in self.weights.streamed() + [self.weights.embed]
                   if isinstance(t, torch.Tensor)]
        return weights + c.keys + c.values + [self.tokens, self.pos, c.slots, c.cos, c.sin]

    @property
    def cache_bytes(self) -> int:
        """Bytes of the preallocated keys and values, all layers."""
        return sum(t.nbytes for t in self.cache.keys + self.cache.values)

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor, *,
               every_position: bool = False) -> torch.Tensor:
        """Logits of the last input position (or of every one); writes the inputs' keys and
        values to the cache. input_ids: (batch, T) at the slots `positions` (T,)."""
        return forward(self.weights, self.cache, input_ids, positions,
                       attention_kernel=self.attention, every_position=every_position)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Reset the state to a new prompt: fill the cache, write the first new token, set pos.
        Returns the logits of the last prompt position.

        Run eagerly (its shapes depend on the prompt length). Everything is written in
        place, so a graph captured earlier stays valid. Slots past the prompt keep stale
        keys and values, which the mask hides until a step overwrites them.
        """
        check_prompt(self, prompt_ids)
        self.seen.check()
        self.host_pos = None  # until the prefill is whole: an interrupted one is no prompt
        length = prompt_ids.shape[1]
        self.tokens[:, :length].copy_(prompt_ids)
        logits = self.logits(self.tokens[:, :length], self.cache.slots[:length])
        self.tokens[:, length] = logits.argmax(-1)
        self.pos.fill_(length)
        self.host_pos = length
        return logits

    def device_step(self) -> torch.Tensor:
        """One greedy step, all on the device: read tokens[pos], write tokens[pos + 1], pos += 1.

        No host value is read (no `.item()`, no Python branch on a tensor), so the step
        has no sync, no graph break, and the same kernels and addresses every time: the
        step that is compiled and captured. Unchecked (`decode_step` checks).
        """
        token = self.tokens.index_select(1, self.pos)  # (batch, 1)
        next_token = self.logits(token, self.pos).argmax(-1, keepdim=True)
        self.tokens.index_copy_(1, self.pos + 1, next_token)
        self.pos.add_(1)
        return next_token

    def decode_step(self) -> torch.Tensor:
        """`device_step` called from Python: refused past the capacity (by the host's
        count of pos, `interface.check_step`), so that no write lands outside the cache."""
        at = check_step(self)
        next_token = self.device_step()
        self.host_pos = at + 1
        return next_token

    def device_step_logits(self, token: torch.Tensor) -> torch.Tensor:
        """`step_logits` unchecked: what `runners.compiled_step_logits` compiles."""
        logits = self.logits(token, self.pos)
        self.pos.add_(1)
        return logits

    def step_logits(self, token: torch.Tensor) -> torch.Tensor:
        """The step with a given input token (batch, 1) instead of the last one generated:
        its logits (batch, vocab), the cache written and pos advanced (teacher forcing).
        The token and the slot are checked first (one host read of the token)."""
        check_ids(self, token, "token")
        at = check_step(self, writes=0)  # writes slot pos only
        logits = self.device_step_logits(token)
        self.host_pos = at + 1
        return logits

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """`new_tokens` greedy tokens after the prompt, each step eager (how else to run
        the step: `decode.runners`): int64 CPU (batch, new_tokens)."""
        return generate(self, prompt_ids, new_tokens)


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
