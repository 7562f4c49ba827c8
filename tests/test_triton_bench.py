"""triton_bench on the CPU (the interpreter): each measurement runs and counts the bytes
as stored; what has no int8 path says so."""

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.experiments import triton_bench as tb  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig  # noqa: E402
from gpuinfer.model.llama import AS_STORED, INT8  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on the CPU the host clock times them, and says so: expected here
pytestmark = pytest.mark.filterwarnings("ignore::gpuinfer.measure.timing.HostClockWarning")
SMALL = GemvConfig(32, 64)


@pytest.mark.parametrize("weights", [AS_STORED, INT8], ids=["bf16", "int8"])
def test_gemv_bandwidth_runs(weights):
    bw = tb.gemv_bandwidth(64, 64, "ours", device=DEVICE, config=SMALL, weights=weights,
                           repeats=2)
    assert bw > 0


def test_library_without_an_int8_product_says_so():
    with pytest.raises(ValueError, match="no int8 x BF16 product"):
        tb.gemv_bandwidth(64, 64, "cuBLAS", device=DEVICE, weights=INT8,
                          repeats=2)


def test_gemv_variants_time_every_impl_over_the_same_matrices():
    fns, nbytes = tb.gemv_variants(64, 64, ("ours", "cuBLAS"), device=DEVICE,
                                   config=SMALL)
    assert set(fns) == {"ours", "cuBLAS"}
    calls = max(1 + 63, 8)  # 8 KB matrices: as many copies as max_sets allows
    assert nbytes == 64 * 64 * 2 * calls
    for fn in fns.values():
        fn()


def eager_compile(monkeypatch, compiled_shapes):
    """torch.compile without Inductor (no C++ compile on a CPU): each compilation records
    the shapes it specialised on, and runs its graph as traced."""
    def backend(gm, example_inputs):
        compiled_shapes.append([tuple(t.shape) for t in example_inputs
                                if isinstance(t, torch.Tensor)])
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(
        fn, backend=backend, dynamic=kw["dynamic"]))
    monkeypatch.setattr(tb, "_COMPILED", {})  # compiled anew, with this backend
    torch._dynamo.reset()


def test_inductor_compiles_each_matrix_shape_for_itself(monkeypatch):
    """No symbolic sizes: the second shape would otherwise recompile for any shape, and
    Inductor's column would time a generic kernel. Past torch's default recompile limit
    (8) it would fall back to eager; ten shapes stay compiled."""
    compiled_shapes = []
    eager_compile(monkeypatch, compiled_shapes)
    shapes = [(16 * (i + 1), 8 * (i % 3 + 1)) for i in range(10)]
    for n, k in shapes:
        x = torch.randn(k)
        product = tb._product("Inductor", x, n, SMALL, pdl=False)
        w = torch.randn(n, k)
        torch.testing.assert_close(product(w), x[None] @ w.T)
    torch._dynamo.reset()
    assert compiled_shapes == [[(1, k), (n, k)] for n, k in shapes]


def test_another_compilation_compiles_anew(monkeypatch):
    """Inductor's chain is timed over several compilations: compilation c > 0 compiles
    functions of its own (a new code object), compilation 0 reuses what it compiled."""
    compiled_shapes = []
    eager_compile(monkeypatch, compiled_shapes)
    x, w = torch.randn(1, 8), torch.randn(16, 8)
    for compilation in (0, 0, 1, 2, 2):
        torch.testing.assert_close(tb.inductor_linear(compilation)(x, w), x @ w.T)
    torch._dynamo.reset()
    assert len(compiled_shapes) == 3  # one compilation each for 0, 1 and 2


def tiny_bf16_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(device=DEVICE, dtype=torch.bfloat16)


def test_gemv_chain_runs_each_product_of_the_step_once_a_call(monkeypatch):
    from gpuinfer.decode.triton_step import TritonDecoder

    decoder = TritonDecoder(tiny_bf16_llama(), capacity=16)
    shapes = []
    real_gemv = tb.gemv

    def counting_gemv(w, x, out, **kw):
        shapes.append(tuple(w.shape))
        return real_gemv(w, x, out, **kw)

    monkeypatch.setattr(tb, "gemv", counting_gemv)
    chain = tb.gemv_chain(decoder, "ours")
    shapes.clear()  # a GPU captures the chain in a graph: its warm-up and capture call it
    chain()
    if DEVICE == "cpu":  # a graph replay calls no Python
        assert shapes == [(128, 64), (64, 64), (256, 64), (64, 128)] * 2 + [(256, 64)]
    tb.gemv_chain(decoder, "cuBLAS")()


