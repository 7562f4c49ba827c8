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

One decode step is then a fixed sequence of kernels on fixed buffers. It is captured by
hand with `torch.cuda.CUDAGraph` (`capture_graph`), or compiled with
`torch.compile(mode="reduce-overhead")`, which fuses it and graphs it. Compiled with `pdl`,
Inductor's kernels use Programmatic Dependent Launch (Hopper and later): each may start
before the kernel ahead of it has finished, which hides the gap between two kernels of a graph.

The math is the `transformers` Llama forward, written out on the model's own weights (only
the stacked q/k/v and gate/up matrices are new tensors), so that in fp32 the tokens equal
those of Chapter 2's loops. Attention is `attention`: grouped-query heads folded so that
each key/value head is read once, computed either as transformers' eager attention (two
matmuls and a softmax) or by `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import os
import tempfile
import time
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from gpuinfer.decode import _steps
from gpuinfer.profiling import load_trace, save_trace
from gpuinfer.timing import Timing, benchmark, capture_graph


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
        _check_attention(kernel)
    o = o.view(batch, kv_heads, length, group, head_dim).permute(0, 2, 1, 3, 4)
    return o.reshape(batch, length, heads * head_dim)


def _check_attention(kernel: str) -> None:
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


class StaticDecoder:
    """Greedy decoding of a LlamaForCausalLM with a preallocated KV cache.

    `capacity` is the number of token slots: prompt plus new tokens must fit. All state is
    in tensors allocated once (`k_cache`, `v_cache`, `tokens`, `pos`), so every call of
    `decode_step` launches the same kernels on the same addresses.

    `attention` picks the attention kernel (see `attention`). `tune` turns on Inductor's
    coordinate-descent tuning of the block sizes of the kernels it generates, as gpt-fast
    does: faster kernels for a longer compilation. `pdl` turns on Programmatic Dependent
    Launch for those kernels (see `compile_options`).
    """

    def __init__(self, model: LlamaForCausalLM, batch: int, capacity: int, *,
                 attention: str = "matmul", tune: bool = True, pdl: bool = False):
        cfg, llama = model.config, model.model
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise NotImplementedError("StaticDecoder covers Llamas without biases")
        _check_attention(attention)  # now, not at the first step
        self.batch, self.capacity = batch, capacity
        self.attention, self.tune, self.pdl = attention, tune, pdl
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        # The model's weights, shared (detach() makes no copy), except the two stacked ones.
        self.embed = llama.embed_tokens.weight.detach()
        self.layers = [
            LayerWeights(
                layer.input_layernorm.weight.detach(),
                torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                           layer.self_attn.v_proj.weight]).detach(),
                layer.self_attn.o_proj.weight.detach(),
                layer.post_attention_layernorm.weight.detach(),
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).detach(),
                layer.mlp.down_proj.weight.detach(),
            )
            for layer in llama.layers
        ]
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
        self.runners: dict = {}  # per way of running a step: its graph or compiled function

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

    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Reset the state to a new prompt: fill the cache, write the first new token, set pos.

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

    def step_function(self, how: str):
        """The per-token call for one way of running decode_step (see `HOW`)."""
        if how == "eager":
            return self.decode_step
        if how not in self.runners:
            with torch.no_grad():  # as every call will be: no recompilation for grad mode
                self.runners[how] = self._make_runner(how)
        return self.runners[how]

    def compile_options(self) -> dict:
        """The Inductor options the step is compiled with.

        triton.enable_pdl (off by default in Inductor) makes every Triton kernel it generates
        a Programmatic Dependent Launch: the kernel may be launched while the one before it
        is still running, and waits (`griddepcontrol.wait`) before it touches memory that
        kernel writes, so the launch overlaps the previous kernel's tail. It needs a Hopper or
        later GPU (elsewhere Inductor ignores it), and library kernels (cuBLAS, cuDNN)
        launch as before.
        """
        return {"coordinate_descent_tuning": self.tune, "triton.enable_pdl": self.pdl}

    def _make_runner(self, how: str):
        # Capture and compilation run decode_step a few times: start them from slot 0, so
        # that they stay inside the cache whatever state the last generation left.
        self.pos.zero_()
        if how == "graph":  # the eager step's kernels, captured by hand
            return capture_graph(self.decode_step, warmup=3)[0].replay
        options = self.compile_options()
        if how == "compiled":  # fused by Inductor, launched kernel by kernel
            return torch.compile(self.decode_step, fullgraph=True, options=options)
        if how == "compiled+graph":  # the fused kernels, captured by hand
            return capture_graph(self.step_function("compiled"), warmup=3)[0].replay
        if how == "reduce-overhead":  # fused, and graphed by cudagraph trees
            # mode="reduce-overhead" is the option triton.cudagraphs; spelled out, because
            # torch.compile takes a mode or options, not both.
            compiled = torch.compile(self.decode_step, fullgraph=True,
                                     options={**options, "triton.cudagraphs": True})

            def step():
                # Start a new cudagraph-trees generation: the previous step's outputs may
                # now be overwritten. We never read them: the tokens live in self.tokens,
                # our own tensor, not an output of the graph.
                torch.compiler.cudagraph_mark_step_begin()
                compiled()

            step.compiled = compiled
            return step
        raise ValueError(f"unknown way to run a step {how!r}; one of {HOW}")

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int,
                 how: str = "eager") -> torch.Tensor:
        """`new_tokens` greedy tokens after the prompt, an int64 CPU tensor (batch, new_tokens)."""
        if new_tokens < 1:
            return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
        if prompt_ids.shape[1] + new_tokens > self.capacity:
            raise ValueError(f"{prompt_ids.shape[1]} + {new_tokens} tokens exceed {self.capacity=}")
        step = self.step_function(how)  # capture or compile first: they run decode_step
        self.prefill(prompt_ids)
        for _ in _steps(range(1, new_tokens)):  # marks each step for the profiler
            step()
        start = prompt_ids.shape[1]
        return self.tokens[:, start : start + new_tokens].cpu()  # the one host sync


HOW = ("eager", "graph", "compiled", "compiled+graph", "reduce-overhead")


def capacity_for(prompt_len: int, new_tokens: int, multiple: int = 64) -> int:
    """Slots for prompt + new tokens, rounded up so that nearby lengths share one decoder
    (and the mask rows stay aligned for the attention kernel)."""
    need = prompt_len + new_tokens
    return -(-need // multiple) * multiple


_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def static_decoder(model: LlamaForCausalLM, batch: int, capacity: int,
                   **options) -> StaticDecoder:
    """The StaticDecoder of `model` for this batch, capacity and `options` (attention, tune, pdl),
    built on first use and kept while the model lives, with its graphs and compiled steps,
    like generate()'s static cache."""
    per_model = _decoders.setdefault(model, {})
    key = (batch, capacity, *sorted(options.items()))
    if key not in per_model:
        # Ordinary tensors even if the caller is in inference mode: the state is written in
        # place by every later call, whatever mode that call runs in.
        with torch.inference_mode(False), torch.no_grad():
            per_model[key] = StaticDecoder(model, batch, capacity, **options)
    return per_model[key]


def decode_with(how: str, **options):
    """The decode variant that runs each step `how`: fn(model, prompt_ids, new_tokens), on the
    StaticDecoder made with `options` (attention, tune, pdl)."""

    def decode(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        with torch.no_grad():
            capacity = capacity_for(prompt_ids.shape[1], new_tokens)
            decoder = static_decoder(model, prompt_ids.shape[0], capacity, **options)
            return decoder.generate(prompt_ids, new_tokens, how)

    name = "_".join(["decode", how.replace("-", "_").replace("+", "_")]
                    + [k if v is True else f"{k}_{v}" for k, v in sorted(options.items())])
    decode.__name__ = decode.__qualname__ = name
    return decode


decode_static = decode_with("eager")  # V4: the static cache, one eager decode_step per token
decode_cuda_graph = decode_with("graph")  # V5: the eager step captured by hand, replayed
decode_compiled = decode_with("compiled")  # V6: torch.compile, fused kernels, no graph
decode_compiled_graph = decode_with("compiled+graph")  # V7: the compiled step captured by hand
decode_reduce_overhead = decode_with("reduce-overhead")  # V8: torch.compile reduce-overhead
# V9: V7 with Programmatic Dependent Launch: each kernel's launch overlaps the previous one
decode_compiled_graph_pdl = decode_with("compiled+graph", pdl=True)

VARIANTS = {
    "V4 static step": decode_static,
    "V5 static step + CUDA graph": decode_cuda_graph,
    "V6 compiled step": decode_compiled,
    "V7 compiled step + CUDA graph": decode_compiled_graph,
    "V8 compiled step, reduce-overhead": decode_reduce_overhead,
    "V9 compiled step (PDL) + CUDA graph": decode_compiled_graph_pdl,
}


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
    import logging

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


def timed_first_call(fn, *args) -> tuple[object, float]:
    """fn(*args) and its wall-clock seconds, device work included (for compile times)."""
    _sync()
    t0 = time.perf_counter()
    out = fn(*args)
    _sync()
    return out, time.perf_counter() - t0


def step_timing(decoder: StaticDecoder, prompt_ids: torch.Tensor, how: str, *,
                warmup: int = 10, repeats: int = 100) -> Timing:
    """The time of one decode step run `how`, from the state just after a prefill.

    Each timed call is one step (CUDA events around it); the steps run back to back, as
    in a generation, so a host slower than the GPU shows up as a longer step.
    """
    if prompt_ids.shape[1] + 1 + warmup + repeats > decoder.capacity:
        raise ValueError("the timed steps would run past the end of the cache")
    step = decoder.step_function(how)
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        return benchmark(step, warmup=warmup, repeats=repeats)


# GPU clock cycles of the head start: about 50 ms at an H200's 1.98 GHz, far longer than the
# host needs to launch 20 graph replays under the profiler (a few hundred µs each).
HEAD_START_CYCLES = 100_000_000


def profile_steps(decoder: StaticDecoder, prompt_ids: torch.Tensor, how: str,
                  path: str | None = None, *, steps: int = 20, warmup: int = 3,
                  head_start: bool = False) -> dict:
    """Profile `steps` decode steps run `how` (each marked like Chapter 2's loops, so that
    `gpuinfer.profiling` reads them); return the Chrome trace, also written to `path` if given.

    The profiler slows the host, a graph launch most of all, so that in its trace a short
    graphed step waits for its own launch. With `head_start`, a sleep kernel first holds the
    GPU (`HEAD_START_CYCLES`) while the host launches every step; the GPU then runs the steps
    back to back, as it does at speed, and the trace's GPU lane shows the steps' own gaps
    (`StepStats.queued_ahead` says whether the head start was long enough).
    """
    step = decoder.step_function(how)
    on_gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        for _ in range(warmup):
            step()
        _sync()
        with torch.profiler.profile(activities=activities) as prof:
            if head_start and on_gpu:
                torch.cuda._sleep(HEAD_START_CYCLES)  # a spin kernel, from PyTorch's own tests
            for _ in _steps(range(steps)):
                step()
            _sync()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        trace = load_trace(raw)
    if path is not None:
        save_trace(trace, path)
    return trace


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
