"""A draft cut from its target (gpuinfer.model.draft): which layers it keeps, what
is copied and frozen, that it trains, and that misuse is refused before a weight
changes."""

import pytest
import torch

from gpuinfer.model.configs import build_model, model_config
from gpuinfer.model.draft import kept_layers, start_from
from gpuinfer.model.train import train

VOCAB = 64
SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2)


def llama(layers: int, seed: int, **sizes):
    config = model_config("tiny", vocab_size=VOCAB, tie_word_embeddings=True,
                          max_position_embeddings=128, num_hidden_layers=layers,
                          **{**SHAPE, **sizes})
    return build_model(config, seed=seed)


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_kept_layers_are_the_first_and_the_last():
    assert kept_layers(16, 2) == [0, 15]
    assert kept_layers(16, 3) == [0, 1, 15]
    assert kept_layers(4, 1) == [3]
    assert kept_layers(4, 4) == [0, 1, 2, 3]
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"a draft of {bad} layers"):
            kept_layers(4, bad)


def test_start_from_copies_the_target_and_freezes_the_embedding():
    target, draft = llama(4, seed=0), llama(2, seed=1)
    assert start_from(draft, target) == [0, 3]
    t, d = target.model, draft.model
    assert torch.equal(d.embed_tokens.weight, t.embed_tokens.weight)
    assert draft.lm_head.weight is d.embed_tokens.weight  # still tied
    assert torch.equal(d.norm.weight, t.norm.weight)
    for mine, theirs in zip(d.layers, (t.layers[0], t.layers[3])):
        for (name, a), (_, b) in zip(mine.state_dict().items(),
                                     theirs.state_dict().items()):
            assert torch.equal(a, b), name
    assert not d.embed_tokens.weight.requires_grad
    assert all(p.requires_grad for p in d.layers.parameters())
    # the copies are the draft's own: training it leaves the target as it was
    before = weights(target)
    stream = torch.randint(0, VOCAB, (2000,),
                           generator=torch.Generator().manual_seed(0))
    log = train(draft, stream, steps=4, batch=2, seq_len=16, lr=1e-2, warmup=1,
                teacher=target, log_every=100)
    assert log.steps == 4
    assert torch.equal(d.embed_tokens.weight, t.embed_tokens.weight)  # frozen
    assert not torch.equal(d.layers[0].mlp.up_proj.weight,
                           t.layers[0].mlp.up_proj.weight)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_start_from_given_layers():
    target, draft = llama(4, seed=0), llama(2, seed=1)
    assert start_from(draft, target, layers=[2, 1]) == [2, 1]
    assert torch.equal(draft.model.layers[0].self_attn.q_proj.weight,
                       target.model.layers[2].self_attn.q_proj.weight)


@pytest.mark.parametrize("draft_args, layers, match", [
    (dict(layers=2, hidden_size=32), None, "hidden_size is 32, the target's 64"),
    (dict(layers=2, intermediate_size=96), None, "intermediate_size is 96"),
    (dict(layers=2, num_key_value_heads=4), None, "num_key_value_heads is 4"),
    (dict(layers=2), [0], r"layers=\[0\]: 2 indices of the target's 4 layers"),
    (dict(layers=2), [0, 4], r"layers=\[0, 4\]"),
    (dict(layers=5), None, "a draft of 5 layers from a target of 4"),
])
def test_misuse_is_refused_before_a_weight_changes(draft_args, layers, match):
    target = llama(4, seed=0)
    draft = llama(draft_args.pop("layers"), seed=1, **draft_args)
    before = weights(draft)
    with pytest.raises(ValueError, match=match):
        start_from(draft, target, layers=layers)
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    assert draft.model.embed_tokens.weight.requires_grad


def test_the_target_is_not_its_own_draft():
    target = llama(2, seed=0)
    with pytest.raises(ValueError, match="the draft is the target itself"):
        start_from(target, target)


def test_another_vocabulary_is_refused():
    target = llama(2, seed=0)
    config = model_config("tiny", vocab_size=VOCAB + 1, tie_word_embeddings=True,
                          max_position_embeddings=128, num_hidden_layers=1, **SHAPE)
    draft = build_model(config, seed=1)
    with pytest.raises(ValueError, match="vocab_size is 65, the target's 64"):
        start_from(draft, target)
