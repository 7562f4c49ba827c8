"""Chapter 4's experiments: a 1B-shaped model decoded side by side with stock `generate()`,
and the decode step walked along the roofline by batch size.

- Ours: Chapter 3's `StaticDecoder` with the attention kernel `ATTENTION`, run in the modes
  `MODES`.
- Measured side by side: any generate function of ours, first called on its own
  (`first_call`: its compile time, tokens, peak memory, or the error that stopped it), then
  timed with the others in interleaved rounds (`rounds.decode_rounds`); stock `generate()`
  is timed in processes of its own (`stock_baselines`, on `gpuinfer.measure.stock`); a
  profile of a whole generation (`profile_generate`).
- The batch roofline: `batch_sweep` times one step per batch size (the arithmetic of the
  roofline is `gpuinfer.model.cost`'s), on a decoder already built, compiled and captured
  where one is given for that batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch._dynamo.utils import counters
from transformers import LlamaForCausalLM

from gpuinfer import roofline as rl
from gpuinfer.decode import runners
from gpuinfer.decode.static import StaticDecoder, capacity_for
from gpuinfer.measure import profiling
from gpuinfer.measure.steps import annotate
from gpuinfer.measure.timing import Timing, wall_seconds
from gpuinfer.model.configs import random_prompt
from gpuinfer.model.cost import ModelShape, step_cost
from gpuinfer.report.labels import mode_label

if TYPE_CHECKING:  # imported where it runs: it starts processes
    from gpuinfer.measure.stock import StockBaselines

# At this size, in BF16, the fused attention kernel was faster on the H200 than
# transformers' eager attention (two matmuls and a softmax, Chapter 3's choice for its FP32
# model).
ATTENTION = "sdpa"
# Chapter 3's ways of running the step, and the fastest of them compiled once for every
# batch size of the batch sweep.
MODES = (runners.EAGER, runners.EAGER_GRAPH, runners.COMPILED_GRAPH_PDL,
         runners.COMPILED_TREES)
SWEEP_MODE = dataclasses.replace(runners.COMPILED_GRAPH_PDL, dynamic=True)


# ------------------------------------------------------------------------------------------
# Generations measured side by side
# ------------------------------------------------------------------------------------------

# (prompt_ids, new_tokens) -> tokens
GenerateFn = Callable[[torch.Tensor, int], torch.Tensor]


def describe_error(err: BaseException) -> str:
    """`Type: first line of the message`, short enough for a table cell."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    first = first.replace("`", "'").replace("|", "/")
    return f"{type(err).__name__}: {first[:240]}"


@dataclass
class FirstCall:
    """A variant's first generation, which compiles, captures or allocates what it needs:
    its wall time, its tokens and the peak GPU memory, or the error that stopped it."""

    name: str
    seconds: float | None = None
    tokens: torch.Tensor | None = None  # (batch, new_tokens), int64 on the CPU
    peak_bytes: int | None = None  # weights, caches and workspaces live at the peak
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def first_call(name: str, generate: GenerateFn, prompt_ids: torch.Tensor, new_tokens: int,
               *, context: Callable[[], contextlib.AbstractContextManager]
               = contextlib.nullcontext) -> FirstCall:
    """Run a variant's first generation of `new_tokens`, inside `context`. Any exception is
    caught and kept as the variant's `error`: a variant that fails is shown, not hidden."""
    result = FirstCall(name)
    try:
        with context():
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            result.tokens, result.seconds = wall_seconds(
                lambda: generate(prompt_ids, new_tokens))
            if torch.cuda.is_available():
                result.peak_bytes = torch.cuda.max_memory_allocated()
    except Exception as err:  # noqa: BLE001 - reported in the chapter, not swallowed
        result.error = describe_error(err)
    return result


def stock_baselines(config_name: str, warmups: dict[str, int], **kwargs
                    ) -> StockBaselines:
    """`stock_fresh` for each variant of `warmups` (a key of
    `gpuinfer.measure.stock.STOCK_VARIANTS`), each with its own number of warm-up
    generations after the first call, in that order; the other arguments are
    stock_fresh's. generate() with its dynamic cache compiles nothing, so its first call
    leaves little to warm; with the static cache it compiles on its first decode step and
    may recompile once."""
    from gpuinfer.measure.stock import stock_fresh

    each = [stock_fresh(config_name, variants=(variant,), warmup=warmup, **kwargs)
            for variant, warmup in warmups.items()]
    return dataclasses.replace(each[0], runs={name: run for one in each
                                              for name, run in one.runs.items()})


def profile_generate(generate: GenerateFn, prompt_ids: torch.Tensor, new_tokens: int,
                     name: str = "generate") -> dict:
    """A trace of one generation, after a warm-up one, inside a range `name` that the
    analysis of `gpuinfer.report.trace` takes for one "step" (pass it as step_name)."""
    generate(prompt_ids, new_tokens)
    with profiling.session() as recorded, annotate(name):
        generate(prompt_ids, new_tokens)
    return recorded.trace


# ------------------------------------------------------------------------------------------
# The batch roofline
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPoint:
    """One decode step at one batch size, timed, with its first-principles cost."""

    batch: int
    step: Timing
    cost: rl.Workload
    compiled: int = 0  # graphs torch.compile compiled for this batch (0: reused, or eager)
    mode: str = ""  # the book's label of the mode the step ran in (report.labels)
    capacity: int = 0  # the slots of the decoder's cache, all read by the attention

    @property
    def step_ms(self) -> float:
        return self.step.median

    @property
    def tokens_per_s(self) -> float:
        return self.batch / (self.step.median / 1e3)

    @property
    def flops_per_s(self) -> float:
        return self.cost.flops / (self.step.median / 1e3)

    @property
    def bytes_per_s(self) -> float:
        return self.cost.bytes / (self.step.median / 1e3)


def batch_sweep(model: LlamaForCausalLM, batches: list[int], *, prompt_len: int,
                mode: runners.Mode, warmup: int = 3, repeats: int = 20, seed: int = 1,
                reuse: dict[int, tuple[StaticDecoder, runners.Mode]] | None = None
                ) -> tuple[list[BatchPoint], str]:
    """Time one decode step of `model` at every batch size, run `mode`.

    Each batch gets its own decoder with a cache of just the slots the timed steps need, a
    prefill of a seeded random prompt, `warmup` untimed steps and `repeats` timed ones (each
    step advances the position, so the context grows by one per step: the cost is taken at
    the mean context of the timed steps). A batch in `reuse` is timed instead on the
    decoder given for it (of that batch, with room for the steps), run in the mode given
    with it: one whose step is already compiled and captured costs no compilation again.
    Stops at the first batch that does not fit in memory, or that torch.compile would
    recompile past its limit (where by default it would quietly run the step uncompiled,
    timed as if compiled); returns the points and a note saying where it stopped, if it
    did.
    """
    shape, itemsize = ModelShape.of(model.config), model.lm_head.weight.element_size()
    dev = model.lm_head.weight.device
    capacity = capacity_for(prompt_len, warmup + repeats + 1)
    context = timed_context(prompt_len, warmup, repeats)
    points, note = [], ""
    reuse = reuse or {}
    for batch in batches:
        decoder, how = None, mode
        try:
            if batch in reuse:
                decoder, how = reuse[batch]
                if decoder.batch != batch:
                    raise ValueError(f"reuse[{batch}] is a decoder of batch {decoder.batch}")
            else:
                with torch.no_grad():  # a decoder of its own, freed after its batch
                    decoder = StaticDecoder(model, batch, capacity, attention=ATTENTION)
            prompt = random_prompt(model.config, prompt_len, batch=batch, seed=seed,
                                   device=dev)
            graphs = counters["stats"]["unique_graphs"]
            # past its recompile limit torch.compile raises, instead of running the step
            # uncompiled and timed as if compiled
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                timing = runners.step_timing(decoder, prompt, how, warmup=warmup,
                                             repeats=repeats)
            compiled = counters["stats"]["unique_graphs"] - graphs
            slots = decoder.capacity
        except torch.cuda.OutOfMemoryError:
            note = f"batch {batch} does not fit in memory: the sweep stops there"
            break
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            note = (f"batch {batch} would have been recompiled past torch.compile's limit "
                    f"of {torch._dynamo.config.recompile_limit}: the sweep stops there")
            break
        finally:
            del decoder  # this name only: a reused decoder lives on with its caller
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        cost = step_cost(shape, batch=batch, context=context, itemsize=itemsize)
        points.append(BatchPoint(batch, timing, cost, compiled, mode_label(how), slots))
    return points, note


def timed_context(prompt_len: int, warmup: int, repeats: int) -> float:
    """The mean context of the timed steps of `batch_sweep`: after the prefill, step i reads
    the token in slot prompt_len + i and attends to prompt_len + i + 1 slots."""
    return prompt_len + warmup + (repeats + 1) / 2


