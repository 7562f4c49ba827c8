"""Speculative greedy decoding: a small draft proposes k tokens, and the target checks all
of them in one pass over k + 1 tokens. The proposals are accepted up to the first one the
target would not have chosen, and the target's own choice at that point is committed too, so
a pass commits between 1 and k + 1 tokens, and the output is the target's greedy output
(exactly, where the pass's arithmetic rounds as the one-token step's does).

Both models are decoders of one kind sharing one token buffer and one position
(`share_sequence`): two `TritonDecoder`s (Chapter 5's kernels; Chapter 6) or two
`StaticDecoder`s (Chapter 3's step, compiled by Inductor). A pass runs on the device
without a host value:

1. the draft takes k greedy steps from the committed position `pos`; its first step also
   recomputes the key and value of slot pos - 1 (`REFRESH`, `TritonDecoder.refresh_step`),
   which the draft had not computed if the pass before accepted all k proposals;
2. the target's verify pass (`verify`, `TritonDecoder.verify_step`) writes its choices
   after slots pos - k ... pos, counts the accepted proposals n, and moves `pos` to the
   first slot after them: a rejected proposal is *rolled back by position*. Its key and
   value stay in both caches, past `pos`, where the mask hides them until a later step
   overwrites them.

So one pass is a fixed sequence of kernels on fixed buffers for each k: one CUDA graph per
k. The host reads the position after each pass, to know when to stop, without stalling the
GPU: the pass's last kernel stores it into pinned host memory, and the next pass is queued
before the read whenever the passes in flight cannot reach the end (`PositionReads`).
"""

from __future__ import annotations

from typing import Callable

import torch

from gpuinfer.decode.interface import check_prompt, check_step, graphed_step
from gpuinfer.decode.position_reads import PositionReads  # also imported from here
from gpuinfer.decode.runners import BY_HAND, EAGER, TREES, Mode, compiled
from gpuinfer.decode.static import StaticDecoder
from gpuinfer.decode.triton_step import MAX_QUERY
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.measure.spans import decode_span
from gpuinfer.measure.timing import capture_graph

REFRESH = (-1, 0)  # the draft's first step of a pass: slots pos - 1 and pos
# Passes queued ahead of the host's reads. Two already keep one queued; four cost nothing
# more, and the probe that once found them 16 µs a pass faster read low (NOTES-57).
IN_FLIGHT = 4


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


def verify(target: StaticDecoder, offsets: torch.Tensor) -> torch.Tensor:
    """The target's pass over the last committed token and the k = len(offsets) - 1
    proposals after it (the draft has moved pos k slots past that token). Commits the
    accepted proposals and the target's choice after them; returns how many it accepted."""
    k = offsets.shape[0] - 1
    positions = target.pos - k + offsets  # the committed token's slot, then the proposals'
    ids = target.tokens.index_select(1, positions)
    choice = target.logits(ids, positions, every_position=True).argmax(-1)  # after each
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
    """The target's verify pass (`verify`), run the way `mode` says (compiled or not; a
    graph is the pass's business, `Speculative.one_pass`), compiled once for most numbers
    of query tokens, not once for each: the shapes that depend on it stay symbolic."""

    def __init__(self, target: StaticDecoder, *, mode: Mode = EAGER):
        self.target = target
        self.offsets = torch.arange(MAX_QUERY, device=target.pos.device)
        self.compiled = mode.compiled
        self._verify = verify if not self.compiled else compiled(verify, mode, dynamic=None)

    def fn(self, query: int) -> Callable[[], torch.Tensor]:
        """The pass over `query` tokens (k + 1), as a function of nothing."""
        if not 2 <= query <= MAX_QUERY:
            raise ValueError(f"a verify pass takes 2 ... {MAX_QUERY} tokens, got {query}")
        offsets = self.offsets[:query]
        if self.compiled:
            torch._dynamo.maybe_mark_dynamic(offsets, 0)  # one compilation for all
        return lambda: self._verify(self.target, offsets)


