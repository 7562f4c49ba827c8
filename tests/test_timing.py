"""The timing harness: warm-up excluded, median of repeats, input rotation, CPU fallback."""

import warnings

import pytest
import torch

from gpuinfer.measure import timing
from gpuinfer.measure.steps import decode_steps
from gpuinfer.measure.timing import HostClockWarning, Timing, benchmark
from gpuinfer.measure.rounds import (Rounds, apart, at_fast_pace, decode_rounds,
                                     interleaved_rounds, paced_rounds, split_rounds,
                                     time_call)


def test_wall_seconds_returns_the_result_and_its_time():
    out, seconds = timing.wall_seconds(lambda: 3)
    assert out == 3 and seconds >= 0


def test_timing_statistics():
    t = Timing((5.0, 1.0, 3.0, 2.0, 4.0), "host")
    assert t.median == 3.0
    assert (t.min, t.max) == (1.0, 5.0)
    assert (t.q1, t.q3) == (2.0, 4.0)
    assert t.repeats == 5
    assert "3.000 ms median" in str(t) and "n=5" in str(t)
    assert "µs" in str(Timing((0.0123,), "cuda-event"))


def test_warmup_calls_are_not_timed(monkeypatch):
    # A fake clock that advances 100 ms per warm-up call and 1 ms per timed call: if warm-up
    # leaked into the timings, some would be 100 ms.
    calls = []
    now = [0.0]

    def fn():
        calls.append(1)
        now[0] += 0.100 if len(calls) <= 3 else 0.001

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    with pytest.warns(HostClockWarning):
        t = benchmark(fn, warmup=3, repeats=7)
    assert len(calls) == 10
    assert t.repeats == 7
    assert t.median == pytest.approx(1.0)
    assert t.max == pytest.approx(1.0)


def test_median_of_repeats(monkeypatch):
    durations = iter([0, 0, 0.005, 0.001, 0.009, 0.002, 0.003])  # warm-up 2, then 5 timed
    now = [0.0]

    def fn():
        now[0] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    with pytest.warns(HostClockWarning):
        t = benchmark(fn, warmup=2, repeats=5)
    assert t.median == pytest.approx(3.0)
    assert t.clock == "host"


def test_inputs_rotate_across_warmup_and_repeats():
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostClockWarning)
        benchmark(lambda a: seen.append(a), inputs=[(0,), (1,), (2,)], warmup=2, repeats=4)
    assert seen == [0, 1, 2, 0, 1, 2]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        benchmark(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="inputs is empty"):
        benchmark(lambda: None, inputs=[])


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU fallback")
def test_cpu_fallback_warns():
    with pytest.warns(HostClockWarning, match="host clock"):
        t = benchmark(lambda: torch.ones(10).sum(), warmup=1, repeats=3)
    assert t.clock == "host" and t.repeats == 3


def test_fresh_inputs_exceed_the_cache():
    made = []
    sets = timing.fresh_inputs(lambda: made.append(1) or (len(made),), 1 << 20,
                               min_total_bytes=10 << 20)
    assert len(sets) == 10 and sets[0] == (1,) and sets[-1] == (10,)
    assert len(timing.fresh_inputs(lambda: (0,), 1 << 30)) == 1   # one set already exceeds it
    assert len(timing.fresh_inputs(lambda: (0,), 1, max_sets=7)) == 7


@pytest.mark.gpu
def test_graph_benchmark_on_gpu():
    x = torch.randn(1 << 20, device="cuda")
    t = timing.benchmark_graph(lambda: x.mul_(1.0), calls=10, repeats=5)
    assert t.clock == "cuda-graph" and t.median > 0


def test_interleaved_rounds_rotate_the_order(monkeypatch):
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    with pytest.warns(HostClockWarning):
        rounds = interleaved_rounds(fns, rounds=3, warmup=1, per_call=2)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert rounds.names == ["a", "b", "c"] and rounds.rounds == 3
    assert rounds["a"].repeats == 3 and rounds["a"].clock == "host"
    with pytest.raises(ValueError, match="rounds >= 1"):
        interleaved_rounds(fns, rounds=0)


