"""The book's decode workload: a small Llama from a `transformers` config, random weights.

No downloads: the weights are drawn from a seeded generator, so every machine builds the
same model. `tiny_llama_config` is the launch-bound model of Chapters 2 and 3: about 19.5 M
parameters (78 MB in fp32), so one decode step moves little data and runs dozens of tiny
kernels whose launch cost, not memory bandwidth, sets the step time on an H200.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama_config(**overrides) -> LlamaConfig:
    """4 layers, hidden 256, 8 heads, MLP 688, vocab 32000: 19.5 M parameters."""
    params = dict(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    params.update(overrides)
    return LlamaConfig(**params)


def build_model(
    config: LlamaConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attn_implementation: str = "sdpa",
) -> LlamaForCausalLM:
    """A LlamaForCausalLM with seeded random weights, in eval mode, on `device`."""
    torch.manual_seed(seed)
    config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(config)
    return model.to(device=device, dtype=dtype).eval()


def random_prompt(
    config: LlamaConfig, length: int, *, batch: int = 1, seed: int = 1, device="cpu"
) -> torch.Tensor:
    """A seeded random prompt of token ids, shape (batch, length)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=gen)
    return ids.to(device)
