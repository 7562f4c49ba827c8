"""Recording traces (gpuinfer.measure.profiling): one profiler session for every caller, the trimmed
trace of a decode loop, and kernel durations, on the CPU (and on the GPU where marked)."""

from pathlib import Path

import pytest
import torch

from gpuinfer.decode.loops import decode_no_sync
from gpuinfer.measure import profiling as P
from gpuinfer.model.configs import build_model, model_config, random_prompt
from gpuinfer.measure.trace_events import step_events
from gpuinfer.report.trace import step_stats
from gpuinfer.report.trace_tables import top_ops

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"


@pytest.fixture
def trace():
    return P.load_trace(str(FIXTURE))


def test_trim_keeps_the_last_steps_and_their_gpu_work(trace, tmp_path):
    trimmed = P.trim_trace(trace, keep_steps=1)
    steps = step_events(trimmed)
    assert [(s.ts, s.end) for s in steps] == [(200, 280)]
    names = [e["name"] for e in trimmed["traceEvents"]]
    assert "prefill" not in names and "aten::item" not in names and "aten::copy_" not in names
    assert "PyTorch Profiler (0)" not in names  # outlives the window
    assert names.count("process_name") == 2  # metadata is kept
    s = step_stats(trimmed)
    assert (s.steps, s.wall_us, s.kernels, s.syncs) == (1, 80, 3, 0)
    assert s.gpu_busy_fraction == pytest.approx(33 / 80)
    path = str(tmp_path / "t.json.gz")
    P.save_trace(trimmed, path)
    assert P.load_trace(path) == trimmed


def test_profile_decode_writes_a_loadable_trace_on_the_cpu(tmp_path):
    config = model_config("toy", vocab_size=256, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    model = build_model(config, seed=0)
    prompt = random_prompt(config, 8)
    path = str(tmp_path / "decode.json.gz")
    trace = P.profile_decode(decode_no_sync, model, prompt, 6, path, keep_steps=3)
    loaded = P.load_trace(path)
    assert loaded == trace
    s = step_stats(loaded)
    assert s.steps == 3
    assert s.cpu_us > 0 and s.op_us > 0
    if not torch.cuda.is_available():
        assert s.kernels == 0 and s.gpu_busy_fraction == 0
        assert s.launches == s.ops > 0  # no kernels on a CPU: the ATen ops stand in
    assert any(r.name == "aten::linear" for r in top_ops(loaded, n=50))
    # without a path, the same kind of trace, and nothing written
    unsaved = P.profile_decode(decode_no_sync, model, prompt, 6, keep_steps=3)
    assert step_stats(unsaved).steps == 3
    assert list(tmp_path.iterdir()) == [tmp_path / "decode.json.gz"]


def test_session_marks_the_profiled_code():
    with P.session() as recorded:
        torch.ones(8).sum()
    names = {e["name"] for e in recorded.trace["traceEvents"]}
    assert P.BODY in names and "aten::sum" in names


def test_profiled_kernel_times_cpu():
    x = torch.randn(1 << 16)
    times = P.profiled_kernel_ms(lambda: x * 2.0, repeats=4, warmup=1)
    assert len(times) == 4 and all(t > 0 for t in times)


@pytest.mark.gpu
def test_events_agree_with_profiler_on_gpu():
    from gpuinfer.measure.timing import benchmark

    x = torch.randn(1 << 28, device="cuda")
    event = benchmark(lambda: x * 2.0, repeats=20).median
    profiled = sorted(P.profiled_kernel_ms(lambda: x * 2.0, repeats=20))
    assert len(profiled) == 20  # only the code's kernels, not the session's own
    assert abs(event - profiled[len(profiled) // 2]) / event < 0.05


def test_call_anatomy_needs_a_gpu():
    assert P.call_anatomy(lambda: torch.ones(2) * 2) is None


@pytest.mark.gpu
def test_call_anatomy_accounts_for_an_eager_call():
    """Each call's events enclose its kernel, and follow the previous call's kernel: the
    call's event time lies between its kernel's and its kernel plus the gap before it."""
    a = torch.randn(4, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    an = P.call_anatomy(lambda: a @ w, calls=30)
    assert an.calls == 29 and an.kernel_us > 0 and an.gap_us >= 0 and an.host_us > 0
    assert 0.98 * an.kernel_us <= an.event_us <= an.kernel_us + an.gap_us + 3
    with pytest.raises(RuntimeError, match="fn must record no CUDA event"):
        P.call_anatomy(lambda: torch.cuda.Event().record(), calls=4)
