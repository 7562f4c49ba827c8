"""Speculative greedy decoding: the target's own tokens, passes that commit 1 ... k + 1 of
them, verify passes that equal one-token steps, and clear errors."""

import pytest
import torch

from gpuinfer.decode import runners, speculative as sp
from gpuinfer.decode.static import StaticDecoder
from gpuinfer.model.configs import build_model, model_config, random_prompt

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW = 30


def config(**sizes):
    # a larger initialisation than the toy's: random models whose greedy text varies
    return model_config("toy", vocab_size=64, initializer_range=0.2, **sizes)


@pytest.fixture(scope="module")
def models():
    target = build_model(config(), seed=0, device=DEVICE)
    draft = build_model(config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1),
                        seed=1, device=DEVICE)
    return target, draft


@pytest.fixture(scope="module")
def prompt():
    return random_prompt(config(), 8, device=DEVICE)


def pair(target_model, draft_model, capacity=64, **kwargs):
    target = StaticDecoder(target_model, 1, capacity)
    return target, sp.Speculative(target, StaticDecoder(draft_model, 1, capacity), **kwargs)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_output_is_the_targets_own_greedy_output(models, prompt, k):
    _, spec = pair(*models)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    tokens = spec.generate(prompt, NEW, k)
    assert tokens.shape == (1, NEW) and tokens.device.type == "cpu"
    assert torch.equal(tokens, reference)
    assert (NEW - 1) / (k + 1) <= spec.passes <= NEW - 1


def test_a_draft_that_always_agrees_commits_k_plus_one_tokens_a_pass(models, prompt):
    _, spec = pair(models[0], models[0])  # the target as its own draft
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    for k in (1, 4):
        tokens = spec.generate(prompt, NEW, k)
        assert torch.equal(tokens, reference)
        assert spec.passes == -(-(NEW - 1) // (k + 1))


def test_the_pair_shares_one_sequence(models):
    target, spec = pair(*models)
    assert spec.draft.tokens is target.tokens and spec.draft.pos is target.pos


def test_a_rejected_proposal_is_rolled_back_by_position(models, prompt):
    target, spec = pair(*models)
    with torch.no_grad():
        spec.draft.prefill(prompt)
        target.prefill(prompt)
        start = int(target.pos)
        spec.draft_fn(4)()
        accepted = int(spec.verifier.fn(5)())
    assert 0 <= accepted <= 4 and int(target.pos) == start + accepted + 1


def test_verify_pass_logits_equal_one_token_steps(models, prompt):
    target = StaticDecoder(models[0], 1, 64)
    tokens = runners.generate(target, prompt, 8)
    with torch.no_grad():
        target.prefill(prompt)
        steps = torch.stack([target.step_logits(tokens[:, i: i + 1].to(DEVICE))
                             for i in range(5)], 1)
        target.prefill(prompt)
        positions = torch.arange(prompt.shape[1], prompt.shape[1] + 5, device=DEVICE)
        passes = target.logits(tokens[:, :5].to(DEVICE), positions, every_position=True)
    torch.testing.assert_close(passes, steps, rtol=1e-4, atol=1e-5)


def test_expected_tokens():
    assert sp.expected_tokens(0.0, 4) == 1
    assert sp.expected_tokens(1.0, 4) == 5
    assert sp.expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_repeatable_resets_the_position(models):
    target = StaticDecoder(models[0], 1, 64)
    with torch.no_grad():
        step = sp.repeatable(target.pos, 10, target.device_step)
        for _ in range(3):
            step()
            assert int(target.pos) == 11


def test_bad_input_is_refused_with_the_fix(models, prompt):
    _, spec = pair(*models, capacity=64)
    with pytest.raises(ValueError, match="capacity"):
        spec.generate(prompt, 60, 4)
    with pytest.raises(ValueError, match="between 1 and"):
        spec.one_pass(0)
    with pytest.raises(ValueError, match="2 ... 17"):
        spec.verifier.fn(1)
    with pytest.raises(ValueError, match="same capacity"):
        sp.Speculative(StaticDecoder(models[0], 1, 64), StaticDecoder(models[1], 1, 128))
    with pytest.raises(ValueError, match="batch 1"):
        sp.Speculative(StaticDecoder(models[0], 2, 64), StaticDecoder(models[1], 2, 64))


@pytest.mark.gpu
def test_compiled_and_graphed_passes_give_the_targets_tokens(models, prompt):
    _, spec = pair(*models, mode=runners.V9)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    for k in (1, 3, 6):
        assert torch.equal(spec.generate(prompt, NEW, k), reference)


def test_a_speculative_decoder_has_the_decoders_interface(models, prompt):
    _, spec = pair(*models, k=3)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    assert torch.equal(spec.generate(prompt, NEW), reference)  # k = 3
    with torch.no_grad():
        spec.prefill(prompt)
        start = int(spec.pos)
        spec.decode_step()  # one pass: 1 ... 4 tokens
    assert 1 <= int(spec.pos) - start <= 4
    assert torch.equal(spec.tokens[:, prompt.shape[1]: int(spec.pos) + 1].cpu(),
                       reference[:, : int(spec.pos) + 1 - prompt.shape[1]])


def test_cudagraph_trees_are_refused_for_a_pass(models):
    with pytest.raises(ValueError, match="by hand"):
        pair(*models, mode=runners.V8)


@pytest.mark.parametrize("k", [1, 4])
def test_a_clocked_generation_is_generate_with_its_loop_timed(models, prompt, k):
    _, spec = pair(*models)
    tokens = spec.generate(prompt, NEW, k)
    passes = spec.passes
    clocked, loop = spec.timed_generate(prompt, NEW, k)
    assert torch.equal(clocked, tokens) and spec.passes == passes == loop.passes
    assert len(loop.pass_ms) == passes and len(loop.gap_ms) == passes - 1
    assert all(t >= 0 for t in loop.pass_ms + loop.gap_ms)
    assert loop.loop_ms == pytest.approx(sum(loop.pass_ms) + sum(loop.gap_ms))
    assert spec.timed_generate(prompt, 0, k)[1].passes == 0
    with pytest.raises(ValueError, match="capacity"):  # refused as generate refuses
        spec.timed_generate(prompt, 60, k)
    assert torch.equal(spec.generate(prompt, NEW, k), tokens)  # and nothing changed


