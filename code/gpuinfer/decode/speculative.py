"""Speculative greedy decoding: a small draft proposes k tokens, and the target checks all
of them in one pass that reads its weights once.

At batch 1 a decode step reads every weight to produce one token. A verify pass feeds the
target k + 1 tokens at once (the last committed token and the draft's k proposals) and
returns its greedy choice after each of them; reading the weights costs the same for 1 or
k + 1 tokens. The proposals are accepted up to the first one the target would not have
chosen, and the target's own choice at that point is committed too, so a pass commits
between 1 and k + 1 tokens, and the output is the target's greedy output (exactly, where the
pass's arithmetic rounds as the one-token step's does: in FP32 it did, see Chapter 6).

Both models are `StaticDecoder`s sharing one token buffer and one position (`share_sequence`).
A pass runs on the device without a host value:

1. the draft takes k greedy steps from the committed position `pos`; its first step also
   recomputes the key and value of slot pos - 1 (`REFRESH`), which the draft had not computed
   if the pass before accepted all k proposals;
2. the target's verify pass (`verify`) writes its choices after slots
   pos - k ... pos, counts the accepted proposals n, and moves `pos` to the first slot after
   them: a rejected proposal is *rolled back by position*. Its key and value stay in both
   caches, past `pos`, where the mask hides them until a later step overwrites them.

So one pass is a fixed sequence of kernels on fixed buffers for each k: one CUDA graph per
k. The one host read is the position after each pass, which says when to stop.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from gpuinfer.decode.static import (StaticDecoder, attention, fold_mask, rms_norm,
                                    rotate_half)
from gpuinfer.measure.timing import capture_graph

REFRESH = (-1, 0)  # the draft's first step of a pass: slots pos - 1 and pos
MAX_QUERY = 17  # the most tokens a verify pass takes: up to k = 16 proposals


def share_sequence(draft: StaticDecoder, target: StaticDecoder) -> None:
    """Make the draft read and write the target's token buffer and position: one sequence,
    two models. Only batch 1 (each sequence would accept a different number of tokens),
    equal capacities."""
    if target.batch != 1 or draft.batch != 1:
        raise ValueError(f"speculative decoding here is batch 1; got target batch "
                         f"{target.batch}, draft batch {draft.batch}")
    if draft.capacity != target.capacity:
        raise ValueError(f"draft capacity {draft.capacity} != target capacity "
                         f"{target.capacity}: build both decoders with the same capacity")
    draft.tokens, draft.pos = target.tokens, target.pos


def all_logits(decoder: StaticDecoder, input_ids: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
    """`decoder.logits` at every input position, not only the last: (batch, T, vocab).

    The same layers as `StaticDecoder.logits`, which keeps only the last position (what a
    decode step needs); a verify pass needs the target's choice after each of its tokens.
    """
    batch, length = input_ids.shape
    h, kv, d = decoder.n_heads, decoder.n_kv_heads, decoder.head_dim
    x = F.embedding(input_ids, decoder.embed)
    cos = decoder.cos.index_select(0, positions)[:, None, :]
    sin = decoder.sin.index_select(0, positions)[:, None, :]
    visible = decoder.slots[None, :] <= positions[:, None]  # each query sees its past
    mask = fold_mask(torch.where(visible, 0.0, float("-inf")).to(x.dtype), h // kv)
    for i, w in enumerate(decoder.layers):
        qkv = F.linear(rms_norm(x, w.input_norm, decoder.eps), w.qkv)
        qkv = qkv.view(batch, length, h + 2 * kv, d)
        qk = qkv[:, :, : h + kv]
        qk = qk * cos + rotate_half(qk) * sin
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv:]
        decoder.k_cache[i].index_copy_(2, positions, k.transpose(1, 2))
        decoder.v_cache[i].index_copy_(2, positions, v.transpose(1, 2))
        o = attention(q, decoder.k_cache[i], decoder.v_cache[i], mask, decoder.attention)
        x = x + F.linear(o, w.o)
        gate, up = F.linear(rms_norm(x, w.post_norm, decoder.eps), w.gate_up).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w.down)
    return F.linear(rms_norm(x, decoder.norm, decoder.eps), decoder.lm_head)


def verify(target: StaticDecoder, offsets: torch.Tensor) -> torch.Tensor:
    """The target's pass over the last committed token and the k = len(offsets) - 1
    proposals after it (the draft has moved pos k slots past that token). Commits the
    accepted proposals and the target's choice after them; returns how many it accepted."""
    k = offsets.shape[0] - 1
    positions = target.pos - k + offsets  # the committed token's slot, then the proposals'
    ids = target.tokens.index_select(1, positions)
    choice = all_logits(target, ids, positions).argmax(-1)  # after each input token
    # Proposal i + 1 against the choice after token i; the last choice has no proposal.
    # (Shifted with roll, not sliced: no shape of k elements, which would be 1 at k = 1
    # and make torch.compile compile that case apart.)
    agree = (ids.roll(-1, dims=1) == choice) & (offsets < k)
    accepted = agree.int().cumprod(dim=1).sum(dim=1)  # up to the first disagreement
    # The choices after the accepted proposals are those proposals; the one after the last
    # of them is the target's own next token; those past it lie beyond the new position.
    target.tokens.index_copy_(1, positions + 1, choice)
    target.pos.add_(accepted + 1 - k)
    return accepted


