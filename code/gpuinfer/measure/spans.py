"""A generation's decode loops timed alone: a time per token with no prefill in it.

A generation queues its prompt's prefill, then runs its decode loop. `rounds.decode_rounds`
subtracts a one-token generation's time from a whole one's: each holds the host's time to
launch a prefill, which moves from call to call, so their difference holds that jitter
twice. `decode_span_rounds` times inside each call instead: a loop counts from its start
(its prefill queued before it) to after its last step, read off CUDA events, which cost
no sync (the host clock on a CPU):

- a loop of `steps.decode_steps` records a timestamp at each step boundary inside
  `steps.step_clock()`: the first at its start, the last after its last step;
- a loop whose steps are not a range (a speculative loop's passes) marks itself with
  `decode_span()`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Hashable

import torch

from gpuinfer.measure.rounds import Rounds, interleaved_rounds
from gpuinfer.measure.steps import durations_ms, step_clock, timestamp

_spans: list | None = None  # set inside span_clock(): (start, end) of each marked loop


@contextlib.contextmanager
def decode_span():
    """Mark the decode loop run inside, from its start to after its last step, for
    span_clock: two timestamps, only while a span_clock() records. A loop left early
    (an exception) records nothing."""
    spans = _spans
    start = timestamp() if spans is not None else None
    yield
    if spans is not None:
        spans.append((start, timestamp()))


@contextlib.contextmanager
def span_clock():
    """Record the (start, end) timestamps of every loop marked by `decode_span` inside,
    in the list it yields."""
    global _spans
    spans: list = []
    _spans = spans
    try:
        yield spans
    finally:
        _spans = None


def loop_times(name: Hashable, marks: list, spans: list, new_tokens: int) -> list[float]:
    """ms of each decode loop of one call: its marked spans if it marked any, else its
    `decode_steps` loops of new_tokens - 1 steps, new_tokens step marks each."""
    if spans:
        return durations_ms(spans)
    if not marks or len(marks) % new_tokens:
        raise ValueError(
            f"{name}: its generation marked {len(marks)} step boundaries, not loops of "
            f"{new_tokens - 1} decode steps ({new_tokens} each): run its loop in "
            "steps.decode_steps(range(1, new_tokens)) or inside spans.decode_span()")
    firsts = range(0, len(marks), new_tokens)
    return durations_ms((marks[i], marks[i + new_tokens - 1]) for i in firsts)


def decode_span_rounds(generates: dict[Hashable, Callable[[torch.Tensor, int], object]],
                       prompt_ids, new_tokens: int, *, rounds: int = 5,
                       warmup: int = 0) -> Rounds:
    """`decode_rounds`' time per token, each call's decode loops timed inside it: their
    ms, summed and divided by new_tokens - 1 (a call may generate for several prompts,
    as decode_rounds'), in interleaved rounds. A round's figure holds no time from
    another call, so the host's jitter in a prefill stays out."""
    if new_tokens < 2:
        raise ValueError(f"need at least 2 new tokens to have a decode step, got {new_tokens}")
    clocks: dict[Hashable, list] = {name: [] for name in generates}

    def clocked(name):
        with step_clock() as steps, span_clock() as spans:
            generates[name](prompt_ids, new_tokens)
        clocks[name].append((steps.marks, spans))  # read after the rounds: no sync here

    timed = interleaved_rounds({name: functools.partial(clocked, name) for name in generates},
                               rounds=rounds, warmup=warmup)
    per_token = {name: tuple(sum(loop_times(name, marks, spans, new_tokens))
                             / (new_tokens - 1) for marks, spans in kept[warmup:])
                 for name, kept in clocks.items()}
    return Rounds(per_token, timed.clock)
