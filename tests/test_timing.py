"""The timing harness: warm-up excluded, median of repeats, input rotation, CPU fallback."""

import warnings

import pytest
import torch

from gpuinfer import timing
from gpuinfer.timing import HostClockWarning, Timing, benchmark


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


def test_profiled_kernel_times_cpu():
    x = torch.randn(1 << 16)
    times = timing.profiled_kernel_ms(lambda: x * 2.0, repeats=4, warmup=1)
    assert len(times) >= 4 and all(t > 0 for t in times)


@pytest.mark.gpu
def test_events_agree_with_profiler_on_gpu():
    x = torch.randn(1 << 28, device="cuda")
    event = benchmark(lambda: x * 2.0, repeats=20).median
    profiled = sorted(timing.profiled_kernel_ms(lambda: x * 2.0, repeats=20))
    assert abs(event - profiled[len(profiled) // 2]) / event < 0.05


@pytest.mark.gpu
def test_graph_benchmark_on_gpu():
    x = torch.randn(1 << 20, device="cuda")
    t = timing.benchmark_graph(lambda: x.mul_(1.0), calls=10, repeats=5)
    assert t.clock == "cuda-graph" and t.median > 0
