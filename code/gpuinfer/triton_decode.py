"""A batch-1 greedy decode step written in Triton: the kernels of `gpuinfer.kernels`,
launched on state allocated once, so that the step can be captured in a CUDA graph.

Per layer the step is five kernels, each a fusion of what Chapter 3's step ran as
several:

1. `qkv_rope`: RMSNorm, the stacked q/k/v GEMV, rotary embedding; the query goes to
   `q`, the new key and value into slot pos of the cache;
2. `decode_attention`: split-KV attention of grouped-query heads, partials combined
   by the last program of each head;
3. `gemv`: the o-projection with the residual add (x += W_o o, in place);
4. `gemv_silu`: RMSNorm, the stacked gate/up GEMV, SiLU(gate) * up;
5. `gemv`: the down-projection with the residual add.

Plus `embed` (x = embed[tokens[pos]]) first and `lm_head_argmax` (final RMSNorm,
lm_head, per-block argmax, then a one-program kernel writes tokens[pos + 1] and
advances pos) last: 16 x 5 + 3 = 83 kernels for Llama-3.2-1B. Every kernel reads what
it needs from device tensors (the token, pos, the cache), so a step reads no host
value, launches the same kernels on the same addresses every time, and may be captured
once and replayed. With `pdl` (Hopper and later, compiled kernels only) each kernel is
a Programmatic Dependent Launch that loads its first weight tile while the kernel
before it finishes.

The math is StaticDecoder's (transformers' Llama forward), each op's result rounded to
the model's dtype where PyTorch rounds it, so that in FP32 the tokens equal those of
Chapter 2's loops and in BF16 the logits stay close to the model's. The prefill runs
in plain PyTorch and writes the cache in the same layout.

`quantize` (e.g. `kernels.quant.quantize_int8`) replaces every matrix the step streams
(the layers' and the lm_head) by a quantized copy, read by the same kernels; the
embedding stays as it is, since a step reads one row of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
from transformers import LlamaForCausalLM

from gpuinfer.checkpoint import load_llama
from gpuinfer.kernels.argmax import ArgmaxWorkspace, embed, lm_head_argmax
from gpuinfer.kernels.attention import AttentionWorkspace, decode_attention
from gpuinfer.kernels.common import INTERPRETED, Workspace, pdl_supported
from gpuinfer.kernels.gemv import GemvConfig, gemv, gemv_silu
from gpuinfer.kernels.quant import Int8Matrix, linear, unpack
from gpuinfer.kernels.rotary import qkv_rope
from gpuinfer.kernels.tiling import GEMVS, PAIRED, default_attention, default_configs
from gpuinfer.llama import head_dim
from gpuinfer.static_decode import layer_weights, rms_norm, rotate_half
from gpuinfer.timing import capture_graph

class TritonDecoder:
    """Greedy batch-1 decoding of a LlamaForCausalLM with Triton kernels.

    State, allocated once: `k_cache`, `v_cache` (layers, kv_heads, capacity, head_dim),
    `tokens` (1, capacity) int64, `pos` (1,) int64, and the step's activations. A step
    reads tokens[pos], writes tokens[pos + 1] and the logits, and advances pos.

    Options: `pdl` (off where unsupported: the interpreter, before Hopper); `configs`,
    {name: GemvConfig} over `default_configs` (the step's tiling, which depends on the
    weights' type) for the GEMVS; `inline_reduce`: split-K
    and the attention combine finished by the last program to arrive (False: no
    split-K, a combine kernel per layer); `inline_argmax`: the same for the lm_head
    argmax (off by default: 16,032 programs arriving at one counter cost the H200
    about 90 µs); `attention`: {n_split, block_s, num_warps} over `default_attention`
    (which picks the split by the capacity);
    `quantize`: None (the model's weights) or a function from a matrix to its quantized
    form (`quantize_int8`), applied to every matrix of the step.
    """

    def __init__(self, model: LlamaForCausalLM | str, batch: int = 1, capacity: int = 1024,
                 *, pdl: bool = True, configs: dict | None = None,
                 inline_reduce: bool = True, inline_argmax: bool = False,
                 attention: dict | None = None,
                 quantize: Callable[[torch.Tensor], Int8Matrix] | None = None):
        if batch != 1:
            raise NotImplementedError(f"TritonDecoder decodes one sequence (batch=1), "
                                      f"not {batch}: its kernels are batch-1 GEMVs")
        model = load_llama(model)  # a LlamaForCausalLM, or a checkpoint folder
        cfg, llama = model.config, model.model
        self.batch, self.capacity = batch, capacity
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = head_dim(cfg)
        self.eps = cfg.rms_norm_eps
        self.layers = layer_weights(model)  # Chapter 3's stacked q/k/v and gate/up
        self.embed = llama.embed_tokens.weight.detach()
        self.norm = llama.norm.weight.detach()
        self.lm_head = model.lm_head.weight.detach()  # the embedding itself when tied
        self.quantized = quantize is not None
        if quantize is not None:
            self.layers = [replace(w, qkv=quantize(w.qkv), o=quantize(w.o),
                                   gate_up=quantize(w.gate_up), down=quantize(w.down))
                           for w in self.layers]
            self.lm_head = quantize(self.lm_head)  # a copy: the embedding stays
        dev, dtype = self.embed.device, self.embed.dtype
        self.device, self.dtype = dev, dtype
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        n_layers, vocab = len(self.layers), self.lm_head.shape[0]

        def zeros(*shape, dtype=dtype):  # zeros: a NaN left anywhere would show
            return torch.zeros(shape, device=dev, dtype=dtype)
        cache = (n_layers, self.n_kv, capacity, self.head_dim)
        self.k_cache, self.v_cache = zeros(*cache), zeros(*cache)
        self.tokens = zeros(batch, capacity, dtype=torch.long)
        self.pos = zeros(1, dtype=torch.long)
        self.x, self.h = zeros(hidden), zeros(inter)  # residual stream, SiLU(gate) * up
        self.q, self.attn = (zeros(self.n_heads * self.head_dim) for _ in range(2))
        self.logits = zeros(vocab)
        with torch.no_grad():  # cos and sin of every slot, by the model's rotary module
            slots = torch.arange(capacity, device=dev)[None]
            cos, sin = llama.rotary_emb(self.embed, slots)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # (capacity, d)

        self.pdl = pdl and pdl_supported(dev)
        self.inline_reduce = inline_reduce
        self.inline_argmax = inline_argmax and inline_reduce
        self.on_gpu = dev.type == "cuda" and not INTERPRETED  # compiled kernels, graphs
        weights = "int8" if self.quantized else "bf16"
        configs = {**default_configs(self.on_gpu, weights), **(configs or {})}
        ks = {"qkv": hidden, "o": self.n_heads * self.head_dim, "gate_up": hidden,
              "down": inter, "lm_head": hidden}
        self.configs = {name: self._fit(configs[name], ks[name]) for name in GEMVS}
        if self.configs["lm_head"].split_k != 1:
            raise ValueError("the lm_head GEMV has no split-K")
        self.attention = {**default_attention(self.on_gpu, capacity),
                          **(attention or {})}
        outs = {"qkv": (self.q.numel() + 2 * self.n_kv * self.head_dim) // 2,
                "o": hidden, "gate_up": inter, "down": hidden}  # rows or pairs
        need = [(c.grid(outs[n], ks[n]), c.block_n * (1 + (n in PAIRED)))
                for n, c in self.configs.items() if n != "lm_head"]
        self.workspace = Workspace(dev, max(b * s * r for (b, s), r in need),
                                   max(b for (b, _), _ in need))
        self.attn_workspace = AttentionWorkspace(
            dev, self.n_kv, self.n_heads // self.n_kv, self.head_dim,
            self.attention["n_split"])
        self.argmax_workspace = ArgmaxWorkspace(
            dev, triton.cdiv(vocab, self.configs["lm_head"].block_n))
        self.graph: torch.cuda.CUDAGraph | None = None

    def _fit(self, config: GemvConfig, k: int) -> GemvConfig:
        split_k = config.split_k if self.inline_reduce else 1  # needs the last program
        return replace(config.fit(k), split_k=split_k)

    def weights(self) -> list[torch.Tensor | Int8Matrix]:
        """Every weight a step reads in full: the layers' and the lm_head."""
        return [w for layer in self.layers for w in vars(layer).values()] + [
            self.norm, self.lm_head]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step reads or writes (their addresses never change)."""
        weights = [t for w in self.weights() for t in unpack(w) if t is not None]
        spaces = (self.workspace, self.attn_workspace, self.argmax_workspace)
        ws = [t for space in spaces for t in vars(space).values()
              if isinstance(t, torch.Tensor)]
        state = [self.k_cache, self.v_cache, self.tokens, self.pos, self.x, self.q,
                 self.attn, self.h, self.logits, self.cos, self.sin]
        return weights + ws + [self.embed] + state

    def step_bytes(self, context: int) -> int:
        """Bytes a step at `context` cached slots must move: every weight once, as it is
        stored (int8 and its scales, when quantized), one row of the embedding, the
        cache read (context + 1 slots) and one slot of it written."""
        weights = sum(w.nbytes for w in self.weights()) + self.embed[0].nbytes
        kv_slot = 2 * len(self.layers) * self.n_kv * self.head_dim * self.dtype.itemsize
        return weights + kv_slot * (context + 2)

    def decode_step(self) -> None:
        """One greedy step of Triton kernels, reading no host value: tokens[pos] in,
        tokens[pos + 1] and `logits` out, pos += 1."""
        pdl, ws, cfg, eps = self.pdl, self.workspace, self.configs, self.eps
        row = self.tokens[0]
        embed(self.embed, row, self.pos, self.x, pdl=pdl)
        for i, w in enumerate(self.layers):
            qkv_rope(w.qkv, self.x, self.q, self.k_cache[i], self.v_cache[i], self.cos,
                     self.sin, self.pos, n_heads=self.n_heads, norm=w.input_norm,
                     eps=eps, config=cfg["qkv"], pdl=pdl, workspace=ws)
            decode_attention(self.q, self.k_cache[i], self.v_cache[i], self.pos,
                             self.attn, inline_combine=self.inline_reduce, pdl=pdl,
                             workspace=self.attn_workspace, **self.attention)
            gemv(w.o, self.attn, self.x, residual=self.x, config=cfg["o"], pdl=pdl,
                 workspace=ws)
            gemv_silu(w.gate_up, self.x, self.h, norm=w.post_norm, eps=eps,
                      config=cfg["gate_up"], pdl=pdl, workspace=ws)
            gemv(w.down, self.h, self.x, residual=self.x, config=cfg["down"], pdl=pdl,
                 workspace=ws)
        lm_head_argmax(self.lm_head, self.x, self.logits, row, self.pos, norm=self.norm,
                       eps=eps, config=cfg["lm_head"], inline=self.inline_argmax,
                       pdl=pdl, workspace=self.argmax_workspace)

    def capture(self, warmup: int = 2) -> torch.cuda.CUDAGraph:
        """Capture decode_step in a CUDA graph (compiling the kernels first, on a side
        stream, as the CUDA-graph docs prescribe), keeping the decoder's state.

        The warm-up steps run from pos and write tokens and cache slots past it; pos and
        the tokens are saved before and put back after, and the cache slots past pos
        are hidden from attention until a step overwrites them. So a capture right
        after a prefill keeps the prefill (capturing zeroed pos before: the warm-up
        steps overwrote the prefilled cache, silently). Without room for the warm-up
        steps past pos it raises."""
        start = int(self.pos.item())
        if start + warmup >= self.capacity:
            raise ValueError(f"capturing the step runs it {warmup} times from slot "
                             f"{start}, past the cache's {self.capacity} slots: capture "
                             "before the prefill, or build the decoder with room for them")
        saved_tokens = self.tokens.clone()
        try:
            self.graph, _ = capture_graph(self.decode_step, warmup=warmup)
        finally:
            self.pos.fill_(start)
            self.tokens.copy_(saved_tokens)
        return self.graph

    def step_function(self, graph: bool | None = None):
        """The per-token call: the captured step's replay (default on a GPU), or not."""
        if graph is None:
            graph = self.on_gpu
        if not graph:
            return self.decode_step
        return (self.graph or self.capture()).replay

    @torch.no_grad()
    def forward_torch(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the last of input_ids (1, T) at slots 0..T-1, in plain PyTorch,
        writing their keys and values into the cache (the prefill)."""
        length = input_ids.shape[1]
        h, kv, d = self.n_heads, self.n_kv, self.head_dim
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.cos[:length, None, :], self.sin[:length, None, :]
        for i, w in enumerate(self.layers):
            qkv = linear(rms_norm(x, w.input_norm, self.eps), w.qkv)
            qkv = qkv.view(1, length, h + 2 * kv, d)
            qk = qkv[:, :, : h + kv]
            qk = qk * cos + rotate_half(qk) * sin
            q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]
            self.k_cache[i, :, :length] = k[0].transpose(0, 1)
            self.v_cache[i, :, :length] = v[0].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                scale=d**-0.5, enable_gqa=True)
            x = x + linear(o.transpose(1, 2).reshape(1, length, h * d), w.o)
            gate_up = linear(rms_norm(x, w.post_norm, self.eps), w.gate_up)
            gate, up = gate_up.chunk(2, -1)
            x = x + linear(F.silu(gate) * up, w.down)
        return linear(rms_norm(x[:, -1], self.norm, self.eps), self.lm_head)

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Reset the state to a new prompt: the cache of its slots, its first new token
        in tokens[len], pos = len. In place, so a captured graph stays valid. Returns the
        logits of the last prompt position (1, vocab), as StaticDecoder.prefill does."""
        length = prompt_ids.shape[1]
        if prompt_ids.shape[0] != 1 or length >= self.capacity:
            raise ValueError(f"prompt {tuple(prompt_ids.shape)} does not fit batch 1, "
                             f"capacity {self.capacity}")
        self.tokens[:, :length].copy_(prompt_ids)
        logits = self.forward_torch(self.tokens[:, :length])
        self.tokens[:, length] = logits.argmax(-1)
        self.pos.fill_(length)
        return logits

    @torch.no_grad()
    def step_logits(self, token, graph: bool = False) -> torch.Tensor:
        """Teacher forcing: put `token` at tokens[pos] and run one step; a copy of its
        logits (1, vocab), as StaticDecoder.step_logits gives them. The step still writes
        its own argmax into tokens[pos + 1]."""
        token = torch.as_tensor(token, device=self.device, dtype=torch.long).view(1, 1)
        self.tokens.index_copy_(1, self.pos, token)
        self.step_function(graph)()
        return self.logits.clone()[None]

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int,
                 graph: bool | None = None) -> torch.Tensor:
        """`new_tokens` greedy tokens after the prompt: int64 CPU (1, new_tokens)."""
        if prompt_ids.shape[0] != 1:
            raise NotImplementedError("TritonDecoder decodes one sequence (batch=1)")
        if new_tokens < 1:
            return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
        length = prompt_ids.shape[1]
        if length + new_tokens > self.capacity:
            raise ValueError(f"{length} + {new_tokens} tokens exceed {self.capacity=}")
        if self.graph is None and (graph or graph is None and self.on_gpu):
            self.pos.zero_()  # a first capture finds room: the prefill replaces the state
        step = self.step_function(graph)
        self.prefill(prompt_ids.to(self.device))
        for _ in range(new_tokens - 1):
            step()
        return self.tokens[:, length : length + new_tokens].cpu()
