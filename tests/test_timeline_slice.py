"""The events of a few decode steps kept for a timeline (gpuinfer.report.timeline_slice):
drawn as the whole trace draws them, and small enough to keep."""

import gzip
import json
from pathlib import Path

import pytest

from gpuinfer.measure.profiling import load_trace
from gpuinfer.publish.kept import decode, encode
from gpuinfer.measure import trace_events as E
from gpuinfer.report import trace as T
from gpuinfer.report import traceplot
from gpuinfer.report.timeline_slice import TimelineSlice

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"
RECORDED = Path(__file__).parents[1] / "book" / "_recorded" / "02_decode"


def traces():
    yield "fixture", load_trace(str(FIXTURE))
    for path in sorted(RECORDED.glob("trace_*.json.gz"))[:2]:  # real traces, if recorded
        yield path.name, load_trace(str(path))


def lanes(trace, steps):
    """What plot_timeline draws in each lane, in µs from its window's start."""
    ranges = E.step_events(trace)[:steps]
    t0 = ranges[0].ts
    ends = [e.end for e in E.events(trace, E.GPU_CATS) if e.ts < ranges[-1].end]
    t1 = max([ranges[-1].end] + ends)
    drawn = traceplot._lane_slices(trace, t0, t1, T.STEP)
    return {lane: [(e.name, e.cat, e.ts - t0, e.dur, e.tid, e.correlation) for e in events]
            for lane, events in drawn.items()}, t1 - t0


@pytest.mark.parametrize("steps", [1, 2])
def test_the_slice_draws_what_the_trace_draws(steps):
    for label, trace in traces():
        kept = TimelineSlice.of(trace, steps=steps)
        (whole, span), (sliced, sliced_span) = lanes(trace, steps), lanes(kept.trace(), steps)
        assert sliced_span == pytest.approx(span, abs=1e-2), label
        assert whole.keys() == sliced.keys()
        for lane in whole:
            assert len(sliced[lane]) == len(whole[lane]), (label, lane)
            for a, b in zip(whole[lane], sliced[lane]):
                assert a[0] == b[0] and a[1] == b[1] and a[4:] == b[4:], (label, lane)
                assert b[2:4] == pytest.approx(a[2:4], abs=1e-2), (label, lane)


def test_the_slice_is_kept_and_drawn():
    trace = load_trace(str(FIXTURE))
    kept = TimelineSlice.of(trace, steps=2)
    back = decode(json.loads(json.dumps(encode(kept, "the slice"))))
    assert back == kept
    fig = traceplot.plot_timeline(back.trace(), steps=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(
        reversed(traceplot.LANES))
    assert fig.axes[0].get_title() == traceplot.plot_timeline(trace).axes[0].get_title()
    with pytest.raises(ValueError, match="no_such"):
        TimelineSlice.of(trace, step_name="no_such")


def test_a_recorded_slice_is_a_tenth_of_its_trace():
    for path in sorted(RECORDED.glob("trace_*.json.gz"))[:1]:
        with gzip.open(path, "rt", encoding="utf8") as f:
            raw = f.read()
        kept = json.dumps(encode(TimelineSlice.of(json.loads(raw)), "the slice"))
        assert len(kept) < len(raw) / 10
