"""Comparing variants: interleaved rounds, and a verdict that respects their spread.

One call's time on a GPU moves with what ran before it (clocks, caches, the host's pace), so
variants are timed in interleaved rounds: each round calls every variant once, in an order
rotated by one from the round before, and a slow stretch hits every variant alike
(`interleaved_rounds`). A variant's rounds give its spread; two variants' verdict
(`Rounds.compare`, a `Comparison`) says "faster" only where their spreads do not overlap.
Two variants timed in different rounds (another process's, another chapter's) are compared
by `apart`, each side's fastest round paired with the other's slowest.
A generation may be timed whole and with one token (`decode_rounds`), or split at its
decode steps' marks into its prefill and its steps (`split_rounds`).
"""

from __future__ import annotations

import functools
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from gpuinfer.measure.steps import step_clock, timestamp
from gpuinfer.measure.timing import HostClockWarning, Timing


def time_call(fn: Callable[[], object]) -> float:
    """Milliseconds of one call of fn, its GPU work included (CUDA events, then a sync)."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@dataclass(frozen=True)
class Rounds:
    """Variants timed in interleaved rounds: each round ran every variant once, in an order
    rotated by one from the round before. `times_ms[name][r]` is the time of round r."""

    times_ms: dict[Hashable, tuple[float, ...]]  # a variant's name, or any key
    clock: str

    def __getitem__(self, name: Hashable) -> Timing:
        return Timing(self.times_ms[name], self.clock)

    @property
    def names(self) -> list[Hashable]:
        return list(self.times_ms)

    @property
    def rounds(self) -> int:
        return len(next(iter(self.times_ms.values())))

    def compare(self, a: Hashable, b: Hashable) -> Comparison:
        """How a's time compares with b's over the same rounds (see `Comparison`)."""
        ta, tb = self.times_ms[a], self.times_ms[b]
        per_round = [y / x for x, y in zip(ta, tb)]
        separated = max(ta) < min(tb) or max(tb) < min(ta)
        return Comparison(a, b, self[b].median / self[a].median, min(per_round),
                          max(per_round), separated, self.rounds)


def interleaved_rounds(fns: dict[Hashable, Callable[[], object]], *, rounds: int = 5,
                       warmup: int = 1, per_call: float = 1.0) -> Rounds:
    """Time every variant in `rounds` interleaved rounds: each round calls each fn once, in
    an order rotated by one each round, so that a slow stretch of the host (or a warm GPU)
    hits every variant alike. `warmup` untimed rounds come first. Each call is timed on its
    own, GPU work included; times are divided by `per_call` (e.g. tokens per generation, for
    milliseconds per token). Without CUDA the host clock times them (smoke mode)."""
    return _timed_rounds(fns, None, rounds, warmup, per_call)[0]


def paced_rounds(fns: dict[Hashable, Callable[[], object]], pace: Callable[[], float], *,
                 rounds: int = 5, warmup: int = 0, per_call: float = 1.0
                 ) -> tuple[Rounds, Rounds]:
    """`interleaved_rounds`, with the host's pace read before every timed call: `pace()`
    (e.g. a short launch probe) runs untimed right before each call, so that a host-bound
    time can be set beside the pace the host ran it at. Returns the calls' Rounds and the
    pace readings as Rounds of the same shape (in pace()'s unit). A host switches between
    paces for seconds at a time; a reading per call, rather than per round, follows it
    through rounds of long calls. (`interleaved_rounds` is this without the readings.)"""
    return _timed_rounds(fns, pace, rounds, warmup, per_call)


def _timed_rounds(fns: dict[Hashable, Callable[[], object]],
                  pace: Callable[[], float] | None, rounds: int, warmup: int,
                  per_call: float) -> tuple[Rounds, Rounds | None]:
    """The rounds of `interleaved_rounds` (pace None: no readings, None in their place)
    and of `paced_rounds`, one loop for both, so that they time alike."""
    if rounds < 1 or warmup < 0 or not fns:
        raise ValueError(f"need rounds >= 1, warmup >= 0 and variants, got {rounds=} "
                         f"{warmup=} and {len(fns)} variants")
    if not torch.cuda.is_available():  # stacklevel 3: the public function's caller
        warnings.warn("no CUDA device: timing with the host clock (smoke mode, not a "
                      "GPU measurement)", HostClockWarning, stacklevel=3)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[Hashable, list[float]] = {name: [] for name in names}
    paces: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if pace is not None:  # untimed, right before the call it is read for
                paces[name].append(pace())
            times[name].append(time_call(fns[name]) / per_call)
    clock = "cuda-event" if torch.cuda.is_available() else "host"
    timed = Rounds({name: tuple(t) for name, t in times.items()}, clock)
    if pace is None:
        return timed, None
    return timed, Rounds({name: tuple(t) for name, t in paces.items()}, "pace")


def at_fast_pace(readings, among=None, *, margin: float = 0.15) -> list[bool]:
    """Which pace readings (e.g. µs per launch; lower is faster) lie within `margin` of the
    fastest reading `among` all those taken (default: these): the host's fast pace. The
    others ran at a slower one."""
    readings = list(readings)
    fastest = min(readings if among is None else list(among), default=float("inf"))
    return [x <= (1 + margin) * fastest for x in readings]


def decode_rounds(generates: dict[Hashable, Callable[[torch.Tensor, int], object]],
                  prompt_ids: torch.Tensor, new_tokens: int, *, rounds: int = 5,
                  warmup: int = 0) -> tuple[Rounds, Rounds]:
    """Whole generations and one-token generations of every variant (each a function of
    the prompt and a number of new tokens), in the same interleaved rounds. Returns the
    decode time per token, (whole - one token) / (new_tokens - 1) round by round, and the
    time to first token (the prompt's prefill and the first token, host read included),
    both as Rounds of milliseconds: neither is ever divided by a time from another run."""
    calls = {(name, n): functools.partial(g, prompt_ids, n)
             for name, g in generates.items() for n in (new_tokens, 1)}
    timed = interleaved_rounds(calls, rounds=rounds, warmup=warmup)
    per_token = {name: tuple((whole - first) / (new_tokens - 1) for whole, first in
                             zip(timed.times_ms[(name, new_tokens)],
                                 timed.times_ms[(name, 1)]))
                 for name in generates}
    first = {name: timed.times_ms[(name, 1)] for name in generates}
    return Rounds(per_token, timed.clock), Rounds(first, timed.clock)


def _x(ratio: float) -> str:
    return f"{ratio:.3g}×"


@dataclass(frozen=True)
class Comparison:
    """Variant a against variant b, timed in the same rounds. `ratio` is b's median time
    over a's (above 1: a is faster); `low` and `high` are the lowest and highest per-round
    ratios. The two differ only where their spreads (fastest to slowest round) do not
    overlap: then `separated` is True."""

    a: Hashable
    b: Hashable
    ratio: float
    low: float
    high: float
    separated: bool
    rounds: int

    @property
    def faster(self) -> bool:
        return self.separated and self.ratio > 1

    @property
    def words(self) -> str:
        """"3.2× faster", "1.5× slower", or "the same within this run's noise"."""
        if not self.separated:
            return "the same within this run's noise"
        if self.ratio > 1:
            return f"{_x(self.ratio)} faster"
        return f"{_x(1 / self.ratio)} slower"

    @property
    def range(self) -> str:
        """The per-round ratios, the way `words` puts them: "3.1–3.4× over 5 rounds"."""
        lo, hi = (self.low, self.high) if self.ratio > 1 else (1 / self.high, 1 / self.low)
        return f"{lo:.3g}–{_x(hi)} over {self.rounds} rounds"

    def sentence(self, a: str | None = None, b: str | None = None) -> str:
        """The verdict as a sentence, naming the variants `a` and `b` (default: keys)."""
        a, b = a or self.a, b or self.b
        if not self.separated:
            return (f"{a} and {b} take the same time within this run's noise (their "
                    f"spreads over the {self.rounds} rounds overlap)")
        return f"{a} is {self.words} than {b} ({self.range})"


def apart(a: Hashable, ours: Timing, b: Hashable, theirs: Timing) -> Comparison:
    """`a` (timed as `ours`) against `b` (`theirs`), timed in other rounds (another
    process's, another chapter's): `ratio` is theirs' median over ours' (above 1: a is
    faster). Not timed in the same rounds, so the range is the widest the two spreads
    allow: theirs' fastest round over ours' slowest, to theirs' slowest over ours'
    fastest; `rounds` is the fewer of the two sides'."""
    separated = ours.max < theirs.min or theirs.max < ours.min
    return Comparison(a, b, theirs.median / ours.median, theirs.min / ours.max,
                      theirs.max / ours.min, separated, min(ours.repeats, theirs.repeats))


# --- a generation in two parts: the prefill, and the decode steps after it -----------------


@dataclass(frozen=True)
class SplitRounds:
    """Generations timed in interleaved rounds, each split at its step marks (`split_rounds`).
    Every entry is per variant, one value per round, in milliseconds."""

    whole: Rounds  # the whole call, prefill and final copy to the host included, per token
    prefill: Rounds  # the call's start to the start of its last new_tokens - 1 steps
    decode: Rounds  # those steps, per step: their mean (the prefill excluded)
    typical: Rounds  # those steps' median: the typical step, slow outliers left out
    steps_ms: dict[Hashable, tuple[tuple[float, ...], ...]]  # each round's step times
    pace: Rounds | None = None  # the host's pace read before each call (`paced_rounds`)


def split_rounds(fns: dict[Hashable, Callable[[], object]], new_tokens: int, *,
                 rounds: int = 5, warmup: int = 0,
                 pace: Callable[[], float] | None = None) -> SplitRounds:
    """Time each generation `fns[name]()` (of `new_tokens` tokens) in interleaved rounds,
    and split every call at the step clock's marks: a timestamp at the call's start, then
    one at every decode-step boundary (CUDA events, which cost no sync; the host clock on
    a CPU). The last new_tokens - 1 steps are the decode part; everything before them is
    the prefill and the first token (for V0, which has no prefill, its first step).
    With `pace`, the host's pace is read before every call (`paced_rounds`)."""
    if new_tokens < 2:
        raise ValueError(f"need at least 2 new tokens to have a decode step, got {new_tokens}")
    clocks: dict[Hashable, list] = {name: [] for name in fns}

    def clocked(name):
        with step_clock() as clock:
            clock.marks.append(timestamp())  # the call's start
            fns[name]()
        clocks[name].append(clock)

    calls = {name: functools.partial(clocked, name) for name in fns}
    paces = None
    if pace is None:
        whole = interleaved_rounds(calls, rounds=rounds, warmup=warmup, per_call=new_tokens)
    else:
        whole, paces = paced_rounds(calls, pace, rounds=rounds, warmup=warmup,
                                    per_call=new_tokens)
    n = new_tokens - 1  # decode steps
    prefill, decode, typical, steps_ms = {}, {}, {}, {}
    for name, kept in clocks.items():
        times = [clock.times_ms() for clock in kept[warmup:]]  # the warm-up rounds' first
        if any(len(t) < n + 1 for t in times):
            raise ValueError(f"{name}: fewer than {n} decode steps marked by decode_steps")
        prefill[name] = tuple(sum(t[:-n]) for t in times)
        decode[name] = tuple(sum(t[-n:]) / n for t in times)
        typical[name] = tuple(statistics.median(t[-n:]) for t in times)
        steps_ms[name] = tuple(tuple(t[1:]) for t in times)  # every marked step
    return SplitRounds(whole, Rounds(prefill, whole.clock), Rounds(decode, whole.clock),
                       Rounds(typical, whole.clock), steps_ms, paces)
