"""Reading a profiler trace (gpuinfer.report.trace) and naming its slices
(gpuinfer.report.kernel_names), on a hand-made Chrome trace.

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

import re
from pathlib import Path

import pytest

from gpuinfer.measure.profiling import load_trace
from gpuinfer.report import kernel_names as KN
from gpuinfer.measure import trace_events as E
from gpuinfer.report import trace as T

FIXTURE = Path(__file__).parent / "fixtures" / "decode_trace.json"


@pytest.fixture
def trace():
    return load_trace(str(FIXTURE))


def test_step_stats_match_the_hand_computed_values(trace):
    s = T.step_stats(trace)
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
    assert s.launches == s.kernels  # the kernels, where the trace has them
    assert s.gpu_span_us == pytest.approx(67.5)
    assert s.gpu_span_busy_fraction == pytest.approx(4 / 9)
    assert not s.queued_ahead


def test_gpu_span_of_steps_queued_ahead(trace):
    # Delay the GPU side of the steps by 1 ms, as a head start does: the span and its busy
    # fraction stay, and the host had queued every step before the GPU began.
    shifted = 0
    for e in trace["traceEvents"]:
        if e.get("cat") in E.GPU_CATS and 130 <= float(e["ts"]) < 300:
            e["ts"] = float(e["ts"]) + 1000
            shifted += 1
    assert shifted == 6
    s = T.step_stats(trace)
    assert s.queued_ahead
    assert s.gpu_span_us == pytest.approx(67.5)
    assert s.gpu_span_busy_fraction == pytest.approx(4 / 9)


def test_a_trace_without_steps_is_an_error(trace):
    with pytest.raises(ValueError, match="no_such_step"):
        T.step_stats(trace, step_name="no_such_step")


def test_step_kernels_in_start_order(trace):
    assert [e.name for e in T.step_kernels(trace, 1)] == [
        "gemv2T_kernel", "vectorized_elementwise_kernel<mul>", "Memcpy DtoH (Device -> Pageable)"]
    assert [e.name for e in T.step_kernels(trace, 2)] == [
        "gemv2T_kernel", "vectorized_elementwise_kernel<mul>", "reduce_kernel<argmax>"]
    with pytest.raises(ValueError):
        T.step_kernels(trace, 3)


def test_handovers_between_the_kernels_of_a_step(trace):
    # step 1: gemv 135..155, mul 150..160 (starts before the gemv ends), memcpy 180..182
    h = T.handovers(T.step_kernels(trace, 1))
    assert (h.kernels, h.overlapping, h.late) == (3, 1, 1)
    assert h.idle_us == pytest.approx(20) and h.span_us == pytest.approx(47)
    # the early start is the mul's, after the gemv: 1 of the gemv's 1 hand-over
    assert h.early_after == (("gemv2T_kernel", 1, 1),)
    # step 2: gemv 225..245, mul 250..255, reduce 262..270: every kernel starts late
    h = T.handovers(T.step_kernels(trace, 2))
    assert (h.overlapping, h.late, h.idle_us) == (0, 2, pytest.approx(12))
    assert h.early_after == ()
    assert T.between_steps(trace, 1) == pytest.approx(225 - 182)


def test_handovers_count_each_early_start_once():
    """Three kernels start early, after two kinds of kernel ahead: the step's count and
    the counts by kernel ahead are the same three starts, each counted once."""
    k = lambda name, ts, dur: E.Event(name, "kernel", ts, dur)  # noqa: E731
    work = [k("gemv_a", 0, 10), k("mul_b", 8, 4), k("gemv_a", 11, 10), k("mul_b", 20, 3),
            k("gemv_a", 25, 5)]
    h = T.handovers(work)
    assert (h.kernels, h.overlapping, h.late) == (5, 3, 1)
    assert h.overlapping == sum(early for _, early, _ in h.early_after)
    assert h.early_after == (("gemv_a", 2, 2), ("mul_b", 1, 2))


def test_gaps_and_union():
    assert E.gaps([(0, 2), (1, 3), (5, 6), (8, 9)]) == [(3, 5), (6, 8)]
    assert E.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert E.union_length([]) == 0 and E.gaps([]) == []


@pytest.mark.parametrize("raw, short, kind, origin", [
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::R<float>)",
     "at::native::reduce_kernel", "reduction", "ATen"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(cublasGemv<int>)",
     "internal::gemvx::kernel", "matrix multiply", "library"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>)",
     "fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention", "library"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT",
     "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "matrix multiply", "library"),
    ("triton_per_fused__softmax_add_bmm_exp_9", "triton_per_fused__softmax_add_bmm_exp_9",
     "matrix multiply", "Inductor"),
    ("triton_red_fused_mm_3", "triton_red_fused_mm_3", "matrix multiply", "Inductor"),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0", "elementwise", "Inductor"),
    ("triton_per_fused_mean_pow_1", "triton_per_fused_mean_pow_1", "reduction", "Inductor"),
])
def test_kernel_names_and_kinds(raw, short, kind, origin):
    assert KN.kernel_name(raw) == short
    assert KN.kind_of(raw) == kind
    assert KN.origin(raw) == origin


# What each of the book's Triton kernels computes: those the chapters launch keep the kinds
# the table they replaced gave them; the rest are those of modules no chapter uses yet.
@pytest.mark.parametrize("raw, kind", [
    ("gemv_kernel", "matrix multiply"), ("gemv_silu_kernel", "matrix multiply"),
    ("qkv_rope_kernel", "matrix multiply"), ("lm_head_argmax_kernel", "matrix multiply"),
    ("attention_partial_kernel", "attention"), ("attention_combine_kernel", "attention"),
    ("argmax_reduce_kernel", "reduction"), ("embed_kernel", "copy / index"),
    ("gemv_pass_kernel", "matrix multiply"), ("gemv_silu_pass_kernel", "matrix multiply"),
    ("qkv_rope_pass_kernel", "matrix multiply"), ("lm_head_pass_kernel", "matrix multiply"),
    ("gemv8_kernel", "matrix multiply"), ("gemv8_silu_kernel", "matrix multiply"),
    ("pass_attention_kernel", "attention"),
    ("accept_kernel", "reduction"), ("copy_position_kernel", "copy / index"),
])
def test_the_books_triton_kernels_are_ours_and_judged_by_what_they_compute(raw, kind):
    assert raw in KN.our_kernels()
    assert KN.kind_of(raw) == kind and KN.origin(raw) == "ours"
    assert KN.kind_of(raw + "(float*)") == kind  # a parameter list keeps it ours


def test_every_kernel_the_book_launches_is_ours_with_a_kind():
    """A Triton kernel's trace name is its function's: each `@triton.jit` (or Gluon's
    `@gluon.jit`) function named *_kernel in gpuinfer.kernels (the ones launched; the
    helpers they inline are not named so) is ours, and its name says what it computes.
    A new kernel that fails here wants its name part in kernel_names._OUR_RULES, not a
    table."""
    kernels = Path(KN.__file__).parents[1] / "kernels"  # gpuinfer/kernels
    jit_def = re.compile(r"@(?:triton|gluon)\.jit(?:\(.*?\))?\s+def (\w+)")  # not the ast
    jitted = {name for path in kernels.glob("*.py")
              for name in jit_def.findall(path.read_text(encoding="utf8"))}
    assert len(KN.our_kernels()) >= 15
    assert {name for name in jitted if name.endswith("_kernel")} == KN.our_kernels()
    for name in KN.our_kernels():
        assert KN.kind_of(name) != "other" and KN.origin(name) == "ours", name


@pytest.mark.parametrize("raw, kind, origin", [
    ("gemv2T_kernel", "matrix multiply", "library"),  # cuBLAS's, bare and *_kernel too
    ("void gemv_kernel<float, 128>(float const*, float*)", "matrix multiply", "library"),
    ("reduce_kernel", "reduction", "ATen"),  # a *_kernel none of ours is called
    ("triton_poi_fused_add_0", "elementwise", "Inductor"),
    ("triton_red_fused_argmax_embedding_1", "reduction", "Inductor"),
])
def test_only_the_books_own_kernel_names_are_ours(raw, kind, origin):
    """Libraries, ATen and Inductor name kernels `*_kernel` or `triton_*` too: those keep
    their own classification, even with a name part of one of ours."""
    assert KN.kind_of(raw) == kind and KN.origin(raw) == origin


@pytest.mark.parametrize("name, kind", [
    ("aten::linear", "matrix multiply"), ("aten::mm", "matrix multiply"),
    ("cudaStreamSynchronize", "host sync"), ("aten::item", "host sync"),
    ("cudaLaunchKernel", "kernel launch"), ("cudaGraphLaunch", "kernel launch"),
    ("aten::scaled_dot_product_attention", "attention"), ("aten::index_select", "copy / index"),
    ("aten::mul", "elementwise"), ("aten::argmax", "reduction"), ("aten::empty", "other"),
])
def test_cpu_slices_have_the_same_kinds(name, kind):
    assert KN.kind_of(name) == kind