def expected_tokens(agreement: float, k: int) -> float:
    """Tokens a pass commits on average if each proposal agrees with the target with
    probability `agreement`, independently: 1 + a + a^2 + ... + a^k."""
    return sum(agreement**i for i in range(k + 1))


class Verifier:
    """The target's verify pass (`verify`), compiled with `compile_options` (None: eager)
    once for most numbers of query tokens, not once for each: the shapes that depend on it
    stay symbolic."""

    def __init__(self, target: StaticDecoder, *, compile_options: dict | None = None):
        self.target = target
        self.offsets = torch.arange(MAX_QUERY, device=target.pos.device)
        self.compiled = compile_options is not None
        self._verify = verify if not self.compiled else torch.compile(
            verify, fullgraph=True, dynamic=None, options=compile_options)

    def fn(self, query: int) -> Callable[[], torch.Tensor]:
        """The pass over `query` tokens (k + 1), as a function of nothing."""
        if not 2 <= query <= MAX_QUERY:
            raise ValueError(f"a verify pass takes 2 ... {MAX_QUERY} tokens, got {query}")
        offsets = self.offsets[:query]
        if self.compiled:
            torch._dynamo.maybe_mark_dynamic(offsets, 0)  # one compilation for all
        return lambda: self._verify(self.target, offsets)


class Speculative:
    """Greedy speculative decoding of `target` with `draft` (StaticDecoders of two models with
    one tokenizer, batch 1, the same capacity). `compile_options`: Inductor options to
    compile the draft's steps and the verify pass with (e.g. `runners.V9.compile_options()`),
    None to run them eagerly. On a GPU each pass is captured as one CUDA graph per k."""

    def __init__(self, target: StaticDecoder, draft: StaticDecoder, *,
                 compile_options: dict | None = None):
        share_sequence(draft, target)
        self.target, self.draft = target, draft
        dev = target.pos.device
        self.refresh = torch.tensor(REFRESH, device=dev)
        self.verifier = Verifier(target, compile_options=compile_options)
        self.first_step, self.step = self.draft_first_step, draft.decode_step
        if compile_options is not None:
            self.first_step, self.step = (
                torch.compile(fn, fullgraph=True, dynamic=False, options=compile_options)
                for fn in (self.first_step, self.step))
        self._passes: dict[int, Callable[[], object]] = {}

    def draft_first_step(self) -> None:
        """The draft's first step of a pass: slots pos - 1 and pos in, its proposal after pos
        written to slot pos + 1, pos advanced."""
        draft = self.draft
        positions = draft.pos + self.refresh
        logits = draft.logits(draft.tokens.index_select(1, positions), positions)
        draft.tokens.index_copy_(1, draft.pos + 1, logits.argmax(-1, keepdim=True))
        draft.pos.add_(1)

    def draft_fn(self, k: int) -> Callable[[], None]:
        """The draft's k steps of a pass, as a function of nothing."""
        def steps():
            self.first_step()
            for _ in range(k - 1):
                self.step()
        return steps

    def one_pass(self, k: int) -> Callable[[], object]:
        """A whole pass with k proposals: built once per k, a CUDA graph replay on a GPU."""
        if k not in self._passes:
            if not 1 <= k < MAX_QUERY:
                raise ValueError(f"k = {k} proposals: between 1 and {MAX_QUERY - 1}")
            draft, check = self.draft_fn(k), self.verifier.fn(k + 1)

            def run():
                draft()
                return check()

            if self.target.pos.is_cuda:
                with torch.no_grad():
                    # Capture runs the pass (warm-up, compilation): from slot 1, so that
                    # it stays inside the cache, whatever the last generation left.
                    self.target.pos.fill_(1)
                    run = capture_graph(run, warmup=2)[0].replay
            self._passes[k] = run
        return self._passes[k]

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int,
                 k: int) -> tuple[torch.Tensor, int]:
        """`new_tokens` greedy tokens of the target after the prompt, k proposals a pass:
        the tokens (1, new_tokens), int64 on the CPU, and the number of passes."""
        start = prompt_ids.shape[1]
        # A pass writes up to k + 1 slots past the position before it.
        if start + new_tokens + k > self.target.capacity:
            raise ValueError(f"a prompt of {start} + {new_tokens} tokens + k = {k} exceeds "
                             f"the capacity of {self.target.capacity} slots")
        run = self.one_pass(k)  # first: capture runs passes
        self.draft.prefill(prompt_ids)
        self.target.prefill(prompt_ids)  # the first token is the target's
        last, passes, pos = start + new_tokens - 1, 0, start
        while pos < last:
            run()
            pos = int(self.target.pos.item())  # the pass's one host read
            passes += 1
        return self.target.tokens[:, start: start + new_tokens].cpu(), passes


def repeatable(pos: torch.Tensor, start: int, fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` run from position `start` at every call, to time a part of a pass again and
    again: on a GPU, a CUDA graph of the reset (one small kernel, timed with it) and fn."""
    def run():
        pos.fill_(start)
        return fn()

    if not pos.is_cuda:
        return run
    with torch.no_grad():
        return capture_graph(run, warmup=1)[0].replay
