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

import time
from dataclasses import dataclass
from typing import Callable

import torch

from gpuinfer.decode.interface import check_prompt, check_step, graphed_step
from gpuinfer.decode.runners import BY_HAND, TREES, V4, Mode, compiled
from gpuinfer.decode.static import StaticDecoder
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

    def __init__(self, target: StaticDecoder, *, mode: Mode = V4):
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


class Speculative:
    """Greedy speculative decoding of `target` with `draft` (StaticDecoders of two models with
    one tokenizer, batch 1, the same capacity), `k` proposals a pass unless `generate` is
    given another. `mode` (a `runners.Mode`) says how the draft's steps and the verify pass
    run: compiled with its options or eager, and with `graph=BY_HAND` on a GPU each whole
    pass one CUDA graph per k. A decoder of the book's interface (`decode.interface`):
    its `decode_step` is one pass, and it shares the target's `tokens` and `pos`."""

    def __init__(self, target: StaticDecoder, draft: StaticDecoder, *, k: int = 4,
                 mode: Mode = V4):
        if mode.graph == TREES:
            raise ValueError(f"{mode.label}: a pass is captured by hand (graph={BY_HAND!r}) "
                             "or not at all; cudagraph trees would capture its parts apart")
        share_sequence(draft, target)
        self.target, self.draft, self.k, self.mode = target, draft, k, mode
        self.tokens, self.pos, self.capacity = target.tokens, target.pos, target.capacity
        if draft.vocab != target.vocab:  # each reads the other's tokens
            raise ValueError(f"a draft of vocabulary {draft.vocab} for a target of "
                             f"{target.vocab}: the two models must share one tokenizer")
        self.vocab = target.vocab
        self.refresh = torch.tensor(REFRESH, device=target.pos.device)
        self.verifier = Verifier(target, mode=mode)
        self.first_step, self.step = self.draft_first_step, draft.device_step
        if mode.compiled:
            self.first_step, self.step = (compiled(fn, mode) for fn in (self.first_step,
                                                                         self.step))
        self._passes: dict[int, Callable[[], object]] = {}
        self.passes = 0  # of the last generation

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
        """A whole pass with k proposals: built once per k, a CUDA graph replay on a GPU
        when the mode captures by hand."""
        if k not in self._passes:
            if not 1 <= k < MAX_QUERY:
                raise ValueError(f"k = {k} proposals: between 1 and {MAX_QUERY - 1}")
            draft, check = self.draft_fn(k), self.verifier.fn(k + 1)

            def run():
                draft()
                return check()

            if self.target.pos.is_cuda and self.mode.graph == BY_HAND:
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
        passes it took is left in `self.passes`."""
        started = self._start(prompt_ids, new_tokens, k)
        if started is None:
            return torch.empty((1, 0), dtype=torch.int64)
        run, k, start = started
        last, passes, pos = start + new_tokens - 1, 0, start
        while pos < last:
            run()
            pos = int(self.target.pos.item())  # the pass's one host read
            passes += 1
        self.passes, self.host_pos = passes, pos
        return self._tokens(start, new_tokens)

    @torch.no_grad()
    def timed_generate(self, prompt_ids: torch.Tensor, new_tokens: int,
                       k: int | None = None) -> tuple[torch.Tensor, "LoopTimes"]:
        """`generate`, its loop clocked pass by pass (CUDA events on a GPU, the host's
        clock on a CPU): what a pass costs inside the loop, and what the loop adds between
        passes. The same tokens as `generate`; the clocks cost a little host time."""
        started = self._start(prompt_ids, new_tokens, k)
        if started is None:
            return torch.empty((1, 0), dtype=torch.int64), LoopTimes((), ())
        run, k, start = started
        clock = _Clock(self.pos.is_cuda, 2 * new_tokens)  # made before the loop
        last, pos = start + new_tokens - 1, start
        while pos < last:
            clock.mark()  # the pass is queued here ...
            run()
            clock.mark()  # ... and ends here on the device
            pos = int(self.target.pos.item())
        self.passes, self.host_pos = len(clock.marks) // 2, pos
        return self._tokens(start, new_tokens), clock.loop_times()


@dataclass(frozen=True)
class LoopTimes:
    """A generation's loop, clocked: `pass_ms[i]`, pass i from its launch to its end on
    the device (a graph replay after an idle device: the launch is in it); `gap_ms[i]`,
    from the end of pass i to the launch of pass i + 1 (the host's read of the position,
    its loop and its launch). A generation of P passes has P and P - 1 of them."""

    pass_ms: tuple[float, ...]
    gap_ms: tuple[float, ...]

    @property
    def passes(self) -> int:
        return len(self.pass_ms)

    @property
    def loop_ms(self) -> float:
        """From the first pass's launch to the last pass's end."""
        return sum(self.pass_ms) + sum(self.gap_ms)


class _Clock:
    """Timestamps in the device's order: CUDA events (made up front, so that the loop
    only records them) on a GPU, the host's clock on a CPU."""

    def __init__(self, cuda: bool, most: int):
        self.cuda, self.marks = cuda, []
        self._events = ([torch.cuda.Event(enable_timing=True) for _ in range(most)]
                        if cuda else [])

    def mark(self) -> None:
        if self.cuda:
            event = self._events[len(self.marks)]
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def _ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def loop_times(self) -> LoopTimes:
        if self.cuda and self.marks:
            self.marks[-1].synchronize()
        m = self.marks
        return LoopTimes(tuple(self._ms(m[i], m[i + 1]) for i in range(0, len(m), 2)),
                         tuple(self._ms(m[i], m[i + 1]) for i in range(1, len(m) - 1, 2)))


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
