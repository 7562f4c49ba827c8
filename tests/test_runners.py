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
from gpuinfer.report.trace import step_stats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def workload():
    config = model_config("toy")
    model = build_model(config, seed=0, device=DEVICE)
    prompt = random_prompt(config, 32, device=DEVICE)
    return model, prompt, decode_naive(model, prompt, 20)


def test_the_books_modes():
    assert [m.name for m in runners.MODES] == ["V4", "V5", "V6", "V7", "V8", "V9"]
    assert runners.V9 == dataclasses.replace(runners.V7, name="V9", pdl=True)
    assert not any(m.tune or m.dynamic for m in runners.MODES)
    assert runners.V4.label == "V4: eager"
    assert runners.V5.label == "V5: eager, CUDA graph by hand"
    assert runners.V9.label == "V9: compiled with PDL, CUDA graph by hand"
    assert runners.V8.label == "V8: compiled, cudagraph trees (reduce-overhead)"
    assert dataclasses.replace(runners.V9, tune=True, dynamic=True).label == (
        "V9: compiled with PDL, tuned, dynamic shapes, CUDA graph by hand")
    assert len({m.label for m in runners.MODES}) == len(runners.MODES)


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
    assert runners.V9.compile_options() == {"coordinate_descent_tuning": False,
                                            "triton.enable_pdl": True,
                                            "triton.cudagraphs": False}
    assert runners.V7.compile_options()["triton.enable_pdl"] is False
    assert runners.V8.compile_options()["triton.cudagraphs"] is True
    # Inductor must know every option (a typo would only fail at compile time, on the GPU).
    import torch._inductor.config as inductor_config
    for mode in runners.MODES:
        for k in mode.compile_options():
            section, _, name = k.rpartition(".")
            assert hasattr(getattr(inductor_config, section) if section else inductor_config,
                           name), k
    v9 = runners.VARIANTS[runners.V9.label]
    assert v9.mode is runners.V9 and v9.__name__ == "decode_V9_matmul"
    assert runners.decode_fn(runners.V4, attention="sdpa").__name__ == "decode_V4_sdpa"


def test_runner_is_built_once_per_decoder_and_mode(workload):
    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    first = runners.runner(decoder, runners.V4)
    assert runners.runner(decoder, runners.V4) is first
    assert runners.runner(decoder, dataclasses.replace(runners.V4, name="again")) is first
    assert torch.equal(runners.generate(decoder, prompt, 20), reference)
    assert runners.generate(decoder, prompt, 0).shape == (1, 0)


def test_a_decoder_and_its_runners_die_with_their_last_reference(workload):
    """The runners a decoder built (bound methods, graphs) hold the decoder: the cache of
    them must not keep it, and its KV cache, alive once the caller lets go of it."""
    import gc
    import weakref

    model, prompt, _ = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    runners.generate(decoder, prompt, 2, runners.V4)
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
    timing = runners.step_timing(decoder, prompt, runners.V4, warmup=1, repeats=3)
    assert timing.repeats == 3 and timing.median > 0
    with pytest.raises(ValueError, match="exceed the decoder.s capacity"):
        runners.step_timing(decoder, prompt, runners.V4, warmup=10, repeats=100)
    path = str(tmp_path / "steps.json.gz")
    trace = runners.profile_steps(decoder, prompt, runners.V4, path, steps=3, warmup=1)
    assert step_stats(load_trace(path)).steps == 3 == step_stats(trace).steps


def test_head_start_profile_on_the_cpu_is_a_plain_profile(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    stats = step_stats(runners.profile_steps(decoder, prompt, runners.V4, steps=2, warmup=0,
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
    eager, graph = runners.decode_fn(runners.V4), runners.decode_fn(runners.V5)
    assert torch.equal(graph(model, prompt, 20), eager(model, prompt, 20))
    # prefill resets the cache in place; the same captured graph replays the same tokens
    other = random_prompt(model.config, 32, seed=7, device=DEVICE)
    assert torch.equal(graph(model, other, 20), eager(model, other, 20))
    assert torch.equal(graph(model, prompt, 20), reference)


@pytest.mark.gpu
def test_graphed_step_is_faster(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, 128)  # room for the timed steps
    eager = runners.step_timing(decoder, prompt, runners.V4, warmup=5, repeats=30)
    graph = runners.step_timing(decoder, prompt, runners.V5, warmup=5, repeats=30)
    assert graph.median < eager.median


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", [runners.V6, runners.V7, runners.V8, runners.V9,
                                  dataclasses.replace(runners.V8, pdl=True)])
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
    dynamic = dataclasses.replace(runners.V9, dynamic=True)
    for batch in (1, 2):
        decoder = sd.StaticDecoder(model, batch, 64)
        prompts = prompt.expand(batch, -1).contiguous()
        assert torch.equal(runners.generate(decoder, prompts, 20, dynamic),
                           reference.expand(batch, -1))


@pytest.mark.gpu
def test_head_start_queues_every_graphed_step(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, 128)
    stats = step_stats(runners.profile_steps(decoder, prompt, runners.V5, steps=10,
                                             head_start=True))
    assert stats.queued_ahead and stats.kernels > 0
    assert 0 < stats.gpu_span_busy_fraction <= 1


@pytest.mark.gpu
def test_compiled_teacher_forcing_matches_the_eager_step(workload):
    from gpuinfer.measure.quality import compare_logits, forced_decoder_logits

    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    eager = forced_decoder_logits(decoder, prompt, reference[:, :8])
    compiled = forced_decoder_logits(decoder, prompt, reference[:, :8],
                                     step_logits=runners.compiled_step_logits(decoder,
                                                                              runners.V9))
    agreement = compare_logits(eager, compiled)
    assert agreement.top1 == 1.0 and agreement.rel < 1e-4
