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


def test_step_kernels_are_drawn_in_start_order(trace):
    """Where kernels overlap (an early start under PDL), the later one is drawn on top: the
    bars are one collection in the order the kernels started, whatever their kinds, so
    every build draws the same figure."""
    from matplotlib.colors import to_rgba

    from gpuinfer.report import trace as T
    from gpuinfer.report.kernel_names import kind_of

    fig = traceplot.plot_step_kernels({"a": trace}, step=2)
    work = T.step_kernels(trace, 2)
    [kernels, _idle] = fig.axes[0].collections
    assert [tuple(c) for c in kernels.get_facecolors()] == [
        to_rgba(traceplot.COLORS[kind_of(e.name)]) for e in work]
    assert len({kind_of(e.name) for e in work}) > 1  # more than one kind to order


def test_timeline_draws_every_lane(trace):
    fig = traceplot.plot_timeline(trace, steps=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(
        reversed(traceplot.LANES))
    with pytest.raises(ValueError, match="no_such"):
        traceplot.plot_timeline(trace, step_name="no_such")