class KernelVerifier:
    """The verify pass of a `TritonDecoder` target (`TritonDecoder.verify_step`): the
    acceptance runs in its last kernel; compiled kernels, one set per number of tokens."""

    def __init__(self, target):
        self.target = target

    def fn(self, query: int) -> Callable[[], None]:
        """The pass over `query` tokens (k + 1), as a function of nothing."""
        most = self.target.max_query
        if not 2 <= query <= most:
            raise ValueError(f"k = {query - 1} proposals need a verify pass of {query} "
                             f"tokens: the target takes 2 ... {most}; build it with "
                             f"TritonDecoder(..., max_query={query}), or pass k <= "
                             f"{most - 1}")
        return lambda: self.target.verify_step(query)


def on_kernels(target, draft) -> bool:
    """Whether the pair runs on Chapter 5's kernels (two TritonDecoders) rather than on
    Inductor's (two StaticDecoders); refused if mixed."""
    kernels = [hasattr(d, "verify_step") for d in (target, draft)]
    if kernels[0] != kernels[1]:
        raise ValueError(f"a {type(target).__name__} target with a {type(draft).__name__} "
                         "draft: build both as TritonDecoders or both as StaticDecoders")
    if kernels[0] and draft.max_query < 2:
        raise ValueError("the draft's first step of a pass takes 2 tokens (slots pos - 1 "
                         "and pos): build it with TritonDecoder(..., max_query=2)")
    return kernels[0]


