"""Distilling the draft from its target: the small model learns the large one's
next-token distribution, not only the text's next token (issue 57; a probe, no chapter
reaches it).

Speculative decoding pays by the share a of positions where the draft's greedy token is
the target's. A draft trained on the text learns the text's next token, but the token
that counts is the target's, and one pass over the text leaves it at a = 0.67; more
passes memorise the text (scripts/probes/NOTES-57-corpus.md). Distillation (Hinton et
al. 2015; for speculative drafts, DistillSpec, Zhou et al. 2024) gives the draft the
target's whole distribution at every position: a soft label says more per token than the
one-hot text, and it is the distribution the draft must agree with. This is its simplest
form: the windows of the text that `train.train` draws (DistillSpec also draws text from
the draft), the forward KL(teacher || draft), optionally mixed with the text's
cross-entropy.

The loop is `train._train`'s with another loss: the same windows from the same seed,
AdamW, schedule, clipping, autocast and deterministic kernels. With mix = 1 it is
`train.train`, loss for loss. When Chapter 6 distils its draft, the objective should
become an argument of `train.train`, one loop, and the private imports below go.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.nn.functional as F

from gpuinfer.env import sync
from gpuinfer.model.train import TrainLog, batches, deterministic, learning_rate
# train.py's private helpers, imported while this is a probe (see above)
from gpuinfer.model.train import (_autocast, _check_window, _next_token_loss,
                                  _optimizer, _progress)


def check(draft, teacher, *, temperature: float, mix: float) -> None:
    """Refuse what distillation cannot do, before any weight changes."""
    if draft is teacher:
        raise ValueError("the draft is the teacher: distil a second model from it")
    vocabs = [m.config.vocab_size for m in (draft, teacher)]
    if vocabs[0] != vocabs[1]:  # the KL compares distributions over the same ids
        raise ValueError(f"the draft's vocabulary ({vocabs[0]} ids) is not the "
                         f"teacher's ({vocabs[1]}): build the draft with "
                         f"vocab_size={vocabs[1]} and the teacher's tokenizer")
    devices = [next(m.parameters()).device for m in (draft, teacher)]
    if devices[0] != devices[1]:
        raise ValueError(f"the draft is on {devices[0]}, the teacher on {devices[1]}: "
                         "move both to one device")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature > 0):
        raise ValueError(f"temperature={temperature!r}: use a finite number above 0 "
                         "(1 distils the teacher's own distribution)")
    if not (isinstance(mix, (int, float)) and 0 <= mix <= 1):  # NaN fails too
        raise ValueError(f"mix={mix!r}: the text loss's weight must be in [0, 1] "
                         "(0: the KL alone, 1: the text alone)")


def kl(draft_logits: torch.Tensor, teacher_logits: torch.Tensor, *, temperature: float,
       reduction: str = "mean") -> torch.Tensor:
    """KL(teacher || draft) of the next-token distributions at `temperature`, in FP32,
    times temperature^2 (Hinton et al.: the gradients keep their scale as T changes);
    the mean (or sum) over positions. Forward KL: the draft is pushed to put mass
    wherever the teacher does, the teacher's top token included."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r}: use 'mean' or 'sum'")
    log_q = F.log_softmax(draft_logits.float().flatten(0, -2) / temperature, -1)
    log_p = F.log_softmax(teacher_logits.float().flatten(0, -2) / temperature, -1)
    total = F.kl_div(log_q, log_p, reduction="sum", log_target=True)
    scale = temperature**2 / (1 if reduction == "sum" else log_q.shape[0])
    return total * scale


def mixed(kl_value, text_value, *, mix: float):
    """The objective: (1 - mix) KL + mix x the text's cross-entropy. Both are means over
    the same tokens, so held-out values mix the same way."""
    return (1 - mix) * kl_value + mix * text_value


def _loss(draft, teacher, window: torch.Tensor, *, temperature: float, mix: float):
    if mix == 1:  # the text alone: train.train's loss, and no teacher pass to pay for
        return _next_token_loss(draft, window)
    inputs = window[:, :-1]
    logits = draft(input_ids=inputs).logits
    # no_grad, not inference_mode: the KL's backward saves the teacher's probabilities,
    # and autograd refuses to save an inference tensor.
    with torch.no_grad():
        teacher_logits = teacher(input_ids=inputs).logits
    loss = kl(logits, teacher_logits, temperature=temperature)
    if mix == 0:
        return loss
    text = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
    return mixed(loss, text, mix=mix)