def test_interleaved_rounds_divide_by_the_work_per_call(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def takes(ms):
        def fn():
            now[0] += ms / 1e3
        return fn

    with pytest.warns(HostClockWarning):
        rounds = interleaved_rounds({"slow": takes(40), "fast": takes(10)}, rounds=2,
                                    warmup=0, per_call=10)
    assert rounds.times_ms["slow"] == pytest.approx((4.0, 4.0))
    assert rounds.times_ms["fast"] == pytest.approx((1.0, 1.0))


def test_paced_rounds_read_the_pace_before_each_call_untimed(monkeypatch):
    now, calls = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def takes(name, ms):
        def fn():
            calls.append(name)
            now[0] += ms / 1e3
        return fn

    def pace():  # slow to read, and its reading says which call comes next
        now[0] += 1.0
        calls.append("pace")
        return float(len(calls))

    with pytest.warns(HostClockWarning):
        timed, paces = paced_rounds({"a": takes("a", 4), "b": takes("b", 2)}, pace,
                                    rounds=2, warmup=1, per_call=2)
    assert calls == ["a", "b", "pace", "a", "pace", "b", "pace", "b", "pace", "a"]
    assert timed.times_ms["a"] == pytest.approx((2.0, 2.0))  # ms per unit of work
    assert timed.times_ms["b"] == pytest.approx((1.0, 1.0))
    assert paces.times_ms == {"a": (3.0, 9.0), "b": (5.0, 7.0)}
    with pytest.raises(ValueError, match="rounds >= 1"):
        paced_rounds({"a": takes("a", 1)}, pace, rounds=0)


def test_split_rounds_keep_the_pace_only_when_asked():
    def generation():  # a prefill, then 2 decode steps (new_tokens 3)
        for _ in decode_steps(range(2)):
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostClockWarning)
        plain = split_rounds({"g": generation}, 3, rounds=2)
        paced = split_rounds({"g": generation}, 3, rounds=2, pace=lambda: 7.0)
    assert plain.pace is None
    assert paced.pace.times_ms == {"g": (7.0, 7.0)}
    assert paced.typical.rounds == 2


def test_at_fast_pace_splits_the_readings_at_the_fastest_among_all():
    assert at_fast_pace([7.0, 7.9, 8.1, 10.3]) == [True, True, False, False]
    assert at_fast_pace([8.0, 10.0], among=[7.0, 8.0, 10.0]) == [True, False]
    assert at_fast_pace([8.0], among=[7.0], margin=0.1) == [False]
    assert at_fast_pace([]) == []


def test_separated_spreads_give_a_ratio():
    rounds = Rounds({"new": (1.0, 1.1, 1.05), "old": (4.0, 4.2, 3.9)}, "cuda-event")
    c = rounds.compare("new", "old")
    assert c.separated and c.faster and c.ratio == pytest.approx(4.0 / 1.05)
    assert (c.low, c.high) == (pytest.approx(3.9 / 1.05), pytest.approx(4.0))
    assert c.words == "3.81× faster"
    assert c.sentence() == "new is 3.81× faster than old (3.71–4× over 3 rounds)"
    slower = rounds.compare("old", "new")
    assert slower.words == "3.81× slower" and not slower.faster
    assert slower.range == "3.71–4× over 3 rounds"


def test_overlapping_spreads_are_the_same_within_noise():
    rounds = Rounds({"a": (1.0, 1.3, 1.05), "b": (1.2, 1.1, 1.25)}, "cuda-event")
    c = rounds.compare("a", "b")
    assert not c.separated and not c.faster
    assert c.words == "the same within this run's noise"
    assert c.sentence("A", "B").startswith("A and B take the same time within this run's noise")


def test_apart_takes_the_widest_range_the_two_spreads_allow():
    """Two sides timed in different rounds: each side's fastest round against the other's
    slowest."""
    ours, theirs = Timing((1.0, 1.2), "host"), Timing((3.0, 3.6), "host")
    c = apart("ours", ours, "theirs", theirs)
    assert c.ratio == pytest.approx(3.3 / 1.1)
    assert (c.low, c.high) == (pytest.approx(3.0 / 1.2), pytest.approx(3.6 / 1.0))
    assert c.faster and c.rounds == 2
    overlapping = apart("a", Timing((1.0, 2.0), "host"), "b", Timing((1.5,), "host"))
    assert not overlapping.separated and overlapping.rounds == 1

def test_decode_rounds_subtract_the_first_token(monkeypatch):
    # A fake generation of n tokens that takes 10 ms of prefill and 2 ms per further token.
    now = [0.0]
    monkeypatch.setattr("gpuinfer.measure.timing.time.perf_counter", lambda: now[0])

    def fake(prompt, n):
        now[0] += (10 + 2 * (n - 1)) / 1e3

    per_token, ttft = decode_rounds({"fake": fake}, None, 11, rounds=3)
    assert per_token["fake"].median == pytest.approx(2.0)
    assert ttft["fake"].median == pytest.approx(10.0)


def test_time_call_and_graphed_without_cuda():
    """Without CUDA: the host clock, and no graph (the call itself)."""
    if torch.cuda.is_available():
        pytest.skip("the CPU path")
    calls = []
    fn = timing.graphed(lambda: calls.append(1), keep=None)
    assert time_call(fn) >= 0 and calls == [1]


@pytest.mark.gpu
def test_graphed_replays_and_holds_what_it_reads():
    x = torch.zeros(4, device="cuda")
    replay = timing.graphed(lambda: x.add_(1), keep=x)
    x.zero_()  # the capture's warm-up ran it: count replays only
    replay()
    replay()
    torch.cuda.synchronize()
    assert replay.buffers is x and x.tolist() == [2.0] * 4
