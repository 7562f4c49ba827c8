"""Every FP32 decode variant produces exactly the naive loop's tokens (small config, CPU)."""

import pytest
import torch

from gpuinfer.decode import loops as decode
from gpuinfer.measure.rounds import split_rounds
from gpuinfer.measure import steps
from gpuinfer.model.configs import build_model, model_config, random_prompt

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model():
    return build_model(model_config("toy", vocab_size=512), seed=0)


@pytest.fixture(scope="module")
def prompt(model):
    return random_prompt(model.config, 16, batch=2, seed=3)


@pytest.fixture(scope="module")
def reference(model, prompt):
    return decode.decode_naive(model, prompt, NEW_TOKENS)


def test_reference_shape_and_type(reference, prompt):
    assert reference.shape == (prompt.shape[0], NEW_TOKENS)
    assert reference.dtype == torch.int64 and reference.device.type == "cpu"


@pytest.mark.parametrize("name", [n for n in decode.LOOPS if n != "naive"])
def test_every_fp32_variant_is_bit_exact(name, model, prompt, reference):
    out = decode.LOOPS[name](model, prompt, NEW_TOKENS)
    assert out.dtype == torch.int64 and out.device.type == "cpu"
    assert torch.equal(out, reference), name


def test_the_workload_size_is_bit_exact_too():
    """The tiny model's shape (vocab 32000, 4 layers), a few tokens: cached == naive."""
    config = model_config("tiny")
    model = build_model(config, seed=0)
    prompt = random_prompt(config, 32)
    ref = decode.decode_naive(model, prompt, 6)
    for fn in (decode.decode_kv_cache, decode.decode_static_cache, decode.decode_lean):
        assert torch.equal(fn(model, prompt, 6), ref), fn.__name__


@pytest.mark.parametrize("fn", list(decode.LOOPS.values()))
def test_edge_lengths(fn, model, prompt, reference):
    assert fn(model, prompt, 0).shape == (prompt.shape[0], 0)
    assert torch.equal(fn(model, prompt, 1), reference[:, :1])


def test_naive_stops_at_eos(model, prompt):
    single = prompt[:1]
    ref = decode.decode_naive(model, single, NEW_TOKENS)
    eos = int(ref[0, 5])
    first = int((ref[0] == eos).nonzero()[0])
    out = decode.decode_naive(model, single, NEW_TOKENS, eos_token_id=eos)
    assert torch.equal(out, ref[:, : first + 1])


def test_lean_leaves_no_inference_tensors(model, prompt):
    out = decode.decode_lean(model, prompt, 3)
    assert not out.is_inference()


def step_times_ms(fn, model, prompt, n):
    with steps.step_clock() as clock:
        fn(model, prompt, n)
    return clock.times_ms()


def test_step_clock_times_every_decode_step(model, prompt):
    times = step_times_ms(decode.decode_no_sync, model, prompt, 5)
    assert len(times) == 4 and all(t > 0 for t in times)  # the prefill is not a step
    times = step_times_ms(decode.decode_naive, model, prompt, 5)
    assert len(times) == 5
    assert not steps.clock_running()  # the clock is off again


def test_split_rounds_splits_each_generation(model, prompt):
    import warnings

    fns = {name: (lambda fn=fn: fn(model, prompt, 5))
           for name, fn in [("V0", decode.decode_naive), ("V2", decode.decode_no_sync)]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the host clock's warning on a CPU
        split = split_rounds(fns, 5, rounds=2, warmup=1)
    for name in fns:
        assert split.decode.rounds == split.prefill.rounds == split.whole.rounds == 2
        for r in range(2):
            prefill, per_step = split.prefill.times_ms[name][r], split.decode.times_ms[name][r]
            # the parts fit inside the whole call (timed by interleaved_rounds, per token)
            assert 0 < prefill + 4 * per_step <= split.whole.times_ms[name][r] * 5 * 1.05
            assert per_step * 4 == pytest.approx(sum(split.steps_ms[name][r][-4:]))
    assert len(split.steps_ms["V0"][0]) == 5 and len(split.steps_ms["V2"][0]) == 4
    assert not steps.clock_running()
    with pytest.raises(ValueError):
        split_rounds(fns, 1, rounds=1)


def test_stock_generate_gives_the_reference_tokens(model, prompt, reference):
    for fn in decode.BASELINES.values():
        assert torch.equal(fn(model, prompt, NEW_TOKENS), reference), fn.__name__


def test_bf16_copy_leaves_the_model_alone(model):
    copy = decode.bf16_copy(model)
    assert copy.lm_head.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32


def test_lean_refuses_attention_it_cannot_mask():
    config = model_config("toy", vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    model = build_model(config, attn_implementation="flex_attention")
    with pytest.raises(ValueError, match="SDPA or eager attention, not 'flex_attention'"):
        decode.decode_lean(model, random_prompt(config, 4), 2)


@pytest.mark.parametrize("name", list(decode.LOOPS) + list(decode.BASELINES))
def test_eager_attention_is_bit_exact_too(name):
    """Chapters 2 and 3 run transformers' eager attention: every loop still gives V0's
    tokens (the lean loop writes the prompt's causal mask out)."""
    model = build_model(model_config("toy", vocab_size=512), seed=0,
                        attn_implementation="eager")
    prompt = random_prompt(model.config, 16, batch=2, seed=3)
    fn = decode.LOOPS.get(name) or decode.BASELINES[name]
    assert torch.equal(fn(model, prompt, 12), decode.decode_naive(model, prompt, 12))


def test_every_loop_has_the_books_label():
    from gpuinfer.report import labels

    assert [labels.loop_label(name) for name in decode.LOOPS] == [
        "V0 naive", "V1 KV cache", "V2 no sync", "V2s static cache", "V2L lean loop"]
    with pytest.raises(KeyError, match="'V2L' has no label: one of"):
        labels.loop_label("V2L")
    assert labels.is_naive_loop("V0 naive") and labels.is_naive_loop("V0 fixture")
    assert not labels.is_naive_loop("V2L lean loop") and not labels.is_naive_loop("V01")
