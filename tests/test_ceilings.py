"""The measured ceilings (copy bandwidth, matrix-product peak) run on the CPU: a smoke test of
the code path with the host clock. On the GPU the chapters check the numbers themselves."""

import pytest
import torch

from gpuinfer.measure import ceilings
from gpuinfer.measure.timing import HostClockWarning, Timing


def test_copy_bandwidth_on_the_cpu():
    with pytest.warns(HostClockWarning):
        bandwidth, timing = ceilings.copy_bandwidth(1 << 20, device="cpu", repeats=2)
    assert isinstance(timing, Timing) and timing.repeats == 2
    assert bandwidth == pytest.approx(2 * (1 << 20) / (timing.median / 1e3))
    with pytest.warns(HostClockWarning):
        same, _ = ceilings.copy_bandwidth(1 << 16, device="cpu", repeats=2, same_buffer=True)
    assert same > 0


def test_time_matmul_on_the_cpu_restores_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    with pytest.warns(HostClockWarning):
        timing = ceilings.time_matmul(4, 32, 16, dtype=torch.float32, device="cpu", tf32=True,
                                      repeats=2)
    assert isinstance(timing, Timing) and timing.repeats == 2 and timing.median > 0
    assert torch.backends.cuda.matmul.allow_tf32 == before
    with pytest.warns(HostClockWarning):
        assert ceilings.time_matmul(1, 16, 16, device="cpu", repeats=2, eager=True).median > 0


def test_matmul_peak_on_the_cpu():
    with pytest.warns(HostClockWarning):
        flops, timing = ceilings.matmul_peak(64, device="cpu", repeats=2)
    assert isinstance(timing, Timing)
    assert flops == pytest.approx(2 * 64**3 / (timing.median / 1e3))


@pytest.mark.gpu
def test_cache_inflates_a_small_copy():
    """A copy of a buffer that stays in the L2 "moves" more than the same copy from memory."""
    same, t_same = ceilings.copy_bandwidth(4 << 20, device="cuda", repeats=10, same_buffer=True)
    fresh, t_fresh = ceilings.copy_bandwidth(4 << 20, device="cuda", repeats=10)
    assert t_same.clock == t_fresh.clock == "cuda-graph"
    assert same > fresh


@pytest.mark.gpu
def test_large_copy_is_timed_call_by_call():
    bandwidth, timing = ceilings.copy_bandwidth(1 << 28, device="cuda", repeats=5)
    assert timing.clock == "cuda-event" and bandwidth > 1e11
