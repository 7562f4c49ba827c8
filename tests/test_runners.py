"""How a decode step is run (gpuinfer.decode.runners): the modes, their runners, generate, and the
single-step timing and profiling; on a GPU, graph replay and torch.compile give the same
tokens as the eager step."""

import copy
import dataclasses
import os

import pytest
import torch

from gpuinfer.decode import runners, static as sd
from gpuinfer.decode.loops import decode_naive
from gpuinfer.measure.profiling import load_trace
from gpuinfer.model.configs import build_model, model_config, random_prompt
from gpuinfer.report import labels
from gpuinfer.report.trace import step_stats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def workload():
    config = model_config("toy")
    model = build_model(config, seed=0, device=DEVICE)
    prompt = random_prompt(config, 32, device=DEVICE)
    return model, prompt, decode_naive(model, prompt, 20)


def test_the_modes_are_named_for_what_they_are():
    assert [m.name for m in runners.MODES] == ["eager", "eager_graph", "compiled",
                                               "compiled_graph", "compiled_trees",
                                               "compiled_graph_pdl"]
    assert runners.COMPILED_GRAPH_PDL == dataclasses.replace(
        runners.COMPILED_GRAPH, name="compiled_graph_pdl", pdl=True)
    assert not any(m.tune or m.dynamic for m in runners.MODES)
    assert runners.EAGER.words == "eager"
    assert runners.EAGER_GRAPH.words == "eager, CUDA graph by hand"
    assert runners.COMPILED_GRAPH_PDL.words == "compiled with PDL, CUDA graph by hand"
    assert runners.COMPILED_TREES.words == "compiled, cudagraph trees (reduce-overhead)"
    assert dataclasses.replace(runners.COMPILED_GRAPH_PDL, tune=True, dynamic=True).words == (
        "compiled with PDL, tuned, dynamic shapes, CUDA graph by hand")
    assert len({m.words for m in runners.MODES}) == len(runners.MODES)


def test_the_books_labels_for_the_modes_are_the_reports():
    shorts = [labels.short_label(m) for m in runners.MODES]
    assert shorts == ["V4", "V5", "V6", "V7", "V8", "V9"]
    assert labels.mode_label(runners.EAGER) == "V4: eager"
    assert labels.mode_label(runners.COMPILED_GRAPH_PDL) == (
        "V9: compiled with PDL, CUDA graph by hand")
    dynamic = dataclasses.replace(runners.COMPILED_GRAPH_PDL, dynamic=True)
    assert labels.mode_label(dynamic) == (
        "V9: compiled with PDL, dynamic shapes, CUDA graph by hand")
    assert labels.short_label(runners.Mode("mine")) == "mine"  # one the book does not number
    assert set(labels.MODE_SHORT) == {m.name for m in runners.MODES}


@pytest.mark.parametrize("options, needs", [({"pdl": True}, "pdl"), ({"tune": True}, "tune"),
                                            ({"dynamic": True}, "dynamic"),
                                            ({"graph": runners.TREES}, "cudagraph trees")])
def test_an_option_an_eager_step_cannot_honour_is_refused(options, needs):
    with pytest.raises(ValueError, match=f"{needs}.*needs compiled=True"):
        runners.Mode("X", **options)


def test_an_unknown_graph_is_refused():
    with pytest.raises(ValueError, match="graph='fast'"):
        runners.Mode("X", graph="fast")


def test_pdl_is_a_compile_option_and_a_mode(workload):
    assert runners.COMPILED_GRAPH_PDL.compile_options() == {"coordinate_descent_tuning": False,
                                            "triton.enable_pdl": True,
                                            "triton.cudagraphs": False}
    assert runners.COMPILED_GRAPH.compile_options()["triton.enable_pdl"] is False
    assert runners.COMPILED_TREES.compile_options()["triton.cudagraphs"] is True
    # Inductor must know every option (a typo would only fail at compile time, on the GPU).
    import torch._inductor.config as inductor_config
    for mode in runners.MODES:
        for k in mode.compile_options():
            section, _, name = k.rpartition(".")
            assert hasattr(getattr(inductor_config, section) if section else inductor_config,
                           name), k
    pdl = runners.DECODE_FN_BY_MODE["compiled_graph_pdl"]
    assert pdl.mode is runners.COMPILED_GRAPH_PDL
    assert pdl.__name__ == "decode_compiled_graph_pdl_matmul"
    assert runners.decode_fn(runners.EAGER, attention="sdpa").__name__ == "decode_eager_sdpa"


