"""The book's decode workloads: Llama models from a `transformers` config, random weights.

No downloads: the weights are drawn from a seeded generator on the device they run on, so
a machine builds the same model every time. The speed of a decode step depends on the
shapes, not on the values. `CONFIGS` holds every model the book runs:

- "tiny" (4 layers, hidden 256, 19.5 M parameters): so small that a decode step is a string
  of microsecond kernels and launching them sets the speed, with or without a KV cache;
- "small" (8 layers, hidden 1024, 168 M parameters): Chapters 2 and 3's workload, large
  enough that recomputing a long prompt costs far more than launching a cached step;
- "1b" (the shape of Llama-3.2-1B: 1.24 B parameters, 2.47 GB in BF16): Chapters 4 and 5;
- "toy" and "reduced": the small and the 1B structure shrunk for a CPU (smoke mode, tests).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

_TINY = dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048,
             tie_word_embeddings=False)
_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
           num_attention_heads=32, num_key_value_heads=8, head_dim=64,
           max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
           tie_word_embeddings=True)

CONFIGS: dict[str, dict] = {
    "tiny": _TINY,
    "small": {**_TINY, "hidden_size": 1024, "intermediate_size": 2816,
              "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
              "max_position_embeddings": 8192},
    # Chapters 2 and 3 on a CPU: 2 layers, hidden 64.
    "toy": {**_TINY, "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 172,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4},
    "1b": _1B,
    # The 1B structure (grouped-query attention 4/2, tied embeddings) small enough for a
    # CPU: 155,968 parameters. The weights are drawn with a larger standard deviation than
    # the 1B model's 0.02 (0.113 = 0.02 x sqrt(2048 / 64)), so that activations have the 1B
    # model's magnitudes: with 0.02 at this width the layers barely perturb the tied
    # embedding of the input token, and greedy decoding repeats one token forever.
    "reduced": {**_1B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "max_position_embeddings": 1024, "initializer_range": 0.113},
}


def model_config(name: str, **overrides) -> LlamaConfig:
    """The config `CONFIGS[name]`, with `overrides` applied (any LlamaConfig field)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; one of {', '.join(CONFIGS)}")
    return LlamaConfig(**{**CONFIGS[name], **overrides})


def head_dim(config: LlamaConfig) -> int:
    """Features per attention head: the config's own, or hidden / heads where it has none."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_llama(config) -> None:
    """Refuse, with what to do instead, a model the book's decoders do not cover: another
    architecture than Llama's, or a Llama with biases in its projections."""
    kind = getattr(config, "model_type", None)
    if kind != "llama":
        raise NotImplementedError(
            f"the book's decoders cover Llama models (model_type 'llama'), not {kind!r}: "
            "load a Llama checkpoint (Llama 2, 3, 3.1, 3.2, TinyLlama, SmolLM ...)")
    biased = [n for n in ("attention_bias", "mlp_bias") if getattr(config, n, False)]
    if biased:
        raise NotImplementedError(
            f"this Llama has {' and '.join(biased)}=True; the decoders' projections have "
            "no bias terms: use transformers' generate() for it")


def load_llama(source, *, dtype: torch.dtype = torch.bfloat16,
               device: torch.device | str = "cpu",
               attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A Llama to decode: `source` is a `LlamaForCausalLM` (returned as it is, checked) or
    the path of a local checkpoint folder (`save_pretrained`'s), loaded in `dtype` on
    `device`, in eval mode. Nothing is downloaded."""
    if isinstance(source, LlamaForCausalLM):
        check_llama(source.config)
        return source
    if not isinstance(source, (str, Path)):
        raise TypeError(f"load_llama takes a LlamaForCausalLM or a checkpoint folder, not "
                        f"{type(source).__name__}")
    folder = Path(source)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no config.json there; give the folder that "
                                "save_pretrained() wrote (config.json and the weights)")
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    check_llama(config)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True,
                                             attn_implementation=attn_implementation)
    return model.to(device).eval()


def build_model(config: LlamaConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu",
                attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A LlamaForCausalLM with seeded random weights, created directly on `device`, in eval
    mode. Creating the modules inside a `torch.device` context allocates and initialises
    every weight on the device: a second on a GPU for 1.2 B parameters, against a minute
    or more initialised on the CPU and copied over."""
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype).eval()


def random_prompt(config: LlamaConfig, length: int, *, batch: int = 1, seed: int = 1,
                  device="cpu") -> torch.Tensor:
    """A seeded random prompt of token ids, shape (batch, length)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=gen)
    return ids.to(device)
