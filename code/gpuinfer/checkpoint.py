"""A Llama to decode, from a `transformers` model or a local checkpoint folder.

The book's decoders run Llama's math on a model's own weights; `load_llama` hands them a
`LlamaForCausalLM`, from a model already built or from the folder `save_pretrained`
wrote (nothing is downloaded), and refuses, with what to do instead, what they do not
cover: another architecture, or projections with biases.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, LlamaForCausalLM


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
