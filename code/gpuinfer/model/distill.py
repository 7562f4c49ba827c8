"""Distilling the draft from its target: the small model learns the large one's
next-token distribution, not only the text's next token.

Speculative decoding pays by the share a of positions where the draft's greedy token is
the target's. A draft trained on the text learns the text's next token, but the token
that counts is the target's. Distillation (Hinton et al. 2015; for speculative drafts,
DistillSpec, Zhou et al. 2024) gives the draft the target's whole distribution at every
position: a soft label says more per token than the one-hot text, and it is the
distribution the draft must agree with. Chapter 6 uses its simplest form: the windows of
the text that `train.train` draws, the forward KL(teacher || draft), optionally mixed
with the text's cross-entropy (DistillSpec also draws text from the draft).

The loop is `train.train`'s: given `teacher=`, it trains on `objective` instead of the
cross-entropy, and `train.heldout_loss` with the same arguments is the objective on
held-out text. This module holds what is distillation's own: the KL, the mix, and the
checks of a teacher.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def check(model, teacher, *, temperature: float, mix: float) -> None:
    """Refuse what distillation cannot do, before any weight changes. Without a teacher,
    `temperature` and `mix` must keep their defaults (1 and 0): they weigh a teacher."""
    if teacher is None:
        if (temperature, mix) != (1.0, 0.0):
            raise ValueError(f"temperature={temperature!r}, mix={mix!r} without a "
                             "teacher: they weigh a teacher's distribution; pass "
                             "teacher= or leave them out")
        return
    if model is teacher:
        raise ValueError("the model is its own teacher: distil a second model from it")
    vocabs = [m.config.vocab_size for m in (model, teacher)]
    if vocabs[0] != vocabs[1]:  # the KL compares distributions over the same ids
        raise ValueError(f"the model's vocabulary ({vocabs[0]} ids) is not the "
                         f"teacher's ({vocabs[1]}): build it with "
                         f"vocab_size={vocabs[1]} and the teacher's tokenizer")
    devices = [next(m.parameters()).device for m in (model, teacher)]
    if devices[0] != devices[1]:
        raise ValueError(f"the model is on {devices[0]}, the teacher on {devices[1]}: "
                         "move both to one device")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature > 0):
        raise ValueError(f"temperature={temperature!r}: use a finite number above 0 "
                         "(1 distils the teacher's own distribution)")
    if not (isinstance(mix, (int, float)) and 0 <= mix <= 1):  # NaN fails too
        raise ValueError(f"mix={mix!r}: the text loss's weight must be in [0, 1] "
                         "(0: the KL alone, 1: the text alone)")


def kl(logits: torch.Tensor, teacher_logits: torch.Tensor, *, temperature: float,
       reduction: str = "mean") -> torch.Tensor:
    """KL(teacher || model) of the next-token distributions at `temperature`, in FP32,
    times temperature^2 (Hinton et al.: the gradients keep their scale as T changes);
    the mean (or sum) over positions. Forward KL: the model is pushed to put mass
    wherever the teacher does, the teacher's top token included."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r}: use 'mean' or 'sum'")
    log_q = F.log_softmax(logits.float().flatten(0, -2) / temperature, -1)
    log_p = F.log_softmax(teacher_logits.float().flatten(0, -2) / temperature, -1)
    total = F.kl_div(log_q, log_p, reduction="sum", log_target=True)
    scale = temperature**2 / (1 if reduction == "sum" else log_q.shape[0])
    return total * scale


def mixed(kl_value, text_value, *, mix: float):
    """The objective: (1 - mix) KL + mix x the text's cross-entropy. Both are means (or
    sums) over the same tokens, so held-out values mix the same way."""
    return (1 - mix) * kl_value + mix * text_value


def objective(logits: torch.Tensor, teacher_logits: torch.Tensor,
              targets: torch.Tensor, *, mix: float, temperature: float,
              reduction: str = "mean") -> torch.Tensor:
    """The distillation loss of the model's `logits` (..., vocabulary) against the
    teacher's at the same positions, and the text's next tokens `targets` (...)."""
    loss = kl(logits, teacher_logits, temperature=temperature, reduction=reduction)
    if mix == 0:
        return loss
    text = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(),
                           reduction=reduction)
    return mixed(loss, text, mix=mix)
