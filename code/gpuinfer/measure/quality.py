"""Does a faster variant still compute the same thing? Teacher-forced logits, compared.

In FP32 a variant must give exactly the reference's greedy tokens. In BF16, or with kernels
of our own, it rounds differently, and free-running greedy decoding says little: on a random
model near-ties are everywhere, one flips, and every later token differs. Teacher forcing
asks the right question instead: feed the *reference's* tokens to both, step by step, and
compare the logits each produces at every step (`forced_logits`, `compare_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from gpuinfer.model.stock_generate import cache_kwarg


@dataclass(frozen=True)
class LogitAgreement:
    """Two sets of teacher-forced logits, compared step by step."""

    steps: int
    max_abs: float  # the largest |difference| of a logit, over every step and token
    rel: float  # the largest, over the steps, of max |difference| / max |reference logit|
    top1: float  # the fraction of steps (and sequences) whose most likely token agrees

    def __str__(self) -> str:
        return (f"{self.steps} steps: max |Δ| {self.max_abs:.3g} ({100 * self.rel:.2g} % "
                f"of the logit scale), top-1 agreement {100 * self.top1:.1f} %")


def agreement_markdown(agreements: dict[str, LogitAgreement], what: str) -> str:
    """A table of comparisons {name: LogitAgreement}, one row each, `what` naming the
    rows in the header (e.g. "BF16 variant, fed the FP32 reference's tokens")."""
    lines = [f"| {what} | max abs. difference | of the logit scale | top-1 agreement |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | {a.max_abs:.3g} | {100 * a.rel:.2g} % | {100 * a.top1:.1f} % |"
              for name, a in agreements.items()]
    return "\n".join(lines)


def compare_logits(reference: torch.Tensor, other: torch.Tensor) -> LogitAgreement:
    """Compare logits of shape (batch, steps, vocab), both fed the same tokens."""
    if reference.shape != other.shape:
        raise ValueError(f"logits of shapes {tuple(reference.shape)} and "
                         f"{tuple(other.shape)}: not the same steps")
    ref, oth = reference.double(), other.double()
    diff = (ref - oth).abs().amax(dim=-1)  # (batch, steps)
    scale = ref.abs().amax(dim=-1)
    same = ref.argmax(-1) == oth.argmax(-1)
    return LogitAgreement(ref.shape[1], float(diff.max()), float((diff / scale).max()),
                          float(same.double().mean()))


@torch.no_grad()
def forced_logits(model, prompt_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The logits a `transformers` model gives at each of len(tokens) steps after the
    prompt, fed `tokens` (batch, n) rather than its own: a prefill, then one token per step
    with a KV cache, as a cached decode loop runs. (batch, n, vocab), FP32, on the CPU."""
    cache = {cache_kwarg(model): DynamicCache()}
    steps = [model(input_ids=prompt_ids, use_cache=True, **cache).logits[:, -1]]
    for k in range(tokens.shape[1] - 1):
        token = tokens[:, k: k + 1].to(prompt_ids.device)
        steps.append(model(input_ids=token, use_cache=True, **cache).logits[:, -1])
    return torch.stack(steps, dim=1).float().cpu()


@torch.no_grad()
def forced_decoder_logits(decoder, prompt_ids: torch.Tensor, tokens: torch.Tensor,
                          step_logits=None) -> torch.Tensor:
    """The same for a decoder of the book (`prefill` returns the last prompt position's
    logits; `step_logits(token)` runs one step on a given token): (batch, n, vocab).
    `step_logits` may be given instead, e.g. compiled (`runners.compiled_step_logits`)."""
    step_logits = step_logits or decoder.step_logits
    steps = [decoder.prefill(prompt_ids)]
    for k in range(tokens.shape[1] - 1):
        steps.append(step_logits(tokens[:, k: k + 1].to(prompt_ids.device)).clone())
    return torch.stack(steps, dim=1).float().cpu()
