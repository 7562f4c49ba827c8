"""A batch-1 greedy decode step written in Triton: the kernels of `gpuinfer.kernels`,
launched on state allocated once, so that the step can be captured in a CUDA graph.

Per layer the step is five kernels, each a fusion of what Chapter 3's step ran as
several:

1. `qkv_rope`: RMSNorm, the stacked q/k/v GEMV, rotary embedding; the query goes to
   `q`, the new key and value into slot pos of the cache;
2. `decode_attention`: attention of grouped-query heads, one program per key/value
   head for a small cache, split over the keys for a longer one (partials combined by
   the last program of each head);
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

The math is the book's one Llama forward (`gpuinfer.model.llama.forward`), each op's
result rounded to the model's dtype where PyTorch rounds it, so that in FP32 the tokens
equal those of Chapter 2's loops and in BF16 the logits stay close to the model's. The
prefill runs that forward itself, in PyTorch, on the same cache.

`weights` (a `model.llama.WeightFormat`: `AS_STORED`, `INT8`) says how every matrix the
step streams (the layers' and the lm_head) is stored; the same kernels read either. The
embedding stays as it is, since a step reads one row of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import triton

from gpuinfer.decode.interface import (WeightsSeen, check_capacity, check_ids, check_keys,
                                       check_prompt, check_step, generate, graphed_step)
from gpuinfer.kernels.attention import AttentionWorkspace, decode_attention
from gpuinfer.kernels.common import INTERPRETED, Workspace, compile_ahead, pdl_supported
from gpuinfer.kernels.embed_head import ArgmaxWorkspace, embed, lm_head_argmax
from gpuinfer.kernels.gemv import GemvConfig, gemv, gemv_silu
from gpuinfer.kernels.qkv_rope import qkv_rope
from gpuinfer.model.quant import Int8Matrix, unpack
from gpuinfer.kernels.tiling import GEMVS, PAIRED, default_attention, default_configs
from gpuinfer.model.configs import load_llama
from gpuinfer.model.llama import AS_STORED, KVCache, WeightFormat, forward, rotary_table, \
    weights_of


MAX_QUERY = 17  # the most tokens a pass takes: a verify pass of up to 16 proposals
ATTENTION_OPTIONS = ("n_split", "block_s", "num_warps")  # what `attention=` may set


class TritonDecoder:
    """Greedy batch-1 decoding of a LlamaForCausalLM with Triton kernels.

    State, allocated once: `k_cache`, `v_cache` (layers, kv_heads, capacity, head_dim),
    `tokens` (1, capacity) int64, `pos` (1,) int64, and the step's activations. A step
    reads tokens[pos], writes tokens[pos + 1] and the logits, and advances pos.

    Options: `pdl` (off where unsupported: the interpreter, before Hopper); `configs`,
    {name: GemvConfig} over `default_configs` (the step's tiling, which depends on the
    weights' type) for the GEMVS; `inline_reduce`: split-K and the attention combine
    finished by the last program to arrive (False: no split-K, a combine kernel per
    layer); `inline_argmax`: the same for the lm_head argmax (off by default: 16,032
    programs arriving at one counter cost the H200 about 90 µs); `attention`: {n_split,
    block_s, num_warps} over `default_attention` (which picks the split by the
    capacity); `weights`: the format the step's matrices are stored in (`AS_STORED`,
    `INT8`); `max_query`: the most tokens a pass takes (`device_pass`, `verify_step`:
    Chapter 6's verify passes; its buffers hold a row per token, row 0 a step's).
    `model`: a LlamaForCausalLM or a checkpoint folder (`model.configs.load_llama`),
    loaded on `device` (default: where the kernels run, the GPU unless they are
    interpreted); a model must already be on `device` when one is given.

    A change to the weights is refused at the next prefill, a `load_state_dict` at the
    next checked step (`interface.WeightsSeen`); writes that bypass the version counter
    (`p.data.mul_`, an inference tensor's) are not seen: build a new TritonDecoder.
    """

    def __init__(self, model, batch: int = 1, capacity: int = 1024,
                 *, pdl: bool = True, configs: dict | None = None,
                 inline_reduce: bool = True, inline_argmax: bool = False,
                 attention: dict | None = None, weights: WeightFormat = AS_STORED,
                 max_query: int = 1, device=None):
        if isinstance(max_query, bool) or not isinstance(max_query, int) or \
                not 1 <= max_query <= MAX_QUERY:
            raise ValueError(f"max_query={max_query!r}: the most tokens a pass takes, "
                             f"an int in 1 ... {MAX_QUERY}")
        if batch != 1 or type(batch) is not int:  # 1.0 and True are not a batch
            raise NotImplementedError(f"TritonDecoder decodes one sequence (batch=1), "
                                      f"not {batch!r}: its kernels are batch-1 GEMVs")
        if device is None and not hasattr(model, "config"):
            device = "cpu" if INTERPRETED else "cuda"
        model = load_llama(model, device=device)  # a module: checked to be on `device`
        check_keys("TritonDecoder(configs=...)", configs, GEMVS)
        check_keys("TritonDecoder(attention=...)", attention, ATTENTION_OPTIONS)
        cfg = model.config
        check_capacity(cfg, capacity)
        where = model.lm_head.weight.device
        if where.type != "cuda" and not INTERPRETED:
            raise ValueError(
                f"the model's weights are on {where}: the Triton kernels run on a GPU. "
                "Load it there (load_llama(..., device='cuda'), or TritonDecoder(folder, "
                "device='cuda')), or set TRITON_INTERPRET=1 before importing the kernels "
                "to interpret them on the CPU (slowly)")
        self.batch, self.capacity = batch, capacity
        self.seen = WeightsSeen(model)  # checked at every prefill, reloads at every step
        self.model_weights = weights_of(model, weights)  # the stacked q/k/v and gate/up
        w = self.model_weights
        self.n_heads, self.n_kv, self.head_dim, self.eps = (w.n_heads, w.n_kv_heads,
                                                            w.head_dim, w.eps)
        self.layers, self.embed, self.norm = w.layers, w.embed, w.norm
        self.lm_head = w.lm_head  # the embedding itself when tied and as stored
        self.quantized = weights is not AS_STORED
        dev, dtype = self.embed.device, self.embed.dtype
        self.device, self.dtype = dev, dtype
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        n_layers, vocab = len(self.layers), self.lm_head.shape[0]
        self.vocab = self.embed.shape[0]
        self.host_pos: int | None = None  # no prompt yet

        def zeros(*shape, dtype=dtype):  # zeros: a NaN left anywhere would show
            return torch.zeros(shape, device=dev, dtype=dtype)
        cache = (n_layers, self.n_kv, capacity, self.head_dim)
        self.k_cache, self.v_cache = zeros(*cache), zeros(*cache)
        self.tokens = zeros(batch, capacity, dtype=torch.long)
        self.pos = zeros(1, dtype=torch.long)
        # A row per token of a pass (a step: row 0): the residual stream, SiLU(gate) * up,
        # the queries, attention's output, the logits.
        self.max_query = max_query
        heads = self.n_heads * self.head_dim
        self.xs, self.hs = zeros(max_query, hidden), zeros(max_query, inter)
        self.qs, self.attns = zeros(max_query, heads), zeros(max_query, heads)
        self.all_logits = zeros(max_query, vocab)
        self.x, self.h, self.q, self.attn, self.logits = (
            b[0] for b in (self.xs, self.hs, self.qs, self.attns, self.all_logits))
        self.cos, self.sin = rotary_table(model, capacity)  # (capacity, d)
        # The prefill's view of the cache: one (1, kv_heads, capacity, d) view per layer.
        self.cache = KVCache(list(self.k_cache[:, None]), list(self.v_cache[:, None]),
                             self.cos, self.sin, torch.arange(capacity, device=dev))

        self.pdl = pdl and pdl_supported(dev)
        self.inline_reduce = inline_reduce
        self.inline_argmax = inline_argmax and inline_reduce
        self.on_gpu = dev.type == "cuda" and not INTERPRETED  # compiled kernels, graphs
        configs = {**default_configs(self.on_gpu, weights.name), **(configs or {})}
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
        rows = triton.next_power_of_2(max_query)  # a pass's partials: a row per token
        self.workspace = Workspace(dev, max(b * s * r for (b, s), r in need) * rows,
                                   max(b for (b, _), _ in need))
        self.attn_workspace = AttentionWorkspace(
            dev, self.n_kv, self.n_heads // self.n_kv, self.head_dim,
            self.attention["n_split"], rows=max_query)
        self.argmax_workspace = ArgmaxWorkspace(
            dev, triton.cdiv(vocab, self.configs["lm_head"].block_n), rows=max_query)
        self.graph: Callable[[], None] | None = None  # the captured step's replay
        self.compiled = not self.on_gpu  # the step's kernels compiled (`compile`)

    def _fit(self, config: GemvConfig, k: int) -> GemvConfig:
        split_k = config.split_k if self.inline_reduce else 1  # needs the last program
        return replace(config.fit(k), split_k=split_k)

    def weights(self) -> list[torch.Tensor | Int8Matrix]:
        """Every weight a step reads in full: the layers' and the lm_head."""
        return self.model_weights.streamed()

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step reads or writes (their addresses never change)."""
        weights = [t for w in self.weights() for t in unpack(w) if t is not None]
        spaces = (self.workspace, self.attn_workspace, self.argmax_workspace)
        ws = [t for space in spaces for t in vars(space).values()
              if isinstance(t, torch.Tensor)]
        state = [self.k_cache, self.v_cache, self.tokens, self.pos, self.xs, self.qs,
                 self.attns, self.hs, self.all_logits, self.cos, self.sin]
        return weights + ws + [self.embed] + state

    def step_bytes(self, context: int) -> int:
        """Bytes a step at `context` cached slots must move: every weight once, as it is
        stored (int8 and its scales, when quantized), one row of the embedding, the
        cache read (context + 1 slots) and one slot of it written."""
        weights = sum(w.nbytes for w in self.weights()) + self.embed[0].nbytes
        kv_slot = 2 * len(self.layers) * self.n_kv * self.head_dim * self.dtype.itemsize
        return weights + kv_slot * (context + 2)

    def decode_step(self) -> None:
        """`device_step` called from Python, refused past the capacity by the host's
        count of pos (`interface.check_step`); an unchecked replay writes nothing past
        the cache and the tokens either: the kernels mask such writes."""
        at = check_step(self)
        self.device_step()
        self.host_pos = at + 1

    def device_step(self) -> None:
        """One greedy step of Triton kernels, reading no host value: tokens[pos] in,
        tokens[pos + 1] and `logits` out, pos += 1. Unchecked: what is captured."""
        self.device_pass(1)

    def verify_step(self, query: int) -> None:
        """A verify pass, unchecked: the `query` tokens at slots pos - query + 1 ... pos
        (the last committed token and its proposals) in one pass that reads the weights
        once; the proposals accepted on the device up to the first the model would not
        have chosen, its choices written after them, pos moved to the last slot written
        (`embed_head.pick_tokens`): 1 ... query tokens committed, no host value read."""
        self.device_pass(query, accept=True)

    def refresh_step(self) -> None:
        """A step that also recomputes the cache slot before pos (slots pos - 1 and pos
        in one pass; its choice after pos written, pos += 1): a draft's first step of a
        speculative pass, which has not seen slot pos - 1 if the target accepted every
        proposal of the pass before. Unchecked."""
        self.device_pass(2)

    def device_pass(self, query: int = 1, accept: bool = False) -> None:
        """The step's kernels over the `query` tokens at slots pos - query + 1 ... pos,
        each kernel taking all of them at once (`all_logits` holds each token's
        logits); then the last token's choice written after it and pos += 1, or, with
        `accept`, the verify pass's acceptance (`verify_step`). Unchecked."""
        if not 1 <= query <= self.max_query:
            raise ValueError(f"a pass of {query} tokens: this decoder takes 1 ... "
                             f"{self.max_query} (TritonDecoder(..., max_query=...))")
        pdl, ws, cfg, eps = self.pdl, self.workspace, self.configs, self.eps
        x, h, q, attn, logits = (b[0] if query == 1 else b[:query] for b in
                                 (self.xs, self.hs, self.qs, self.attns, self.all_logits))
        row = self.tokens[0]
        embed(self.embed, row, self.pos, x, pdl=pdl)
        for i, w in enumerate(self.layers):
            qkv_rope(w.qkv, x, q, self.k_cache[i], self.v_cache[i], self.cos, self.sin,
                     self.pos, n_heads=self.n_heads, norm=w.input_norm, eps=eps,
                     config=cfg["qkv"], pdl=pdl, workspace=ws)
            decode_attention(q, self.k_cache[i], self.v_cache[i], self.pos, attn,
                             inline_combine=self.inline_reduce, pdl=pdl,
                             workspace=self.attn_workspace, **self.attention)
            self._product("o", w.o, attn, x, residual=x)
            self._product("gate_up", w.gate_up, x, h, norm=w.post_norm, eps=eps)
            self._product("down", w.down, h, x, residual=x)
        lm_head_argmax(self.lm_head, x, logits, row, self.pos, norm=self.norm, eps=eps,
                       config=cfg["lm_head"], inline=self.inline_argmax, accept=accept,
                       pdl=pdl, workspace=self.argmax_workspace)

    def _product(self, name: str, weight, x, out, **fusions) -> None:
        """out = matrix `name` (o, gate_up, down) times x with its fusions, on the
        step's kernels: a hook a subclass overrides to run others (`triton_step8`)."""
        fn = gemv_silu if name == "gate_up" else gemv
        fn(weight, x, out, config=self.configs[name], pdl=self.pdl,
           workspace=self.workspace, **fusions)

    def capture(self, warmup: int = 2) -> Callable[[], None]:
        """Capture device_step in a CUDA graph (`decode.interface.graphed_step`: the
        decoder's state is the same after as before, a prefill included); its replay."""
        self.graph = graphed_step(self, warmup=warmup)
        return self.graph

    def compile(self) -> None:
        """Compile the step's kernels at once, in parallel (`common.compile_ahead`), if
        not yet: else the step's first call would compile them one after another. The
        step's own calls do it first."""
        if not self.compiled:
            compile_ahead(self.device_step)
            self.compiled = True

    def step_function(self, graph: bool | None = None):
        """The per-token call, unchecked: the captured step's replay (default on a GPU),
        or `device_step`."""
        self.compile()
        if not (self.on_gpu if graph is None else graph):
            return self.device_step
        return self.graph or self.capture()

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Reset the state to a new prompt: the cache of its slots (the book's Llama
        forward, in PyTorch), its first new token in tokens[len], pos = len. In place, so
        a captured graph stays valid. Returns the logits of the last prompt position."""
        check_prompt(self, prompt_ids)
        self.seen.check()
        self.host_pos = None  # until the prefill is whole: an interrupted one is no prompt
        length = prompt_ids.shape[1]
        self.tokens[:, :length].copy_(prompt_ids)
        logits = forward(self.model_weights, self.cache, self.tokens[:, :length],
                         self.cache.slots[:length])
        self.tokens[:, length] = logits.argmax(-1)
        self.pos.fill_(length)
        self.host_pos = length
        return logits

    @torch.no_grad()
    def step_logits(self, token, graph: bool = False) -> torch.Tensor:
        """Teacher forcing: put `token` at tokens[pos] and run one step; a copy of its
        logits (1, vocab), as StaticDecoder.step_logits gives them. The step still writes
        its own argmax into tokens[pos + 1]. The token and the slot are checked first."""
        token = torch.as_tensor(token, device=self.device)
        check_ids(self, token.view(1, -1) if token.dim() < 2 else token, "token")
        if token.numel() != 1:
            raise ValueError(f"a token of shape {tuple(token.shape)}: one token, (1, 1)")
        at = check_step(self)
        self.tokens.index_copy_(1, self.pos, token.long().view(1, 1))
        self.step_function(graph)()
        self.host_pos = at + 1
        return self.logits.clone()[None]

    @torch.no_grad()
    def pass_logits(self, ids) -> torch.Tensor:
        """Teacher forcing over a pass: the tokens `ids` (1, T) put at slots pos ...
        pos + T - 1 and run as one pass (the weights read once); a copy of the logits
        after each, (1, T, vocab), what T `step_logits` calls give (exactly, in this
        package's kernels: each token's arithmetic is the step's). pos ends T slots on,
        the last token's choice written after it. Checked as `step_logits` is."""
        ids = torch.as_tensor(ids, device=self.device)
        ids = ids.view(1, -1) if ids.dim() < 2 else ids
        check_ids(self, ids, "ids")
        query = ids.shape[1]
        if ids.shape[0] != 1 or not 1 <= query <= self.max_query:
            raise ValueError(f"ids of shape {tuple(ids.shape)}: (1, T) with T in 1 ... "
                             f"{self.max_query} (TritonDecoder(..., max_query=...))")
        at = check_step(self, writes=query)
        self.tokens[:, at: at + query].copy_(ids)
        self.pos.fill_(at + query - 1)
        self.compile()
        self.device_pass(query)
        self.host_pos = at + query
        return self.all_logits[:query].clone()[None]

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int,
                 graph: bool | None = None) -> torch.Tensor:
        """`new_tokens` greedy tokens after the prompt: int64 CPU (1, new_tokens)."""
        check_prompt(self, prompt_ids, new_tokens)  # refused before the state changes
        self.seen.check()
        if new_tokens == 0:  # nothing to decode: the state stays as it was
            return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
        self.host_pos = None  # pos is about to leave the last prompt's count
        self.pos.zero_()  # a first capture finds room; the prefill replaces the state
        return generate(self, prompt_ids, new_tokens, self.step_function(graph))