def test_runner_is_built_once_per_decoder_and_mode(workload):
    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    first = runners.runner(decoder, runners.EAGER)
    assert runners.runner(decoder, runners.EAGER) is first
    assert runners.runner(decoder, dataclasses.replace(runners.EAGER, name="again")) is first
    assert torch.equal(runners.generate(decoder, prompt, 20), reference)
    assert runners.generate(decoder, prompt, 0).shape == (1, 0)


def test_a_decoder_and_its_runners_die_with_their_last_reference(workload):
    """The runners a decoder built (bound methods, graphs) hold the decoder: the cache of
    them must not keep it, and its KV cache, alive once the caller lets go of it."""
    import gc
    import weakref

    model, prompt, _ = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    runners.generate(decoder, prompt, 2, runners.EAGER)
    gone = weakref.ref(decoder)
    del decoder
    gc.collect()
    assert gone() is None


def test_decoder_for_keeps_one_decoder_per_model_shape_and_dtype(workload):
    model, _, _ = workload
    decoder = runners.decoder_for(model, 1, 64)
    assert runners.decoder_for(model, 1, 64) is decoder
    assert runners.decoder_for(model, 2, 64) is not decoder
    rounded = copy.deepcopy(model)
    fp32 = runners.decoder_for(rounded, 1, 64)
    rounded.to(torch.bfloat16)  # in place, as the chapters do: the FP32 decoder is stale
    bf16 = runners.decoder_for(rounded, 1, 64)
    assert bf16 is not fp32 and bf16.cache.keys[0].dtype == torch.bfloat16


def test_step_timing_and_profile(workload, tmp_path):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    timing = runners.step_timing(decoder, prompt, runners.EAGER, warmup=1, repeats=3)
    assert timing.repeats == 3 and timing.median > 0
    with pytest.raises(ValueError, match="exceed the decoder.s capacity"):
        runners.step_timing(decoder, prompt, runners.EAGER, warmup=10, repeats=100)
    path = str(tmp_path / "steps.json.gz")
    trace = runners.profile_steps(decoder, prompt, runners.EAGER, path, steps=3, warmup=1)
    assert step_stats(load_trace(path)).steps == 3 == step_stats(trace).steps


def test_head_start_profile_on_the_cpu_is_a_plain_profile(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    stats = step_stats(runners.profile_steps(decoder, prompt, runners.EAGER, steps=2, warmup=0,
                                             head_start=True))
    assert stats.steps == 2
    if not torch.cuda.is_available():  # no GPU work in the trace: nothing was queued ahead
        assert stats.gpu_span_us == 0 and not stats.queued_ahead


def test_cold_compile_restores_the_caches():
    import torch._inductor.config as inductor_config

    before = inductor_config.force_disable_caches
    folders = {v: os.environ.get(v) for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with runners.cold_compile():
        assert inductor_config.force_disable_caches is True
        fresh = os.environ["TRITON_CACHE_DIR"]  # an empty folder of its own, Triton's too
        assert fresh != folders["TRITON_CACHE_DIR"] and not os.listdir(
            os.path.dirname(fresh))
    assert inductor_config.force_disable_caches == before
    assert {v: os.environ.get(v) for v in folders} == folders


@pytest.mark.gpu
def test_graph_replay_gives_the_eager_tokens(workload):
    model, prompt, reference = workload
    eager, graph = runners.decode_fn(runners.EAGER), runners.decode_fn(runners.EAGER_GRAPH)
    assert torch.equal(graph(model, prompt, 20), eager(model, prompt, 20))
    # prefill resets the cache in place; the same captured graph replays the same tokens
    other = random_prompt(model.config, 32, seed=7, device=DEVICE)
    assert torch.equal(graph(model, other, 20), eager(model, other, 20))
    assert torch.equal(graph(model, prompt, 20), reference)


@pytest.mark.gpu
def test_graphed_step_is_faster(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, 128)  # room for the timed steps
    eager = runners.step_timing(decoder, prompt, runners.EAGER, warmup=5, repeats=30)
    graph = runners.step_timing(decoder, prompt, runners.EAGER_GRAPH, warmup=5, repeats=30)
    assert graph.median < eager.median


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", [runners.COMPILED, runners.COMPILED_GRAPH,
                                  runners.COMPILED_TREES, runners.COMPILED_GRAPH_PDL,
                                  dataclasses.replace(runners.COMPILED_TREES, pdl=True)])
