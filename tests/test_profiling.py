"""The trace analysis on a hand-made Chrome trace, and the profiler wrapper on the CPU.

`fixtures/decode_trace.json` holds a prefill and two decode steps (times in microseconds):

    prefill      0..50    a GEMM kernel (20..50) and an add kernel (90..110) that runs into step 1
    decode_step  100..200 aten::linear 110..140 -> gemv 135..155 (stream 7)
                          aten::mul    141..149 -> mul  150..160 (stream 8, overlaps the gemv)
                          aten::item   170..198 -> cudaMemcpyAsync, Memcpy DtoH 180..182,
                                                   cudaStreamSynchronize 177..197
    decode_step  200..280 aten::linear 205..235 -> gemv 225..245
                          aten::mul    240..250 -> mul  250..255
                          aten::argmax 255..265 -> reduce 262..270
    after        300..    a copy and a sync that belong to no step

Worked by hand:
- wall: 100 .. max(280, last GPU end 270) = 180 us, 90 us per step; CPU in steps 100 + 80.
- top-level ops in steps: 30 + 8 + 28 + 30 + 10 + 10 = 116 us (nested aten::mm not counted
  twice), so 58 us per step in ops and (180 - 116) / 2 = 32 us per step outside them.
- kernels 2 + 3 = 5 -> 2.5 per step; one memcpy -> 0.5; launches 2 + 3 -> 2.5; syncs 0.5;
  device-to-host copies 0.5; kernel time 20 + 10 + 20 + 5 + 8 = 63 -> 31.5 us per step.
- GPU busy in [100, 280]: 100..110 (the prefill's add) + 135..160 (gemv and mul overlap,
  counted once) + 2 + 20 + 5 + 8 = 70 us -> 35 us per step, fraction 70 / 180 = 7 / 18.
- GPU span of the steps' own work: 135 .. 270 = 135 us, 67.5 per step; busy in it 25 + 2 +
  20 + 5 + 8 = 60 us, fraction 4 / 9; not queued ahead (step 2 ends at 280, after 135).
"""

from pathlib import Path

import pytest
import torch

from gpuinfer import profiling as P
from gpuinfer.decode import decode_no_sync
from gpuinfer.llama import build_model, random_prompt, tiny_llama_config

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"


@pytest.fixture
def trace():
    return P.load_trace(str(FIXTURE))


def test_step_stats_match_the_hand_computed_values(trace):
    s = P.step_stats(trace)
    assert s.steps == 2
    assert s.wall_us == pytest.approx(90)
    assert s.cpu_us == pytest.approx(90)
    assert s.op_us == pytest.approx(58)
    assert s.python_us == pytest.approx(32)
    assert s.ops == pytest.approx(3)
    assert s.kernels == pytest.approx(2.5)
    assert s.gpu_copies == pytest.approx(0.5)
    assert s.launch_calls == pytest.approx(2.5)
    assert s.syncs == pytest.approx(0.5)
    assert s.dtoh_copies == pytest.approx(0.5)
    assert s.kernel_us == pytest.approx(31.5)
    assert s.busy_us == pytest.approx(35)
    assert s.gpu_busy_fraction == pytest.approx(7 / 18)
    assert s.cpu_us_per_kernel == pytest.approx(90 / 2.5)
    assert s.gpu_span_us == pytest.approx(67.5)
    assert s.gpu_span_busy_fraction == pytest.approx(4 / 9)
    assert not s.queued_ahead


def test_gpu_span_of_steps_queued_ahead(trace):
    # Delay the GPU side of the steps by 1 ms, as a head start does: the span and its busy
    # fraction stay, and the host had queued every step before the GPU began.
    shifted = 0
    for e in trace["traceEvents"]:
        if e.get("cat") in P.GPU_CATS and 130 <= float(e["ts"]) < 300:
            e["ts"] = float(e["ts"]) + 1000
            shifted += 1
    assert shifted == 6
    s = P.step_stats(trace)
    assert s.queued_ahead
    assert s.gpu_span_us == pytest.approx(67.5)
    assert s.gpu_span_busy_fraction == pytest.approx(4 / 9)


