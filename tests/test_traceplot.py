"""Timelines drawn from a trace (gpuinfer.report.traceplot), on the hand-made trace of
test_trace.py."""

from pathlib import Path

import pytest

from gpuinfer.measure.profiling import load_trace
from gpuinfer.report import traceplot

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"


@pytest.fixture
def trace():
    return load_trace(str(FIXTURE))


def test_step_kernels_plot_one_row_per_trace(trace):
    fig = traceplot.plot_step_kernels({"a": trace, "b": trace}, step=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["b", "a"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[-1] == "GPU idle" and "matrix multiply" in legend


def test_timeline_draws_every_lane(trace):
    fig = traceplot.plot_timeline(trace, steps=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(
        reversed(traceplot.LANES))
    with pytest.raises(ValueError, match="no_such"):
        traceplot.plot_timeline(trace, step_name="no_such")