def test_compiled_steps_give_the_reference_tokens(workload, mode):
    model, prompt, reference = workload
    assert torch.equal(runners.decode_fn(mode)(model, prompt, 20), reference)
    # replay, no compile
    assert torch.equal(runners.decode_fn(mode)(model, prompt, 20), reference)


def test_a_dynamic_mode_compiles_once_for_every_batch():
    """Traced only (backend "eager" stands in for Inductor on the CPU): decoders of batch 2,
    4 and 8 share one compilation with symbolic shapes (batch 1 is specialised apart)."""
    from torch._dynamo.testing import CompileCounter

    model = build_model(model_config("reduced"), seed=0)
    counter = CompileCounter()
    step = torch.compile(lambda d: d.device_step(), backend=counter, dynamic=True,
                         fullgraph=True)
    with torch.no_grad():
        for batch in (1, 2, 4, 8):
            decoder = sd.StaticDecoder(model, batch, 64, attention="sdpa")
            decoder.prefill(random_prompt(model.config, 8, batch=batch))
            step(decoder)
    torch._dynamo.reset()
    assert counter.frame_count == 2


@pytest.mark.gpu
def test_dynamic_mode_gives_the_reference_tokens(workload):
    model, prompt, reference = workload
    dynamic = dataclasses.replace(runners.COMPILED_GRAPH_PDL, dynamic=True)
    for batch in (1, 2):
        decoder = sd.StaticDecoder(model, batch, 64)
        prompts = prompt.expand(batch, -1).contiguous()
        assert torch.equal(runners.generate(decoder, prompts, 20, dynamic),
                           reference.expand(batch, -1))


@pytest.mark.gpu
def test_head_start_queues_every_graphed_step(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, 128)
    stats = step_stats(runners.profile_steps(decoder, prompt, runners.EAGER_GRAPH, steps=10,
                                             head_start=True))
    assert stats.queued_ahead and stats.kernels > 0
    assert 0 < stats.gpu_span_busy_fraction <= 1


@pytest.mark.gpu
def test_compiled_teacher_forcing_matches_the_eager_step(workload):
    from gpuinfer.measure.quality import compare_logits, forced_decoder_logits

    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    eager = forced_decoder_logits(decoder, prompt, reference[:, :8])
    step_logits = runners.compiled_step_logits(decoder, runners.COMPILED_GRAPH_PDL)
    compiled = forced_decoder_logits(decoder, prompt, reference[:, :8],
                                     step_logits=step_logits)
    agreement = compare_logits(eager, compiled)
    assert agreement.top1 == 1.0 and agreement.rel < 1e-4


def test_a_runner_build_that_raises_leaves_both_positions_in_step(workload, monkeypatch):
    """runner_before_prefill resets the device's position; the host's count goes with it,
    so a build that raises (a failed capture, say) cannot leave them apart."""
    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    runners.generate(decoder, prompt, 5)
    assert decoder.host_pos == int(decoder.pos) > 0

    def failing(*args, **kwargs):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(runners, "runner", failing)
    with pytest.raises(RuntimeError, match="capture failed"):
        runners.runner_before_prefill(decoder, runners.EAGER)
    assert int(decoder.pos) == 0 and decoder.host_pos is None
    with pytest.raises(Exception, match="prefill"):  # no prompt: refused, not a wrong step
        decoder.decode_step()