class Speculative:
    """Greedy speculative decoding of `target` with `draft` (two TritonDecoders, or two
    StaticDecoders, of two models with one tokenizer, batch 1, the same capacity), `k`
    proposals a pass unless `generate` is given another. Two TritonDecoders run their
    kernels, each whole pass one CUDA graph per k on a GPU. For StaticDecoders `mode` (a
    `runners.Mode`) says how the draft's steps and the verify pass run: compiled with its
    options or eager, and with `graph=BY_HAND` on a GPU each pass one CUDA graph per k. A
    decoder of the book's interface (`decode.interface`): its `decode_step` is one pass,
    and it shares the target's `tokens` and `pos`."""

    def __init__(self, target, draft, *, k: int = 4, mode: Mode = EAGER):
        if mode.graph == TREES:
            raise ValueError(f"{mode.name} ({mode.words}): a pass is captured by hand "
                             f"(graph={BY_HAND!r}) or not at all; cudagraph trees would "
                             "capture its parts apart")
        self.kernels = on_kernels(target, draft)
        if draft.vocab != target.vocab:  # each reads the other's tokens
            raise ValueError(f"a draft of vocabulary {draft.vocab} for a target of "
                             f"{target.vocab}: the two models must share one tokenizer")
        # the mode's compiler options are Inductor's: not used by a pair of kernels
        self.verifier = KernelVerifier(target) if self.kernels else Verifier(target,
                                                                             mode=mode)
        self.check_k(k)  # the pass of self.k, refused before the pair shares anything
        share_sequence(draft, target)
        self.target, self.draft, self.k, self.mode = target, draft, k, mode
        self.tokens, self.pos, self.capacity = target.tokens, target.pos, target.capacity
        self.vocab = target.vocab
        if self.kernels:
            self.first_step, self.step = draft.refresh_step, draft.device_step
        else:
            self.refresh = torch.tensor(REFRESH, device=target.pos.device)
            self.first_step, self.step = self.draft_first_step, draft.device_step
            if mode.compiled:
                self.first_step, self.step = (compiled(fn, mode)
                                              for fn in (self.first_step, self.step))
        self._passes: dict[int, Callable[[], object]] = {}
        self.passes = 0  # of the last generation
        # The position after each pass, stored by the pass (a graph holds the buffers'
        # addresses, so they are made once).
        self.reads = PositionReads(self.pos, most=IN_FLIGHT)

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

    def check_k(self, k) -> None:
        """Refuse k proposals a pass that the pair cannot run, before anything changes."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < MAX_QUERY:
            raise ValueError(f"k = {k!r} proposals: an int between 1 and {MAX_QUERY - 1}")
        self.verifier.fn(k + 1)  # refused if the target's passes are shorter

    def one_pass(self, k: int) -> Callable[[], object]:
        """A whole pass with k proposals, its last kernel the position's store into
        `self.reads` (`PositionReads.publish`): built once per k, a CUDA graph replay on a
        GPU when the mode captures by hand."""
        if k not in self._passes:
            self.check_k(k)
            draft, check = self.draft_fn(k), self.verifier.fn(k + 1)

            def run():
                draft()
                accepted = check()
                self.reads.publish()  # unread outside `generate`, which resets the reads
                return accepted

            if self.kernels:
                compile_ahead(run)  # all the pass's kernels at once, none run
            # Two TritonDecoders' kernels are launched from Python, a hundred a pass: on a
            # GPU their pass is always a graph (the mode is Inductor's, for StaticDecoders).
            if self.target.pos.is_cuda and (self.kernels or self.mode.graph == BY_HAND):
                # A pass reads slot pos - 1 and writes up to k + 1 slots past pos.
                run = graphed_step(self, run, warmup=2, span=k + 1, first_slot=1)
            self._passes[k] = run
        return self._passes[k]

    @property
    def host_pos(self) -> int | None:
        """The target's count of pos (`interface.check_step`): one sequence."""
        return self.target.host_pos

    @host_pos.setter
    def host_pos(self, value: int | None) -> None:
        self.target.host_pos = self.draft.host_pos = value

    def device_step(self) -> None:
        """One pass with `self.k` proposals, unchecked: commits 1 ... k + 1 tokens."""
        self.one_pass(self.k)()

    def decode_step(self) -> None:
        """`device_step` called from Python: refused if the pass could write past the
        capacity (k + 1 slots past pos); the position after it is then read (the pass's
        one host read, as in `generate`)."""
        check_step(self, writes=self.k + 1)
        self.device_step()
        self.host_pos = int(self.pos.item())

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Both models' prefill; the first token (and the logits returned) are the
        target's."""
        self.draft.prefill(prompt_ids)
        return self.target.prefill(prompt_ids)

    def step_logits(self, token: torch.Tensor) -> torch.Tensor:
        """The target's one-token step (teacher forcing): speculation commits the
        target's tokens, so its logits are the target's."""
        return self.target.step_logits(token)

    def _start(self, prompt_ids: torch.Tensor, new_tokens: int, k: int | None):
        """Checks, the pass of k captured, and the prefill: (the pass, k, first slot), or
        None for no new tokens. Refused before the state changes."""
        k = self.k if k is None else k
        self.check_k(k)
        check_prompt(self, prompt_ids, new_tokens, extra=k)  # a pass writes k + 1 past pos
        if new_tokens == 0:
            return None
        self.target.seen.check()  # refused before the state changes
        self.draft.seen.check()
        self.pos.fill_(1)  # a first capture finds room: the prefill replaces the state
        run = self.one_pass(k)
        self.prefill(prompt_ids)  # the first token is the target's
        return run, k, prompt_ids.shape[1]

    def _tokens(self, start: int, new_tokens: int) -> torch.Tensor:
        # A copy: on a CPU .cpu() would return the buffer the next generation overwrites.
        return self.target.tokens[:, start: start + new_tokens].to("cpu", copy=True)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int,
                 k: int | None = None) -> torch.Tensor:
        """`new_tokens` greedy tokens of the target after the prompt, `k` (default
        `self.k`) proposals a pass: (1, new_tokens), int64 on the CPU. The number of
        passes it took is left in `self.passes`.

        A pass commits 1 ... k + 1 tokens, so while the passes in flight cannot reach
        the last token, the next one is certainly needed: it is queued before the
        position after the oldest is read, and the GPU never waits for the host's read
        (`IN_FLIGHT` at most). Near the end the loop waits for each read, so that no
        pass runs past the generation."""
        started = self._start(prompt_ids, new_tokens, k)
        if started is None:
            return torch.empty((1, 0), dtype=torch.int64)
        run, k, start = started
        last, passes, known = start + new_tokens - 1, 0, start
        reads = self.reads
        reads.reset()  # forgets the passes that published since (warm-up, decode_step)
        with decode_span():  # for a clock that times the decode alone
            while known < last:
                while reads.in_flight < reads.most and \
                        known + reads.in_flight * (k + 1) < last:
                    run()
                    reads.queue()
                    passes += 1
                known = reads.oldest()
        self.passes, self.host_pos = passes, known
        return self._tokens(start, new_tokens)


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
