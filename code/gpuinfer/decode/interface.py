"""What every decoder of the book is, how any decoder generates, what every decoder
refuses, and the one function that captures any decoder's step in a CUDA graph.

A decoder (`StaticDecoder`, `TritonDecoder`, `Speculative`) holds its whole state in
tensors allocated once: `tokens` (batch, capacity), the prompt and every token generated,
and `pos` (1,), the slot of the next input token. `prefill` resets that state to a new
prompt; `device_step` reads tokens[pos], writes its greedy choice after it and advances
pos, on the device, reading no host value (what is compiled and captured);
`decode_step` is that step called from Python, checked first; `step_logits` runs a
checked step on a given token (teacher forcing); `generate` runs a whole generation.

Checked calls refuse what would give a wrong answer or write outside a buffer, before
any kernel runs, and leave the decoder as it was: a prompt that is not integer token
ids in [0, vocab), an empty one, one that does not fit; a step past the capacity; a
model whose weights changed since the decoder was built (`WeightsSeen`: writes that
bypass PyTorch's version counter, `p.data` or an inference tensor's, are not seen; build
the decoder again after them). A step's position is counted on the host (`host_pos`:
set by `prefill`, None while a prefill writes, advanced by `decode_step`,
`step_logits` and each step `generate` queues), never read from the device. A captured
step's replay and `device_step` are unchecked: they run what they are given, at full
speed.

`graphed_step` captures a step. Capture runs the step a few times first (warm-up:
compilation, library workspaces, on a side stream), and each run writes a token, a
cache slot and the position. So the position and the tokens are saved before and put
back after: the decoder is in the same state after capture as before, whether a
prefill came first or not. The cache slots written past `pos` stay hidden by every decoder's attention
(which reads slots up to `pos` only) until a step overwrites them.
"""

from __future__ import annotations

import weakref
from typing import Callable, Protocol, runtime_checkable

import torch

from gpuinfer.measure.steps import decode_steps
from gpuinfer.measure.timing import capture_graph


@runtime_checkable
class Decoder(Protocol):
    """The interface every decoder implements (see the module's docstring)."""

    tokens: torch.Tensor
    pos: torch.Tensor
    capacity: int
    vocab: int  # token ids are in [0, vocab)
    host_pos: int | None  # pos as the checked calls left it; None before a prefill

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor: ...

    def device_step(self) -> object: ...

    def decode_step(self) -> object: ...

    def step_logits(self, token: torch.Tensor) -> torch.Tensor: ...

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor: ...


def check_capacity(config, capacity: int) -> None:
    """Refuse a capacity the model's positions do not cover, or too small for a step."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity={capacity!r}: a number of token slots, an int")
    most = config.max_position_embeddings
    if not 2 <= capacity <= most:
        raise ValueError(f"capacity={capacity}: the model covers 2 ... {most} positions "
                         "(its config's max_position_embeddings); build the decoder for "
                         "a prompt and generation within them")


def check_keys(what: str, given: dict | None, known) -> None:
    """Refuse a key of an options dict (`what`) that the decoder does not read: a
    misspelt one would be ignored. Names the valid ones."""
    unknown = sorted(set(given or ()) - set(known))
    if unknown:
        raise ValueError(f"{what} has {', '.join(map(repr, unknown))}: not a key it "
                         f"reads; the keys are {', '.join(known)}")


def check_ids(decoder: Decoder, ids, what: str = "prompt") -> None:
    """Refuse, before a kernel reads them, token ids that are not a non-empty (batch,
    length) integer tensor of ids in [0, vocab): an embedding read with an id outside
    it fails on a CPU and, on a GPU, leaves the process's CUDA context unusable.
    One host read (the smallest and largest id)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{what} of type {type(ids).__name__}: a tensor of token ids, "
                        "(batch, length) torch.long")
    if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise TypeError(f"{what} of dtype {ids.dtype}: token ids are integers; pass "
                        "torch.long ids, as a tokenizer returns them")
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"{what} of shape {tuple(ids.shape)}: (batch, length) token "
                         "ids, at least one token")
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= decoder.vocab:
        raise IndexError(f"{what} id {low if low < 0 else high} is outside the "
                         f"vocabulary [0, {decoder.vocab}): pass ids of this model's "
                         "tokenizer")


