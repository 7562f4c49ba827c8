"""The tables of a trace (gpuinfer.report.trace_tables), on the hand-made trace of test_trace.py."""

from pathlib import Path

import pytest

from gpuinfer.measure.profiling import load_trace
from gpuinfer.report import trace_tables as TT

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"


@pytest.fixture
def trace():
    return load_trace(str(FIXTURE))


def test_top_ops_attribute_kernels_to_the_op_that_launched_them(trace):
    rows = {r.name: r for r in TT.top_ops(trace)}
    assert list(rows) == ["aten::linear", "aten::item", "aten::mul", "aten::argmax"]  # by CPU
    linear = rows["aten::linear"]
    assert (linear.calls, linear.cpu_us, linear.kernels, linear.gpu_us) == (1, 30, 1, 20)
    item = rows["aten::item"]
    assert (item.calls, item.cpu_us, item.kernels, item.gpu_us) == (0.5, 14, 0.5, 1)
    mul = rows["aten::mul"]
    assert (mul.calls, mul.cpu_us, mul.kernels, mul.gpu_us) == (1, 9, 1, 7.5)
    argmax = rows["aten::argmax"]
    assert (argmax.calls, argmax.cpu_us, argmax.kernels, argmax.gpu_us) == (0.5, 5, 0.5, 4)
    assert "aten::mm" not in rows  # nested in aten::linear
    table = TT.top_ops_markdown(TT.top_ops(trace, n=2))
    assert table.count("\n") == 3 and "`aten::linear`" in table


def test_kernel_table_groups_the_steps_kernels_by_name(trace):
    # In the steps: gemv 20 + 20, mul 10 + 5, argmax reduce 8 (the prefill's are left out).
    rows = TT.kernel_table(trace)
    assert [(r.name, r.calls, r.us) for r in rows] == [
        ("gemv2T_kernel", 1, 20), ("vectorized_elementwise_kernel", 1, 7.5),
        ("reduce_kernel", 0.5, 4)]
    assert (rows[0].kind, rows[0].origin) == ("matrix multiply", "library")
    assert (rows[1].kind, rows[1].origin) == ("elementwise", "ATen")
    by_kind = TT.time_by_kind(rows)
    assert by_kind["matrix multiply"] == 20 and sum(by_kind.values()) == 31.5
    assert TT.time_by_origin(rows) == {"Inductor": 0, "library": 20, "ours": 0, "ATen": 11.5}
    table = TT.kernel_table_markdown(rows)
    assert "| `gemv2T_kernel` | matrix multiply | library | 1 | 20.0 | 63 % |" in table
    assert "2 other kernels" in TT.kernel_table_markdown(rows, n=1)


def test_long_kernel_names_are_cut_to_fit():
    row = TT.KernelRow("x" * 100, "other", "ATen", 1, 1.0)
    line = TT.kernel_table_markdown([row]).splitlines()[-1]
    assert f"`{'x' * (TT.NAME_CHARS - 1)}…`" in line


def _pdl_trace():
    """One decode step of three kernels: the second starts early, under the first (PDL),
    then a gap, then the third; their durations sum to more than the step."""
    def x(cat, name, ts, dur, corr=None, pid=100, tid=100):
        e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid,
             "tid": tid}
        if corr is not None:
            e["args"] = {"correlation": corr}
        return e
    events = [x("user_annotation", "decode_step", 0, 50)]
    kernels = [("gemv_kernel", 100, 40), ("attention_partial_kernel", 130, 30),
               ("gemv_kernel", 170, 20)]
    for i, (name, ts, dur) in enumerate(kernels, 1):
        events.append(x("cuda_runtime", "cudaLaunchKernel", 5 * i, 2, i))
        events.append(x("kernel", name, ts, dur, i, pid=0, tid=7))
    return {"traceEvents": events}


def test_the_timeline_counts_each_microsecond_once():
    t = TT.step_timeline(_pdl_trace())
    # gemv 100-140 (owns it all), attention 130-160 (owns 140-160), idle 160-170, gemv
    assert t.span_us == 90 and t.idle_us == 10 and t.overlap_us == 10
    assert t.by_kind["matrix multiply"] == 60 and t.by_kind["attention"] == 20
    assert sum(t.by_kind.values()) + t.idle_us == t.span_us
    assert t.share("attention") == pytest.approx(20 / 90)
    rows = TT.kernel_table(_pdl_trace())
    assert sum(r.us for r in rows) == 90  # the durations, 40 + 30 + 20, overlap
