"""The static-cache decode step of Chapter 3: the same math as the transformers Llama, fixed
addresses, no graph breaks (how the step is run is tested in test_runners.py)."""

import pytest
import torch
import torch.nn.functional as F

from gpuinfer.decode import runners, static as sd
from gpuinfer.decode.loops import decode_kv_cache, decode_naive
from gpuinfer.model import llama as ml
from gpuinfer.model.configs import build_model, model_config, random_prompt

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def small_config(**overrides):
    return model_config("toy", **overrides)


@pytest.fixture(scope="module")
def workload():
    config = small_config()
    model = build_model(config, seed=0, device=DEVICE)
    prompt = random_prompt(config, 32, device=DEVICE)
    return model, prompt, decode_naive(model, prompt, 20)


def test_static_cache_gives_the_dynamic_cache_tokens(workload):
    model, prompt, reference = workload
    tokens = runners.decode_fn(runners.EAGER)(model, prompt, 20)
    assert tokens.dtype == torch.int64 and tokens.device.type == "cpu"
    assert tokens.shape == (1, 20)
    assert torch.equal(tokens, decode_kv_cache(model, prompt, 20))
    assert torch.equal(tokens, reference)


@pytest.mark.parametrize("kernel", ml.ATTENTION)
def test_attention_equals_repeat_interleave_sdpa(kernel):
    torch.manual_seed(0)
    batch, length, heads, kv_heads, d, slots = 2, 3, 8, 2, 16, 10
    q = torch.randn(batch, length, heads, d)
    keys, values = torch.randn(2, batch, kv_heads, slots, d)
    positions = torch.tensor([5, 6, 7])
    mask = torch.where(torch.arange(slots)[None] <= positions[:, None], 0.0, float("-inf"))
    ours = ml.attention(q, keys, values, ml.fold_mask(mask, heads // kv_heads), kernel)
    group = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1),
        attn_mask=mask).transpose(1, 2).reshape(batch, length, heads * d)
    torch.testing.assert_close(ours, expected)


def test_unknown_attention_kernel_is_named():
    with pytest.raises(ValueError, match="flash.*matmul"):
        ml.attention(*torch.randn(3, 1, 1, 2, 4), torch.zeros(1, 1), "flash")


@pytest.mark.parametrize("kernel", ml.ATTENTION)
def test_grouped_query_attention_and_batch(kernel):
    config = small_config(num_key_value_heads=2)
    model = build_model(config, seed=3, device=DEVICE)
    prompt = random_prompt(config, 7, batch=3, device=DEVICE)
    decode = runners.decode_fn(runners.EAGER, attention=kernel)
    assert torch.equal(decode(model, prompt, 12), decode_naive(model, prompt, 12))
    decoder = runners.decoder_for(model, 3, sd.capacity_for(7, 12), attention=kernel)
    assert decoder.attention == kernel
    other = "sdpa" if kernel == "matmul" else "matmul"
    assert decoder is not runners.decoder_for(model, 3, sd.capacity_for(7, 12), attention=other)


def test_prefill_resets_and_nothing_moves(workload):
    model, prompt, reference = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    decode_static = runners.decode_fn(runners.EAGER)
    addresses = [t.data_ptr() for t in decoder.tensors()]
    first = decode_static(model, prompt, 20)
    kept = first.clone()
    other = random_prompt(model.config, 32, seed=7, device=DEVICE)
    second = decode_static(model, other, 20)  # overwrites the cache with another sequence
    assert not torch.equal(second, kept)  # a test of something
    assert torch.equal(first, kept)  # the caller's tokens are the caller's own
    assert torch.equal(decode_static(model, prompt, 20), kept)
    assert addresses == [t.data_ptr() for t in decoder.tensors()]
    assert runners.decoder_for(model, 1, sd.capacity_for(32, 20)) is decoder  # built once


def test_shorter_generation_is_a_prefix(workload):
    model, prompt, reference = workload
    decode_static = runners.decode_fn(runners.EAGER)
    assert torch.equal(decode_static(model, prompt, 5), reference[:, :5])
    assert decode_static(model, prompt, 0).shape == (1, 0)


def test_capacity():
    assert sd.capacity_for(32, 256) == 320
    assert sd.capacity_for(32, 32) == 64
    assert sd.capacity_for(1, 1) == 64
    config = small_config()
    model = build_model(config, device=DEVICE)
    decoder = sd.StaticDecoder(model, 1, 64)
    with pytest.raises(ValueError, match="capacity of 64"):
        runners.generate(decoder, random_prompt(config, 60, device=DEVICE), 10)
    with pytest.raises(ValueError, match="exceed the decoder.s capacity"):
        decoder.prefill(random_prompt(config, 64, device=DEVICE))


def test_final_step_has_no_graph_breaks(workload):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    with torch.no_grad():
        decoder.prefill(prompt)
        graphs, breaks = sd.graph_breaks(decoder.device_step)
    assert (graphs, breaks) == (1, [])


def test_draft_step_has_three_breaks(workload, capsys):
    model, prompt, _ = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    with torch.no_grad():
        decoder.prefill(prompt)
        graphs, breaks = sd.graph_breaks(sd.decode_step_with_breaks, decoder)
    assert graphs == 4
    assert [code.split("(")[0] for _, code, _ in breaks] == [
        "if torch.isnan", "position = decoder.pos.item", "print"]


def test_fullgraph_traces_the_final_step_and_rejects_the_draft(workload):
    model, prompt, reference = workload
    decoder = runners.decoder_for(model, 1, sd.capacity_for(32, 20))
    with torch.no_grad():
        decoder.prefill(prompt)
        with pytest.raises(torch._dynamo.exc.Unsupported):
            torch.compile(sd.decode_step_with_breaks, backend="eager", fullgraph=True)(decoder)
        traced = torch.compile(decoder.device_step, backend="eager", fullgraph=True)
        decoder.prefill(prompt)
        for _ in range(4):
            traced()
    torch._dynamo.reset()
    assert torch.equal(decoder.tokens[:, 32:37].cpu(), reference[:, :5])


def test_teacher_forced_steps_give_the_models_logits(workload):
    """step_logits runs the step on a given token: fed the reference's own tokens, the
    decoder's logits are the transformers model's, step after step."""
    from gpuinfer.measure.quality import (compare_logits, forced_decoder_logits, forced_logits)

    model, prompt, reference = workload
    decoder = sd.StaticDecoder(model, 1, 64)
    ours = forced_decoder_logits(decoder, prompt, reference[:, :8])
    theirs = forced_logits(model, prompt, reference[:, :8])
    agreement = compare_logits(theirs, ours)
    assert ours.shape == (1, 8, model.config.vocab_size)
    assert agreement.top1 == 1.0 and agreement.rel < 1e-5
    assert torch.equal(ours.argmax(-1), reference[:, :8].cpu())
