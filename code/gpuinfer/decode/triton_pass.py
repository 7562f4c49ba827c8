"""Chapter 5's Triton decoder with its verify passes on the tensor cores (issue 57).

`TritonDecoder.device_pass` runs the step's kernels for a pass of T tokens: each
program multiplies its weight tile by the T tokens one after another
(`tile.rows_dots`), T cross-warp reductions a tile, so that a pass of 5 tokens of
Chapter 6's target cost 1.98 steps although it reads the weights once.
`MmaPassDecoder` keeps the step as it is (one token: the same kernels, the same
tiling) and runs a pass of 2 ... 16 tokens on `kernels.pass_mma`'s products instead,
which multiply the T tokens by each weight tile in one `tl.dot`:

- `qkv_rope_pass` (RMSNorm, q/k/v, rotary, the cache write of the T slots),
- attention: where the step reads the cache in one program a head, `pass_attention`
  (16 query rows a program, several tokens reading the cache once); else
  `decode_attention` as the step runs it, each token in programs of its own;
- `embed` as the step runs it (it already takes T rows),
- `gemv_pass` for the o-projection and the down-projection (with the residual),
- `gemv_silu_pass` (RMSNorm, gate/up, SiLU(gate) * up),
- `lm_head_argmax_pass` (each token's logits; the acceptance of `verify_step`, a
  program a token: the decoder's argmax workspace is a `PassArgmaxWorkspace`).

Everything else (prefill, `verify_step`, `pass_logits`, capture, `generate`, the
speculative pair of `decode.speculative`) is the parent's, which reaches the passes
only through `device_pass`.

The MMA sums in its own order: a pass's logits are not its steps' logits to the bit
(FP32: within about 1e-6 of the largest logit; BF16: within its rounding), so a
greedy token may flip between a pass and a step on a near-tie. Speculative decoding
then commits the target's tokens with high probability rather than by construction.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton

from gpuinfer.decode.interface import check_keys
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.attention import decode_attention
from gpuinfer.kernels.common import Workspace
from gpuinfer.kernels.embed_head import embed
from gpuinfer.kernels.pass_attention import pass_attention
from gpuinfer.kernels.pass_mma import (MAX_TOKENS, MmaConfig, gemv_pass, gemv_silu_pass,
                                       mma_configs)
from gpuinfer.kernels.pass_mma_heads import (PassArgmaxWorkspace, lm_head_argmax_pass,
                                             qkv_rope_pass)
from gpuinfer.kernels.tiling import GEMVS, PAIRED


class MmaPassDecoder(TritonDecoder):
    """A `TritonDecoder` whose passes of 2 ... `max_query` tokens (at most 16, the
    MMA's M side) run on the tensor cores; its one-token step is the parent's.

    Options as `TritonDecoder`'s (`configs`: the step's tiling), and `pass_tiling`,
    {name: MmaConfig} over `pass_mma.mma_configs` (the passes' tiling, by rule, for
    the model's shapes and the weights' type) for the GEMVS. The split-K workspace and
    the argmax workspace are sized for both tilings: a step and a pass share them, as
    the step's kernels share them with each other.
    """

    def __init__(self, model, batch: int = 1, capacity: int = 1024, *,
                 max_query: int = 1, pass_tiling: dict | None = None, **options):
        # Refused before the parent loads anything: its own limit is the rows
        # kernels' 17, one more than an MMA pass takes.
        if isinstance(max_query, int) and not isinstance(max_query, bool) and \
                max_query > MAX_TOKENS:
            raise ValueError(
                f"max_query={max_query}: a tensor-core pass takes at most {MAX_TOKENS} "
                f"tokens (k <= {MAX_TOKENS - 1} proposals); build MmaPassDecoder(..., "
                f"max_query={MAX_TOKENS}) or fewer, or a TritonDecoder for "
                f"{max_query} tokens a pass")
        check_keys("MmaPassDecoder(pass_tiling=...)", pass_tiling, GEMVS)
        for name, c in (pass_tiling or {}).items():
            if not isinstance(c, MmaConfig):  # a GemvConfig's block_k may be under 16
                raise ValueError(f"pass_tiling[{name!r}] = {c!r}: an MmaConfig "
                                 "(kernels.pass_mma)")
        super().__init__(model, batch, capacity, max_query=max_query, **options)
        shape = self._shape()
        weights = "int8" if self.quantized else \
            "fp32" if self.xs.dtype == torch.float32 else "bf16"
        tiling = {**mma_configs(shape, self.on_gpu, weights), **(pass_tiling or {})}
        ks = {"qkv": shape.hidden_size, "o": self.n_heads * self.head_dim,
              "gate_up": shape.hidden_size, "down": shape.intermediate_size,
              "lm_head": shape.hidden_size}
        self.pass_tiling = {name: self._fit(tiling[name], ks[name]) for name in GEMVS}
        if self.pass_tiling["lm_head"].split_k != 1:
            raise ValueError("the lm_head pass has no split-K")
        self._size_workspaces(shape, ks)
        # A cache that the step's attention reads in one program a head: a pass's
        # tokens share such programs, 16 query rows each (`kernels.pass_attention`).
        self.shared_attention = self.attention.get("n_split") == 1 and \
            self.attention.get("block_s", 0) >= capacity

    def _shape(self) -> SimpleNamespace:
        """The model's shapes as a LlamaConfig names them, read off the weights (the
        parent keeps no config; `model` may have been a checkpoint folder)."""
        return SimpleNamespace(
            hidden_size=self.xs.shape[1], intermediate_size=self.hs.shape[1],
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv,
            head_dim=self.head_dim, vocab_size=self.lm_head.shape[0])

    def _size_workspaces(self, shape, ks: dict) -> None:
        """Split-K partials and counters, and the argmax's block maxima, for the larger
        of the step's tiling (the parent's sizing, a row per padded token) and the
        passes' (an MMA block's partials: a row per token of next_pow2(max_query))."""
        pairs = (self.n_heads + 2 * self.n_kv) * self.head_dim // 2
        outs = {"qkv": pairs, "o": shape.hidden_size,
                "gate_up": shape.intermediate_size, "down": shape.hidden_size}
        rows = triton.next_power_of_2(self.max_query)
        partials, counters = self.workspace.partials.numel(), \
            self.workspace.counters.numel()
        for name, out in outs.items():
            c = self.pass_tiling[name]
            blocks, splits = c.grid(out, ks[name])
            per_out = 2 if name in PAIRED else 1
            if splits > 1:
                partials = max(partials, blocks * splits * c.block_n * per_out * rows)
            counters = max(counters, blocks)
        self.workspace = Workspace(self.device, partials, counters)
        vocab = self.lm_head.shape[0]
        blocks = max(triton.cdiv(vocab, c.block_n)
                     for c in (self.configs["lm_head"], self.pass_tiling["lm_head"]))
        self.argmax_workspace = PassArgmaxWorkspace(self.device, blocks,
                                                    rows=self.max_query)

    def device_pass(self, query: int = 1, accept: bool = False) -> None:
        """As `TritonDecoder.device_pass`; a pass of 2 ... max_query tokens on the
        tensor-core products, with the passes' tiling. Unchecked."""
        if query == 1 or not 1 <= query <= self.max_query:  # the step; or refused
            return super().device_pass(query, accept)
        pdl, ws, cfg, eps = self.pdl, self.workspace, self.pass_tiling, self.eps
        buffers = (self.xs, self.hs, self.qs, self.attns, self.all_logits)
        x, h, q, attn, logits = (b[:query] for b in buffers)
        row = self.tokens[0]
        embed(self.embed, row, self.pos, x, pdl=pdl)
        for i, w in enumerate(self.layers):
            qkv_rope_pass(w.qkv, x, q, self.k_cache[i], self.v_cache[i], self.cos,
                          self.sin, self.pos, n_heads=self.n_heads, norm=w.input_norm,
                          eps=eps, config=cfg["qkv"], pdl=pdl, workspace=ws)
            if self.shared_attention:
                pass_attention(q, self.k_cache[i], self.v_cache[i], self.pos, attn,
                               block_s=self.attention["block_s"],
                               num_warps=self.attention["num_warps"], pdl=pdl)
            else:
                decode_attention(q, self.k_cache[i], self.v_cache[i], self.pos, attn,
                                 inline_combine=self.inline_reduce, pdl=pdl,
                                 workspace=self.attn_workspace, **self.attention)
            gemv_pass(w.o, attn, x, residual=x, config=cfg["o"], pdl=pdl, workspace=ws)
            gemv_silu_pass(w.gate_up, x, h, norm=w.post_norm, eps=eps,
                           config=cfg["gate_up"], pdl=pdl, workspace=ws)
            gemv_pass(w.down, h, x, residual=x, config=cfg["down"], pdl=pdl,
                      workspace=ws)
        lm_head_argmax_pass(self.lm_head, x, logits, row, self.pos, norm=self.norm,
                            eps=eps, config=cfg["lm_head"], inline=self.inline_argmax,
                            accept=accept, pdl=pdl, workspace=self.argmax_workspace)