def distill(draft, teacher, tokens: torch.Tensor, *, steps: int, batch: int,
            seq_len: int, lr: float = 1e-3, warmup: int | None = None,
            weight_decay: float = 0.1, seed: int = 0, temperature: float = 1.0,
            mix: float = 0.0, log_every: int | None = None, name: str = "draft",
            deterministic_kernels: bool = True) -> TrainLog:
    """Train `draft` on `steps` batches of `batch` random windows of `seq_len` tokens of
    `tokens` (the windows `train.train` draws with `seed`) to match `teacher`'s
    next-token distribution: loss (1 - mix) KL(teacher || draft) + mix x cross-entropy
    on the text. The teacher is not changed (eval mode during, its mode restored after).
    Both must share a tokenizer; only the vocabulary size can be checked. Returns a
    `TrainLog` of the objective's values; the draft is left in eval mode."""
    if steps < 1:
        raise ValueError(f"steps={steps}: distil for at least one step")
    check(draft, teacher, temperature=temperature, mix=mix)
    _check_window(tokens, seq_len)  # refused before the draft changes
    warmup = max(1, steps // 20) if warmup is None else max(1, warmup)
    log_every = max(1, steps // 10) if log_every is None else max(1, log_every)
    device = next(draft.parameters()).device
    kernels = (deterministic(device) if deterministic_kernels
               else contextlib.nullcontext())
    teacher_was_training = teacher.training
    teacher.eval()
    try:
        with kernels:
            return _distill(draft, teacher, tokens, steps=steps, batch=batch,
                            seq_len=seq_len, lr=lr, warmup=warmup,
                            weight_decay=weight_decay, seed=seed,
                            temperature=temperature, mix=mix, log_every=log_every,
                            name=name, device=device)
    finally:
        teacher.train(teacher_was_training)


def _distill(draft, teacher, tokens, *, steps, batch, seq_len, lr, warmup, weight_decay,
             seed, temperature, mix, log_every, name, device) -> TrainLog:
    # train._train's loop, line for line, with _loss for _next_token_loss
    optimizer = _optimizer(draft, lr=lr, weight_decay=weight_decay, device=device)
    generator = torch.Generator().manual_seed(seed)
    losses = torch.zeros(steps, device=device)  # read at the end: no wait per step
    draft.train()
    sync()
    start = time.perf_counter()
    for step in range(steps):
        window = batches(tokens, batch=batch, seq_len=seq_len, generator=generator)
        if device.type == "cuda":
            window = window.pin_memory()
        window = window.to(device, non_blocking=True)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps=steps, lr=lr, warmup=warmup)
        with _autocast(device):  # the teacher's pass too: as it ran when it trained
            loss = _loss(draft, teacher, window, temperature=temperature, mix=mix)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        losses[step] = loss.detach()
        if (step + 1) % log_every == 0:
            _progress(name, step + 1, steps, loss, start)
    if steps % log_every:
        _progress(name, steps, steps, loss, start)
    sync()
    took = time.perf_counter() - start
    draft.eval()
    return TrainLog(tuple(losses.tolist()), took, steps, steps * batch * seq_len)


@torch.no_grad()
def heldout_kl(draft, teacher, tokens: torch.Tensor, *, seq_len: int, batch: int = 16,
               max_windows: int = 256, temperature: float = 1.0) -> float:
    """Mean KL(teacher || draft) per token (nats, times temperature^2 as in training)
    over the windows `train.heldout_loss` reads: non-overlapping, spread evenly over the
    stream. On the same windows, `mixed(heldout_kl, heldout_loss, mix=...)` is the
    held-out value of the objective `distill` trained with that mix."""
    check(draft, teacher, temperature=temperature, mix=0.0)
    full = (len(tokens) - 1) // seq_len
    if full < 1:
        raise ValueError(f"a stream of {len(tokens)} tokens has no full window of "
                         f"seq_len + 1 = {seq_len + 1} tokens; use a shorter seq_len")
    windows = min(full, max_windows)
    starts = torch.linspace(0, full - 1, windows).long()[:, None] * seq_len
    inputs = tokens[starts + torch.arange(seq_len)]
    device = next(draft.parameters()).device
    modes = [m.training for m in (draft, teacher)]
    draft.eval()
    teacher.eval()
    total = torch.zeros((), device=device)
    for first in range(0, windows, batch):
        x = inputs[first: first + batch].to(device, non_blocking=True)
        with _autocast(device):
            pair = [m(input_ids=x).logits for m in (draft, teacher)]
        total += kl(*pair, temperature=temperature, reduction="sum")
    draft.train(modes[0])
    teacher.train(modes[1])
    return total.item() / (windows * seq_len)