def test_step_kernels_and_their_plot(trace):
    from gpuinfer.traceplot import plot_step_kernels, step_kernels

    assert [e.name for e in step_kernels(trace, 1)] == [
        "gemv2T_kernel", "vectorized_elementwise_kernel<mul>", "Memcpy DtoH (Device -> Pageable)"]
    assert [e.name for e in step_kernels(trace, 2)] == [
        "gemv2T_kernel", "vectorized_elementwise_kernel<mul>", "reduce_kernel<argmax>"]
    with pytest.raises(ValueError):
        step_kernels(trace, 3)
    fig = plot_step_kernels({"a": trace, "b": trace}, step=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["b", "a"]


def test_top_ops_attribute_kernels_to_the_op_that_launched_them(trace):
    rows = {r.name: r for r in P.top_ops(trace)}
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
    table = P.top_ops_markdown(P.top_ops(trace, n=2))
    assert table.count("\n") == 3 and "`aten::linear`" in table


def test_trim_keeps_the_last_steps_and_their_gpu_work(trace, tmp_path):
    trimmed = P.trim_trace(trace, keep_steps=1)
    steps = P.step_events(trimmed)
    assert [(s.ts, s.end) for s in steps] == [(200, 280)]
    names = [e["name"] for e in trimmed["traceEvents"]]
    assert "prefill" not in names and "aten::item" not in names and "aten::copy_" not in names
    assert "PyTorch Profiler (0)" not in names  # outlives the window
    assert names.count("process_name") == 2  # metadata is kept
    s = P.step_stats(trimmed)
    assert (s.steps, s.wall_us, s.kernels, s.syncs) == (1, 80, 3, 0)
    assert s.gpu_busy_fraction == pytest.approx(33 / 80)
    path = str(tmp_path / "t.json.gz")
    P.save_trace(trimmed, path)
    assert P.load_trace(path) == trimmed


def test_a_trace_without_steps_is_an_error(trace):
    with pytest.raises(ValueError, match="no_such_step"):
        P.step_stats(trace, step_name="no_such_step")


def test_profile_decode_writes_a_loadable_trace_on_the_cpu(tmp_path):
    config = tiny_llama_config(vocab_size=256, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    model = build_model(config, seed=0)
    prompt = random_prompt(config, 8)
    path = str(tmp_path / "decode.json.gz")
    trace = P.profile_decode(decode_no_sync, model, prompt, 6, path, keep_steps=3)
    loaded = P.load_trace(path)
    assert loaded == trace
    s = P.step_stats(loaded)
    assert s.steps == 3
    assert s.cpu_us > 0 and s.op_us > 0
    if not torch.cuda.is_available():
        assert s.kernels == 0 and s.gpu_busy_fraction == 0
    assert any(r.name == "aten::linear" for r in P.top_ops(loaded, n=50))


def test_kernel_table_groups_the_steps_kernels_by_name(trace):
    # In the steps: gemv 20 + 20, mul 10 + 5, argmax reduce 8 (the prefill's are left out).
    rows = P.kernel_table(trace)
    assert [(r.name, r.calls, r.us) for r in rows] == [
        ("gemv2T_kernel", 1, 20), ("vectorized_elementwise_kernel", 1, 7.5),
        ("reduce_kernel", 0.5, 4)]
    assert rows[0].kind == "matmul (library)" and rows[1].kind == "other (ATen)"
    by_kind = P.time_by_kind(rows)
    assert by_kind["matmul (library)"] == 20 and sum(by_kind.values()) == 31.5
    assert "| `gemv2T_kernel` | matmul (library) | 1 | 20.0 | 63 % |" in P.kernel_table_markdown(rows)
    assert "2 other kernels" in P.kernel_table_markdown(rows, n=1)


@pytest.mark.parametrize("raw, short, kind", [
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::R<float>)",
     "at::native::reduce_kernel", "other (ATen)"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(cublasGemv<int>)",
     "internal::gemvx::kernel", "matmul (library)"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>)",
     "fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention (library)"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT",
     "matmul (library)"),
    ("triton_per_fused__softmax_add_bmm_exp_9", "triton_per_fused__softmax_add_bmm_exp_9",
     "generated by Inductor (Triton)"),
])
def test_kernel_names_and_kinds(raw, short, kind):
    assert P.kernel_name(raw) == short
    assert P.kernel_kind(raw) == kind