def check_prompt(decoder: Decoder, prompt_ids: torch.Tensor, new_tokens: int = 1,
                 extra: int = 0) -> None:
    """Refuse a prompt that is not token ids of the model (`check_ids`), of another
    batch, or one whose generation (plus `extra` slots a step may write past it) does
    not fit the decoder's capacity."""
    check_ids(decoder, prompt_ids)
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
        raise ValueError(f"new_tokens={new_tokens!r}: a number of tokens, an int >= 0")
    batch, length = prompt_ids.shape
    if batch != decoder.tokens.shape[0]:
        raise ValueError(f"a prompt of batch {batch} for a decoder of batch "
                         f"{decoder.tokens.shape[0]}: build the decoder for this batch")
    if length + new_tokens + extra > decoder.capacity:
        raise ValueError(f"a prompt of {length} + {new_tokens} new tokens"
                         + (f" + {extra} slots" if extra else "")
                         + f" exceed the decoder's capacity of {decoder.capacity} slots: "
                         "build it with a larger capacity (decode.static.capacity_for)")


def check_step(decoder: Decoder, writes: int = 1) -> int:
    """Refuse a step from Python whose writes reach `writes` slots past pos (a token
    at pos + 1: 1) at or beyond the capacity, by the host's count of pos (no device
    read); returns that count. The step's caller advances `host_pos` after it."""
    seen = getattr(decoder, "seen", None)  # a load_state_dict since the prefill
    if seen is not None:
        seen.check_reload()
    if decoder.host_pos is None:
        raise ValueError("no prompt yet: call prefill(prompt_ids) (or generate) before "
                         "stepping the decoder")
    last = decoder.host_pos + writes
    if last >= decoder.capacity:
        raise IndexError(f"a step at pos {decoder.host_pos} writes slot {last}, past the "
                         f"decoder's capacity of {decoder.capacity} slots: prefill a new "
                         "prompt, or build the decoder with a larger capacity")
    return decoder.host_pos


class WeightsSeen:
    """A model's weights as a decoder saw them when it was built, so that a decoder
    notices a change it would otherwise decode past (its stacked and quantized matrices
    are copies). Two checks: `check`, at every prefill, compares each tensor's identity,
    address and version counter (inference tensors have none): a replaced parameter,
    `.to(...)`, an in-place write; `check_reload`, at every checked step, reads one flag
    that a `load_state_dict` into the model (or any of its modules) sets through a hook,
    so that a load after the prefill is refused before the next step (a Python attribute
    read: nothing on the device). Writes that bypass the version counter
    (`p.data.mul_(...)`, any write to an inference tensor, e.g. of a model built inside
    `torch.inference_mode`) are not seen: after them, build the decoder again. The model
    is held weakly: a decoder does not keep it alive, and once it is gone nothing can
    change it."""

    def __init__(self, model: torch.nn.Module):
        self.model = weakref.ref(model)
        self.seen = self._now(model)
        self.reloaded = False  # set by the hooks below
        mark = MarkReloaded(self)
        hooks = [m.register_load_state_dict_post_hook(mark) for m in model.modules()]
        weakref.finalize(self, _remove_hooks, hooks)  # none left on the model after

    @staticmethod
    def _now(model: torch.nn.Module) -> dict[str, tuple]:
        def version(t):
            return None if t.is_inference() else t._version
        return {name: (id(t), t.data_ptr(), version(t))
                for name, t in model.state_dict(keep_vars=True).items()}

    def check_reload(self) -> None:
        """Raise if a load_state_dict reached the model since the decoder was built."""
        if self.reloaded:
            raise ValueError("the model's weights changed (a load_state_dict) since "
                             "this decoder was built: build a new decoder "
                             "(decode.runners.decoder_for does it for you)")

    def check(self) -> None:
        """Raise if any weight changed since the decoder was built."""
        self.check_reload()
        model = self.model()
        if model is None:
            return
        now = self._now(model)
        changed = [n for n in self.seen.keys() | now.keys() if self.seen.get(n) != now.get(n)]
        if changed:
            raise ValueError(f"the model's weights changed since this decoder was built "
                             f"({', '.join(sorted(changed)[:3])}"
                             f"{', ...' if len(changed) > 3 else ''}): build a new decoder "
                             "(decode.runners.decoder_for does it for you)")


