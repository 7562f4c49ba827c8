"""The book's models (gpuinfer.model.configs): the config table, the builder, the prompt."""

import pytest
import torch

from gpuinfer.model.configs import (CONFIGS, build_model, head_dim, model_config,
                                    random_prompt)


def test_every_config_builds_with_its_parameter_count():
    expected = {"tiny": 19_548_416, "small": 168_313_856, "toy": 361_280, "reduced": 155_968}
    for name, params in expected.items():
        with torch.device("meta"):  # shapes only: no memory
            model = build_model(model_config(name), device="meta")
        assert sum(p.numel() for p in model.parameters()) == params, name
    assert set(expected) | {"1b"} == set(CONFIGS)


def test_overrides_and_unknown_names():
    assert model_config("toy", vocab_size=64).vocab_size == 64
    assert model_config("toy").vocab_size == 2048  # the table is not changed by an override
    with pytest.raises(ValueError, match="unknown model config 'huge'.*tiny"):
        model_config("huge")


def test_head_dim_with_and_without_the_field():
    assert head_dim(model_config("1b")) == 64
    assert head_dim(model_config("tiny")) == 256 // 8


def test_seeded_weights_and_prompts_repeat():
    a = build_model(model_config("toy"), seed=3)
    b = build_model(model_config("toy"), seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not a.training
    p = random_prompt(model_config("toy"), 7, batch=2, seed=5)
    assert p.shape == (2, 7) and torch.equal(p, random_prompt(model_config("toy"), 7, batch=2,
                                                                 seed=5))
