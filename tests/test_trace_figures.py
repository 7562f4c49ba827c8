"""What a figure keeps of a trace (gpuinfer.report.trace_figures), on the hand-made trace of
test_trace.py (`fixtures/decode_trace.json`: a prefill 0..50, decode steps 100..200 and
200..280, a copy and a sync after 300)."""

from pathlib import Path

import pytest

from gpuinfer.measure.profiling import load_trace
from gpuinfer.measure import trace_events as E
from gpuinfer.report import trace as T
from gpuinfer.report.kernel_names import kind_of
from gpuinfer.report.trace_figures import NAME_CHARS, figure_trace, short_name

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"


@pytest.fixture
def trace():
    return load_trace(str(FIXTURE))


def test_the_first_steps_read_as_in_the_whole_trace(trace):
    whole = figure_trace(trace, 2)
    assert len(E.step_events(whole)) == 2
    for step in (1, 2):  # times relative to the first step's start (100 us)
        assert [(e.name, e.ts + 100, e.dur) for e in T.step_kernels(whole, step)] == \
            [(e.name, e.ts, e.dur) for e in T.step_kernels(trace, step)]
        assert T.handovers(T.step_kernels(whole, step)) == \
            T.handovers(T.step_kernels(trace, step))
    assert [e.name for e in E.top_level_ops(whole)] == \
        [e.name for e in E.top_level_ops(trace) if 100 <= e.ts < 280]
    # the prefill's add kernel (90..110) still runs in the window: kept; the work after
    # the steps is not
    gpu = [e.ts + 100 for e in E.events(whole, E.GPU_CATS)]
    assert 90 in gpu and max(gpu) < 300


def test_one_step_keeps_what_overlaps_it(trace):
    one = figure_trace(trace, 1)
    assert len(E.step_events(one)) == 1
    assert [e.name for e in T.step_kernels(one, 1)] == \
        [e.name for e in T.step_kernels(trace, 1)]
    with pytest.raises(ValueError, match="no_such_step"):
        figure_trace(trace, 1, step_name="no_such_step")


def test_kept_events_carry_only_what_is_read(trace):
    for raw in figure_trace(trace, 2)["traceEvents"]:
        assert set(raw) <= {"ph", "cat", "name", "ts", "dur", "tid", "args"}
        assert set(raw.get("args", {})) <= {"correlation"}


def test_long_names_are_cut_where_their_kind_stays():
    gemv = "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, " \
        "false, false, cublasGemvParamsEx<int, float const*, float const*, float*>>"
    assert len(short_name(gemv)) == NAME_CHARS
    assert kind_of(short_name(gemv)) == kind_of(gemv)
    assert short_name("aten::mm") == "aten::mm"
    # a name whose kind shows only past the cut is kept whole
    late = "void " + "x" * 80 + "_softmax_kernel"
    assert short_name(late) == late
