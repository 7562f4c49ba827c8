"""The static-cache decode step of Chapter 3: the same tokens as Chapter 2's loops, fixed
addresses, no graph breaks; on a GPU, graph replay and torch.compile give the same tokens."""

import pytest
import torch
import torch.nn.functional as F

from gpuinfer import static_decode as sd
from gpuinfer.decode import decode_kv_cache, decode_naive
from gpuinfer.llama import build_model, random_prompt, tiny_llama_config

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def small_config(**overrides):
    params = dict(vocab_size=2048, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4)
    params.update(overrides)
    return tiny_llama_config(**params)


@pytest.fixture(scope="module")
def workload():
    config = small_config()
    model = build_model(config, seed=0, device=DEVICE)
    prompt = random_prompt(config, 32, device=DEVICE)
    return model, prompt, decode_naive(model, prompt, 20)


def test_static_cache_gives_the_dynamic_cache_tokens(workload):
    model, prompt, reference = workload
    tokens = sd.decode_static(model, prompt, 20)
    assert tokens.dtype == torch.int64 and tokens.device.type == "cpu"
    assert tokens.shape == (1, 20)
    assert torch.equal(tokens, decode_kv_cache(model, prompt, 20))
    assert torch.equal(tokens, reference)


@pytest.mark.parametrize("kernel", sd.ATTENTION)
def test_attention_equals_repeat_interleave_sdpa(kernel):
    torch.manual_seed(0)
    batch, length, heads, kv_heads, d, slots = 2, 3, 8, 2, 16, 10
    q = torch.randn(batch, length, heads, d)
    keys, values = torch.randn(2, batch, kv_heads, slots, d)
    positions = torch.tensor([5, 6, 7])
    mask = torch.where(torch.arange(slots)[None] <= positions[:, None], 0.0, float("-inf"))
    ours = sd.attention(q, keys, values, sd.fold_mask(mask, heads // kv_heads), kernel)
    group = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1),
        attn_mask=mask).transpose(1, 2).reshape(batch, length, heads * d)
    torch.testing.assert_close(ours, expected)


def test_unknown_attention_kernel_is_named():
    with pytest.raises(ValueError, match="flash.*matmul"):
        sd.attention(*torch.randn(3, 1, 1, 2, 4), torch.zeros(1, 1), "flash")


@pytest.mark.parametrize("kernel", sd.ATTENTION)
def test_grouped_query_attention_and_batch(kernel):
    config = small_config(num_key_value_heads=2)
    model = build_model(config, seed=3, device=DEVICE)
    prompt = random_prompt(config, 7, batch=3, device=DEVICE)
    decode = sd.decode_with("eager", attention=kernel)
    assert torch.equal(decode(model, prompt, 12), decode_naive(model, prompt, 12))
    decoder = sd.static_decoder(model, 3, sd.capacity_for(7, 12), attention=kernel)
    assert decoder.attention == kernel
    assert decoder is not sd.static_decoder(model, 3, sd.capacity_for(7, 12), tune=False)


def test_prefill_resets_and_nothing_moves(workload):
    model, prompt, reference = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    addresses = [t.data_ptr() for t in decoder.tensors()]
    first = sd.decode_static(model, prompt, 20)
    other = random_prompt(model.config, 32, seed=7, device=DEVICE)
    sd.decode_static(model, other, 20)  # overwrites the cache with another sequence
    assert torch.equal(sd.decode_static(model, prompt, 20), first)
    assert addresses == [t.data_ptr() for t in decoder.tensors()]
    assert sd.static_decoder(model, 1, sd.capacity_for(32, 20)) is decoder  # built once


def test_shorter_generation_is_a_prefix(workload):
    model, prompt, reference = workload
    assert torch.equal(sd.decode_static(model, prompt, 5), reference[:, :5])
    assert sd.decode_static(model, prompt, 0).shape == (1, 0)


def test_capacity():
    assert sd.capacity_for(32, 256) == 320
    assert sd.capacity_for(32, 32) == 64
    assert sd.capacity_for(1, 1) == 64
    config = small_config()
    model = build_model(config, device=DEVICE)
    decoder = sd.StaticDecoder(model, 1, 64)
    with pytest.raises(ValueError):
        decoder.generate(random_prompt(config, 60, device=DEVICE), 10)


def test_final_step_has_no_graph_breaks(workload):
    model, prompt, _ = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    with torch.no_grad():
        decoder.prefill(prompt)
        graphs, breaks = sd.graph_breaks(decoder.decode_step)
    assert (graphs, breaks) == (1, [])


def test_draft_step_has_three_breaks(workload, capsys):
    model, prompt, _ = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    with torch.no_grad():
        decoder.prefill(prompt)
        graphs, breaks = sd.graph_breaks(sd.decode_step_with_breaks, decoder)
    assert graphs == 4
    assert [code.split("(")[0] for _, code, _ in breaks] == [
        "if torch.isnan", "position = decoder.pos.item", "print"]