def test_gemv_chain_of_int8_weights_has_no_library_variant():
    from gpuinfer.decode.triton_step import TritonDecoder

    decoder = TritonDecoder(tiny_bf16_llama(), capacity=16, weights=INT8)
    tb.gemv_chain(decoder, "ours")()
    with pytest.raises(ValueError, match="no int8 x BF16 product"):
        tb.gemv_chain(decoder, "cuBLAS")


@pytest.mark.parametrize("weights", [AS_STORED, INT8], ids=["bf16", "int8"])
def test_gemv_chain_by_inductor_computes_the_products(monkeypatch, weights):
    """Inductor's chain: every product of the step, int8 ones as gpt-fast's weight-only
    linear, each shape compiled once."""
    from gpuinfer.decode.triton_step import TritonDecoder

    compiled_shapes = []
    eager_compile(monkeypatch, compiled_shapes)
    decoder = TritonDecoder(tiny_bf16_llama(), capacity=16, weights=weights)
    seen = []
    real = tb.inductor_linear

    def checked_linear(compilation=0):
        linear = real(compilation)

        def check(x, w):
            y = linear(x, w)
            capturing = DEVICE == "cuda" and torch.cuda.is_current_stream_capturing()
            if not capturing:  # no host read inside a graph capture
                dense = w.dequantized(x.dtype) if weights is INT8 else w
                torch.testing.assert_close(y.float(), (x @ dense.T).float(), rtol=0.02,
                                           atol=0.02)
            seen.append(tuple(w.shape))
            return y
        return check

    monkeypatch.setattr(tb, "inductor_linear", checked_linear)
    chain = tb.gemv_chain(decoder, "Inductor")
    seen.clear()
    chain()
    torch._dynamo.reset()
    if DEVICE == "cpu":
        assert seen == [(128, 64), (64, 64), (256, 64), (64, 128)] * 2 + [(256, 64)]
    assert len(compiled_shapes) == 4  # one compilation per distinct shape


def test_inductor_products_compile_a_shape_once_for_every_measurement(monkeypatch):
    """The per-matrix products and the step's chain share Inductor's compilations: a
    shape compiled for one is not compiled again for the other."""
    from gpuinfer.decode.triton_step import TritonDecoder

    compiled_shapes = []
    eager_compile(monkeypatch, compiled_shapes)
    decoder = TritonDecoder(tiny_bf16_llama(), capacity=16)
    for n, k in tb.step_matrices(decoder).values():
        tb.gemv_variants(n, k, ("Inductor",), device=DEVICE)
    compiled = len(compiled_shapes)
    tb.gemv_chain(decoder, "Inductor")()
    torch._dynamo.reset()
    assert compiled == 4 and len(compiled_shapes) == 4  # no second compilation


def test_replays_from_start_every_call_at_its_slot():
    from gpuinfer.decode.triton_step import TritonDecoder

    decoder = TritonDecoder(tiny_bf16_llama(), capacity=16)
    steps = tb.replays_from(decoder, 5, 3)
    for _ in range(2):
        steps()
        assert int(decoder.pos) == 8  # three steps from slot 5, both times
    with pytest.raises(ValueError, match="pass the cache's 16 slots"):
        tb.replays_from(decoder, 10, 6)


def test_steps_trace_keeps_what_the_step_figure_draws():
    from gpuinfer.report.trace import step_kernels

    def event(name, cat, ts, dur, tid, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1,
                "tid": tid, "args": args}

    trace = {"traceEvents": [], "deviceProperties": [{"name": "a GPU"}]}
    for s in range(4):  # four steps, a graph launch each, two kernels each
        t = 100.0 * s
        trace["traceEvents"] += [
            event("decode_step", "user_annotation", t, 50, 1),
            event("cpu work", "cpu_op", t + 1, 5, 1),
            event("cudaGraphLaunch", "cuda_runtime", t + 2, 3, 1, correlation=s),
            event(f"k{s}a", "kernel", t + 10, 20, 7, correlation=s, grid=[1, 1, 1]),
            event(f"k{s}b", "kernel", t + 31, 20, 7, correlation=s, grid=[1, 1, 1])]
    small = tb.steps_trace(trace, steps=3)
    assert len(small["traceEvents"]) == 3 * 4  # no CPU ops, no fourth step
    for step in (1, 2, 3):
        assert step_kernels(small, step) == step_kernels(trace, step)
    assert all(set(e["args"]) <= {"correlation"} for e in small["traceEvents"])


def test_row_tiling_counts_the_paired_matrices_in_rows():
    from gpuinfer.kernels.tiling import PAIRED
    from gpuinfer.decode.triton_step import TritonDecoder

    decoder = TritonDecoder(tiny_bf16_llama(), capacity=16)
    for name, config in decoder.configs.items():
        tiling = tb.row_tiling(decoder.configs, name)
        assert tiling.block_n == config.block_n * (2 if name in PAIRED else 1)
        assert (tiling.block_k, tiling.split_k) == (config.block_k, config.split_k)