class MarkReloaded:
    """The load_state_dict hook of `WeightsSeen`: sets its `reloaded`. It holds it
    weakly (a hook must not keep a decoder alive), and a model pickled with it (torch.
    save of a whole model) gets a hook that does nothing: no decoder saw the copy."""

    def __init__(self, seen: WeightsSeen | None):
        self.seen = None if seen is None else weakref.ref(seen)

    def __call__(self, module, incompatible_keys) -> None:
        seen = self.seen and self.seen()
        if seen is not None:
            seen.reloaded = True

    def __reduce__(self):
        return MarkReloaded, (None,)


def _remove_hooks(hooks) -> None:
    for hook in hooks:
        hook.remove()


def generate(decoder: Decoder, prompt_ids: torch.Tensor, new_tokens: int,
             step: Callable[[], object] | None = None) -> torch.Tensor:
    """`new_tokens` greedy tokens after the prompt, each after the first by one call of
    `step` (default: the decoder's `device_step`; the whole generation is checked to
    fit first): a new int64 CPU tensor (batch, new_tokens), the caller's own. The first
    comes from the prefill; the host reads the tokens once, at the end."""
    check_prompt(decoder, prompt_ids, new_tokens)
    if new_tokens == 0:
        return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
    step = step or decoder.device_step
    with torch.no_grad():
        decoder.prefill(prompt_ids.to(decoder.tokens.device))
        for _ in decode_steps(range(1, new_tokens)):  # marks each step for the profiler
            step()
            # Counted as each step is queued, not at the end: an exception (Ctrl-C) in
            # a later step leaves the host's count and the device's pos in step.
            decoder.host_pos += 1
    start = prompt_ids.shape[1]
    # A copy, never a view: on a CPU .cpu() would return the decoder's own buffer,
    # which the next generation overwrites. (The one host sync.)
    return decoder.tokens[:, start: start + new_tokens].to("cpu", copy=True)


def graphed_step(decoder: Decoder, step: Callable[[], object] | None = None, *,
                 warmup: int = 3, span: int = 1, first_slot: int = 0
                 ) -> Callable[[], None]:
    """`step` (default `decoder.device_step`) captured in a CUDA graph: its replay,
    unchecked (it runs whatever state it finds, as fast as the step can).

    The decoder's state is the same after capture as before (see the module's
    docstring). `span` is the number of slots one run of the step may write past pos
    (k + 1 for a speculative pass), `first_slot` the lowest pos a run may start from (a
    speculative pass also reads slot pos - 1): a decoder whose pos is lower starts the
    warm-up runs there. Raises if the runs would write past the cache.
    """
    step = step or decoder.device_step
    saved_pos, saved_tokens = decoder.pos.clone(), decoder.tokens.clone()
    start = max(int(saved_pos.item()), first_slot)
    if start + warmup * span >= decoder.capacity:  # the capture itself runs nothing
        raise ValueError(f"capturing the step runs it {warmup} times from slot {start}, "
                         f"past the cache's {decoder.capacity} slots: capture before the "
                         "prefill, or build the decoder with room for them")
    try:
        with torch.no_grad():
            decoder.pos.fill_(start)
            graph, _ = capture_graph(step, warmup=warmup)
    finally:
        decoder.pos.copy_(saved_pos)
        decoder.tokens.copy_(saved_tokens)
    decoder.__dict__.setdefault("_gpuinfer_graphs", []).append(graph)  # lives with it
    return graph.replay
