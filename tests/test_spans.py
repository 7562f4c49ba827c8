"""A generation's decode loops timed alone: prefill jitter out, loops found or refused."""

import random

import pytest

from gpuinfer.measure import spans
from gpuinfer.measure.rounds import decode_rounds
from gpuinfer.measure.spans import decode_span, decode_span_rounds, span_clock
from gpuinfer.measure.steps import clock_running, decode_steps


@pytest.fixture
def clock(monkeypatch):
    """A host clock that moves only when told: [seconds]."""
    now = [0.0]
    monkeypatch.setattr("gpuinfer.measure.timing.time.perf_counter", lambda: now[0])
    return now


def test_decode_span_rounds_leave_the_prefills_jitter_out(clock):
    """Two prompts a call, each a prefill of 10-40 ms, then 2 ms a token: the subtraction
    of a one-token call spreads with the prefills, the decode loops' spans do not."""
    jitter = random.Random(0)

    def steps_loop(prompts, n):
        for _ in range(2):
            clock[0] += jitter.uniform(10, 40) / 1e3
            for _ in decode_steps(range(1, n)):
                clock[0] += 2 / 1e3

    def marked_loop(prompts, n):  # a loop of passes, not of steps: marked as a whole
        for _ in range(2):
            clock[0] += jitter.uniform(10, 40) / 1e3
            with decode_span():
                clock[0] += 2 * (n - 1) / 1e3

    per_token = decode_span_rounds({"steps": steps_loop, "marked": marked_loop}, None,
                                   11, rounds=4, warmup=1)
    assert per_token.rounds == 4
    for name in ("steps", "marked"):  # 2 prompts of 2 ms a token
        assert per_token.times_ms[name] == pytest.approx((4.0,) * 4)
    subtracted, _ = decode_rounds({"steps": steps_loop}, None, 11, rounds=4)
    assert max(subtracted.times_ms["steps"]) - min(subtracted.times_ms["steps"]) > 0.5
    assert not clock_running() and spans._spans is None


def test_a_generation_without_whole_loops_is_refused(clock):
    def unmarked(prompts, n):
        clock[0] += 1e-3

    def short(prompts, n):  # a loop of n - 2 steps: n - 1 marks
        for _ in decode_steps(range(2, n)):
            clock[0] += 1e-3

    for fn in (unmarked, short):
        with pytest.raises(ValueError, match=f"{fn.__name__}: its generation marked"):
            decode_span_rounds({fn.__name__: fn}, None, 11, rounds=1)
    with pytest.raises(ValueError, match="at least 2 new tokens"):
        decode_span_rounds({"short": short}, None, 1, rounds=1)
    assert not clock_running() and spans._spans is None


def test_a_span_records_only_inside_a_span_clock_and_only_when_its_loop_ends(clock):
    with decode_span():  # no clock: nothing recorded, nothing raised
        clock[0] += 1.0
    with span_clock() as marked:
        with decode_span():
            clock[0] += 0.5
        with pytest.raises(KeyError):
            with decode_span():  # a loop left by an exception: no span
                raise KeyError
    assert spans.durations_ms(marked) == pytest.approx([500.0])
    assert spans._spans is None
