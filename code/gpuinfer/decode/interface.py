"""What every decoder of the book is, how any decoder generates, and the one function
that captures any decoder's step in a CUDA graph.

A decoder (`StaticDecoder`, `TritonDecoder`, `Speculative`) holds its whole state in
tensors allocated once: `tokens` (batch, capacity), the prompt and every token generated,
and `pos` (1,), the slot of the next input token. `prefill` resets that state to a new
prompt; `decode_step` reads tokens[pos], writes its greedy choice after it and advances
pos, on the device, reading no host value; `step_logits` runs a step on a given token
(teacher forcing); `generate` runs a whole generation.

`graphed_step` captures a step. Capture runs the step a few times first (warm-up:
compilation, library workspaces, on a side stream), and each run writes a token, a
cache slot and the position. So the position and the tokens are saved before and put
back after: the decoder is in the same state after capture as before, whether a
prefill came first or not. The cache slots written past `pos` stay hidden by every decoder's attention
(which reads slots up to `pos` only) until a step overwrites them.
"""

from __future__ import annotations

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

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor: ...

    def decode_step(self) -> object: ...

    def step_logits(self, token: torch.Tensor) -> torch.Tensor: ...

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor: ...


def check_prompt(decoder: Decoder, prompt_ids: torch.Tensor, new_tokens: int = 1,
                 extra: int = 0) -> None:
    """Refuse a prompt of another batch, or one whose generation (plus `extra` slots a
    step may write past it) does not fit the decoder's capacity."""
    batch, length = prompt_ids.shape
    if batch != decoder.tokens.shape[0]:
        raise ValueError(f"a prompt of batch {batch} for a decoder of batch "
                         f"{decoder.tokens.shape[0]}: build the decoder for this batch")
    if length + new_tokens + extra > decoder.capacity:
        raise ValueError(f"a prompt of {length} + {new_tokens} new tokens"
                         + (f" + {extra} slots" if extra else "")
                         + f" exceed the decoder's capacity of {decoder.capacity} slots: "
                         "build it with a larger capacity (decode.static.capacity_for)")


def generate(decoder: Decoder, prompt_ids: torch.Tensor, new_tokens: int,
             step: Callable[[], object] | None = None) -> torch.Tensor:
    """`new_tokens` greedy tokens after the prompt, each after the first by one call of
    `step` (default: the decoder's eager `decode_step`): int64 CPU (batch, new_tokens).
    The first comes from the prefill; the host reads the tokens once, at the end."""
    if new_tokens < 1:
        return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
    check_prompt(decoder, prompt_ids, new_tokens)
    step = step or decoder.decode_step
    with torch.no_grad():
        decoder.prefill(prompt_ids.to(decoder.tokens.device))
        for _ in decode_steps(range(1, new_tokens)):  # marks each step for the profiler
            step()
    start = prompt_ids.shape[1]
    return decoder.tokens[:, start: start + new_tokens].cpu()  # the one host sync


def graphed_step(decoder: Decoder, step: Callable[[], object] | None = None, *,
                 warmup: int = 3, span: int = 1, first_slot: int = 0
                 ) -> Callable[[], None]:
    """`step` (default `decoder.decode_step`) captured in a CUDA graph: its replay.

    The decoder's state is the same after capture as before (see the module's
    docstring). `span` is the number of slots one run of the step may write past pos
    (k + 1 for a speculative pass), `first_slot` the lowest pos a run may start from (a
    speculative pass also reads slot pos - 1): a decoder whose pos is lower starts the
    warm-up runs there. Raises if the runs would write past the cache.
    """
    step = step or decoder.decode_step
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