def test_fullgraph_traces_the_final_step_and_rejects_the_draft(workload):
    model, prompt, reference = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    with torch.no_grad():
        decoder.prefill(prompt)
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(sd.decode_step_with_breaks, backend="eager", fullgraph=True)(decoder)
        traced = torch.compile(decoder.decode_step, backend="eager", fullgraph=True)
        decoder.prefill(prompt)
        for _ in range(4):
            traced()
    torch._dynamo.reset()
    assert torch.equal(decoder.tokens[:, 32:37].cpu(), reference[:, :5])


def test_step_timing_and_profile(workload, tmp_path):
    from gpuinfer.profiling import load_trace, step_stats

    model, prompt, _ = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    timing = sd.step_timing(decoder, prompt, "eager", warmup=1, repeats=3)
    assert timing.repeats == 3 and timing.median > 0
    with pytest.raises(ValueError):
        sd.step_timing(decoder, prompt, "eager", warmup=10, repeats=100)
    path = str(tmp_path / "steps.json.gz")
    trace = sd.profile_steps(decoder, prompt, "eager", path, steps=3, warmup=1)
    assert step_stats(load_trace(path)).steps == 3 == step_stats(trace).steps


def test_head_start_profile_on_the_cpu_is_a_plain_profile(workload):
    from gpuinfer.profiling import step_stats

    model, prompt, _ = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    stats = step_stats(sd.profile_steps(decoder, prompt, "eager", steps=2, warmup=0,
                                        head_start=True))
    assert stats.steps == 2
    if not torch.cuda.is_available():  # no GPU work in the trace: nothing was queued ahead
        assert stats.gpu_span_us == 0 and not stats.queued_ahead


def test_pdl_is_a_compile_option_and_a_variant(workload):
    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64, pdl=True)
    assert decoder.compile_options() == {"coordinate_descent_tuning": True,
                                         "triton.enable_pdl": True}
    assert sd.StaticDecoder(model, 1, 64).compile_options()["triton.enable_pdl"] is False
    # Inductor must know the option (a typo would only fail at compile time, on the GPU).
    import torch._inductor.config as inductor_config
    assert all(hasattr(inductor_config.triton, k.split(".")[1])
               for k in decoder.compile_options() if k.startswith("triton."))
    assert torch.equal(decoder.generate(prompt, 20), reference)  # eager: pdl changes nothing
    v9 = sd.VARIANTS["V9 compiled step (PDL) + CUDA graph"]
    assert v9 is sd.decode_compiled_graph_pdl
    assert v9.__name__ == "decode_compiled_graph_pdl"
    assert sd.decode_with("eager", attention="sdpa").__name__ == "decode_eager_attention_sdpa"


def test_unknown_way_to_run_a_step(workload):
    model, _, _ = workload
    decoder = sd.static_decoder(model, 1, sd.capacity_for(32, 20))
    with pytest.raises(ValueError):
        decoder.step_function("fast")


@pytest.mark.gpu
def test_graph_replay_gives_the_eager_tokens(workload):
    model, prompt, reference = workload
    eager = sd.decode_static(model, prompt, 20)
    assert torch.equal(sd.decode_cuda_graph(model, prompt, 20), eager)
    # prefill resets the cache in place; the same captured graph replays the same tokens
    other = random_prompt(model.config, 32, seed=7, device=DEVICE)
    assert torch.equal(sd.decode_cuda_graph(model, other, 20), sd.decode_static(model, other, 20))
    assert torch.equal(sd.decode_cuda_graph(model, prompt, 20), reference)


@pytest.mark.gpu
def test_graphed_step_is_faster(workload):
    model, prompt, _ = workload
    decoder = sd.static_decoder(model, 1, 128)  # room for the timed steps
    eager = sd.step_timing(decoder, prompt, "eager", warmup=5, repeats=30)
    graph = sd.step_timing(decoder, prompt, "graph", warmup=5, repeats=30)
    assert graph.median < eager.median


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("how", ["compiled", "compiled+graph", "reduce-overhead"])
@pytest.mark.parametrize("pdl", [False, True])
def test_compiled_steps_give_the_reference_tokens(workload, how, pdl):
    model, prompt, reference = workload
    assert torch.equal(sd.decode_with(how, pdl=pdl)(model, prompt, 20), reference)
    # replay, no compile
    assert torch.equal(sd.decode_with(how, pdl=pdl)(model, prompt, 20), reference)


@pytest.mark.gpu
def test_head_start_queues_every_graphed_step(workload):
    from gpuinfer.profiling import step_stats

    model, prompt, _ = workload
    decoder = sd.static_decoder(model, 1, 128)
    stats = step_stats(sd.profile_steps(decoder, prompt, "graph", steps=10, head_start=True))
    assert stats.queued_ahead and stats.kernels > 0
    assert 0 < stats.gpu_span_busy_fraction <= 1
