"""Training a small Llama on a stream of token ids: next-token prediction, nothing more.

Chapter 6 needs a target and a draft model that agree often enough for speculative
decoding to pay, and random weights agree on nothing. So it trains both, minutes on one
GPU, on the corpus of `gpuinfer.model.corpus`. The recipe is the usual one for small language
models: random windows of the stream, AdamW, a linear warmup then a cosine decay of the
learning rate, gradients clipped, BF16 autocast on the GPU. The loss is the next token's
cross-entropy, or, given a trained teacher, the KL from the teacher's next-token
distribution (`gpuinfer.model.distill`): the same loop distils a draft from its target.

The same code trains the same model, bit for bit, on the same kind of GPU: a fixed number
of steps (a slower GPU takes longer, it does not learn less), the windows drawn from a
seeded CPU generator, and deterministic kernels while training (`deterministic`). The
model's initial weights are the caller's to seed (`configs.build_model` does).

The loop syncs with the host only where it prints: reading a loss with `.item()` waits
for the GPU to finish, and doing it every step would leave the GPU idle while Python
queues the next one.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpuinfer.env import sync
from gpuinfer.model import distill
from gpuinfer.model.corpus import decode


@dataclass(frozen=True)
class TrainLog:
    """What a training run did: its losses, its time and how much text it saw."""

    losses: tuple[float, ...]  # training loss of every step
    seconds: float  # wall time of the training, GPU work included
    steps: int
    tokens: int  # tokens seen: steps * batch * seq_len

    @property
    def final_loss(self) -> float:
        """The mean of the last 5 % of the losses: one step's loss is noisy."""
        last = self.losses[-max(1, self.steps // 20):]
        return sum(last) / len(last)


def _check_window(tokens: torch.Tensor, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise ValueError(f"a stream of {len(tokens)} tokens is shorter than one window "
                         f"of seq_len + 1 = {seq_len + 1}; use a shorter seq_len or "
                         "more text")


def batches(tokens: torch.Tensor, *, batch: int, seq_len: int,
            generator: torch.Generator) -> torch.Tensor:
    """`batch` random windows of the 1-D stream, (batch, seq_len + 1): the first seq_len
    tokens are the input, the last seq_len the targets. Start offsets are drawn with
    `generator` (a CPU generator), so a seed gives the same windows on any device."""
    _check_window(tokens, seq_len)
    starts = torch.randint(0, len(tokens) - seq_len, (batch, 1), generator=generator)
    return tokens[starts + torch.arange(seq_len + 1)]


def learning_rate(step: float, *, steps: int, lr: float, warmup: int) -> float:
    """The learning rate of `step` (0-based): a linear rise to `lr` over `warmup` steps,
    then a cosine decay to lr / 10 at the last step, and lr / 10 after it."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - 1 - warmup))
    floor = lr / 10
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# cuBLAS is deterministic on one stream; these workspace settings make it so on any number
# of streams, and PyTorch's deterministic mode refuses a matrix product without one.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
# The attention kernels whose backward PyTorch makes deterministic in deterministic mode
# (flash and memory-efficient: one split of the keys instead of atomic adds; the math one
# is plain products). cuDNN's attention is left out.
_DETERMINISTIC_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                       SDPBackend.MATH]


@contextlib.contextmanager
def deterministic(device: torch.device):
    """Deterministic kernels inside the block, the previous settings restored after it:
    PyTorch's deterministic algorithms (an op that has none raises, rather than train a
    different model), cuDNN's deterministic choice without benchmarking, and attention
    on the kernels above. On a GPU, CUBLAS_WORKSPACE_CONFIG must be unset or one of
    `CUBLAS_DETERMINISTIC`: unset, it is set to the first for this process (the book's
    chapters set it before CUDA starts; set later it still passes PyTorch's check, and
    training runs on one stream, where cuBLAS is deterministic with any workspace)."""
    if device.type == "cuda":
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        if config is not None and config not in CUBLAS_DETERMINISTIC:
            raise ValueError(f"CUBLAS_WORKSPACE_CONFIG={config!r} makes cuBLAS "
                             f"non-deterministic: set it to {CUBLAS_DETERMINISTIC[0]!r} "
                             "(or unset it) before the process starts, or train with "
                             "deterministic=False")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC[0])
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        with sdpa_kernel(_DETERMINISTIC_SDPA):
            yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


def _autocast(device: torch.device):
    """BF16 autocast on a GPU (matrix products in BF16, the weights stay FP32); on the
    CPU, plain FP32."""
    if device.type == "cuda":
        return torch.autocast("cuda", torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _evaluating(*models):
    """The models (None skipped) in eval mode inside the block, each one's mode restored
    after it."""
    modes = [(m, m.training) for m in models if m is not None]
    for m, _ in modes:
        m.eval()
    try:
        yield
    finally:
        for m, was_training in modes:
            m.train(was_training)


def _loss(model, window: torch.Tensor, *, teacher=None, mix: float = 0.0,
          temperature: float = 1.0, reduction: str = "mean") -> torch.Tensor:
    """The objective of predicting window[:, 1:] from window[:, :-1], in FP32: the
    cross-entropy of the text's next token, or with a teacher `distill.objective` (the
    KL from the teacher's next-token distribution, mixed with the text's by `mix`)."""
    logits = model(input_ids=window[:, :-1]).logits
    targets = window[:, 1:]
    if teacher is None or mix == 1:  # the text alone: no teacher pass to pay for
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                               reduction=reduction)
    # no_grad, not inference_mode: the KL's backward saves the teacher's probabilities,
    # and autograd refuses to save an inference tensor.
    with torch.no_grad():
        teacher_logits = teacher(input_ids=window[:, :-1]).logits
    return distill.objective(logits, teacher_logits, targets, mix=mix,
                             temperature=temperature, reduction=reduction)


def _optimizer(model, *, lr: float, weight_decay: float,
               device: torch.device) -> torch.optim.AdamW:
    """AdamW that decays the matrices (and embeddings) only: decaying a norm's gains
    pulls them towards zero, which no regularisation needs."""
    params = [p for p in model.parameters() if p.requires_grad]
    matrices = [p for p in params if p.dim() >= 2]
    vectors = [p for p in params if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": weight_decay},
              {"params": vectors, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95),
                             fused=device.type == "cuda")


def train(model, tokens: torch.Tensor, *, steps: int, batch: int, seq_len: int,
          lr: float = 1e-3, warmup: int | None = None, weight_decay: float = 0.1,
          seed: int = 0, log_every: int | None = None, name: str = "model",
          deterministic_kernels: bool = True, teacher=None, mix: float = 0.0,
          temperature: float = 1.0) -> TrainLog:
    """Train a `transformers` causal LM (e.g. LlamaForCausalLM) to predict the next
    token, `steps` steps of `batch` random windows of `seq_len` tokens from `tokens`,
    drawn with `seed`. With a `teacher` (a trained model of the same vocabulary), the
    loss is `distill.objective`: the KL from the teacher's next-token distribution at
    `temperature`, and `mix` x the text's cross-entropy beside it (the teacher is not
    changed, and runs in eval mode). With `deterministic_kernels` (`deterministic`), the
    same model, initial weights and arguments give the same trained weights, bit for
    bit, on the same kind of device. Prints the loss every `log_every` steps (default:
    ten lines) and at the end. Returns the losses; the model is left in eval mode."""
    if steps < 1:
        raise ValueError(f"steps={steps}: train for at least one step")
    distill.check(model, teacher, temperature=temperature, mix=mix)
    _check_window(tokens, seq_len)  # refused before the model changes
    warmup = max(1, steps // 20) if warmup is None else max(1, warmup)
    log_every = max(1, steps // 10) if log_every is None else max(1, log_every)
    device = next(model.parameters()).device
    kernels = (deterministic(device) if deterministic_kernels
               else contextlib.nullcontext())
    loss = functools.partial(_loss, teacher=teacher, mix=mix, temperature=temperature)
    with kernels, _evaluating(teacher):
        return _train(model, tokens, loss, steps=steps, batch=batch, seq_len=seq_len,
                      lr=lr, warmup=warmup, weight_decay=weight_decay, seed=seed,
                      log_every=log_every, name=name, device=device)


def _train(model, tokens, loss_of, *, steps, batch, seq_len, lr, warmup, weight_decay,
           seed, log_every, name, device) -> TrainLog:
    optimizer = _optimizer(model, lr=lr, weight_decay=weight_decay, device=device)
    generator = torch.Generator().manual_seed(seed)
    # Losses stay on the device until the end: storing one is a copy queued on the GPU,
    # not a wait for it.
    losses = torch.zeros(steps, device=device)
    model.train()
    sync()
    start = time.perf_counter()
    for step in range(steps):
        window = batches(tokens, batch=batch, seq_len=seq_len, generator=generator)
        if device.type == "cuda":
            window = window.pin_memory()  # lets the copy below overlap the GPU's work
        window = window.to(device, non_blocking=True)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps=steps, lr=lr, warmup=warmup)
        with _autocast(device):  # a teacher's pass too: as it ran when it trained
            loss = loss_of(model, window)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses[step] = loss.detach()
        if (step + 1) % log_every == 0:
            _progress(name, step + 1, steps, loss, start)
    if steps % log_every:
        _progress(name, steps, steps, loss, start)  # the last step
    sync()
    took = time.perf_counter() - start
    model.eval()
    return TrainLog(tuple(losses.tolist()), took, steps, steps * batch * seq_len)


def _progress(name: str, step: int, steps: int, loss: torch.Tensor, start: float) -> None:
    value = loss.item()  # the one place the loop waits for the GPU
    print(f"{name}: step {step:>5}/{steps}  loss {value:.3f}  "
          f"{time.perf_counter() - start:5.1f} s", flush=True)


@torch.no_grad()
def heldout_loss(model, tokens: torch.Tensor, *, seq_len: int, batch: int = 16,
                 max_windows: int = 256, teacher=None, mix: float = 0.0,
                 temperature: float = 1.0) -> float:
    """Mean next-token cross-entropy (nats per token) over `max_windows` non-overlapping
    windows spread evenly over the held-out stream (all of them if it has fewer): every
    token of a window is predicted once, from up to seq_len tokens before it. With a
    `teacher`, `mix` and `temperature`: the objective `train` distils with, on the same
    windows, so held-out and training values compare like with like."""
    distill.check(model, teacher, temperature=temperature, mix=mix)
    full = (len(tokens) - 1) // seq_len
    if full < 1:
        raise ValueError(f"a stream of {len(tokens)} tokens has no full window of "
                         f"seq_len + 1 = {seq_len + 1} tokens; use a shorter seq_len")
    windows = min(full, max_windows)
    starts = torch.linspace(0, full - 1, windows).long()[:, None] * seq_len
    spans = tokens[starts + torch.arange(seq_len + 1)]  # inputs, and one more target
    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    with _evaluating(model, teacher):
        for first in range(0, windows, batch):
            window = spans[first: first + batch].to(device, non_blocking=True)
            with _autocast(device):
                total += _loss(model, window, teacher=teacher, mix=mix,
                               temperature=temperature, reduction="sum")
    return total.item() / (windows * seq_len)


@torch.no_grad()
def greedy_text(model, tokenizer, prompt_ids: torch.Tensor, new_tokens: int) -> str:
    """The text of `new_tokens` greedily chosen tokens after the prompt (1, n), the
    prompt itself left out. End-of-text does not stop it: always `new_tokens` tokens."""
    device = next(model.parameters()).device
    prompt = prompt_ids.reshape(1, -1).to(device)
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return decode(tokenizer, out[0, prompt.shape[1]:])
