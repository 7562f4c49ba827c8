"""Stock `transformers`: a model's own `generate()`, greedy with EOS ignored, the book's
baselines; and the name its layers give the KV-cache argument.

Every function here has the decode loops' signature, `fn(model, prompt_ids, new_tokens)`,
and returns the new token ids as an int64 CPU tensor (`gpuinfer.decode.loops`), so a stock
call and a loop of the book are timed and compared alike. They sit with the model, below the
measurements, because a stock process (`gpuinfer.measure.stock_process`) and the teacher-
forced logits (`gpuinfer.measure.quality`) call the model as a user would, with none of
the book's decoders.
"""

from __future__ import annotations

import inspect

import torch

# The stock baselines by short name, with the labels the chapters' tables give them.
STOCK_LABELS = {
    "dynamic": "generate(), dynamic cache",
    "static": 'generate(), cache_implementation="static"',
}


def cache_kwarg(module: torch.nn.Module) -> str:
    """The KV-cache argument's name: `cache` in newer transformers (5.24), else `past_key_values`.

    The old name still works in 5.24 but logs a deprecation warning."""
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def generate_new_tokens(model, prompt_ids: torch.Tensor, new_tokens: int,
                        **kwargs) -> torch.Tensor:
    """Stock `model.generate`, greedy, EOS ignored; the new tokens as an int64 CPU tensor."""
    out = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                         max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                         pad_token_id=0, **kwargs)
    new = out[:, prompt_ids.shape[1]:]
    if new.shape[1] != new_tokens:
        raise RuntimeError(f"generate() stopped after {new.shape[1]} of {new_tokens} tokens")
    return new.cpu()


def decode_generate(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Stock `generate()` with its default cache, which grows by one token per step."""
    return generate_new_tokens(model, prompt_ids, new_tokens)


def decode_generate_static(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Stock `generate()` with `cache_implementation="static"`, preallocated."""
    return generate_new_tokens(model, prompt_ids, new_tokens, cache_implementation="static")
