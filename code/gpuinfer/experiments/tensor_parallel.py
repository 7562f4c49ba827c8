"""Chapter 7's experiments: each runs in N processes, one a GPU (or, in smoke mode and the
tests, N CPU processes over gloo), started from the chapter's cells by `launch`.

- `launch`, `attempt`: the processes, one process group, rank 0's result; and the timed
  rounds that every experiment shares (`timed_rounds`);
- `tokens_by_ranks`: the greedy tokens of one model split over each N, and unsplit;
- `step_sweep`: the decode step of one model unsplit and split over each N, with the
  collectives that the split step runs, all in the same interleaved rounds, so that the
  prediction (`StepSweep.predicted_us`) is made from numbers of the same run.

The all-reduce alone, by message size and method, is `experiments.collectives`.

Every timing is taken on every rank taking part and the *shortest* kept: the rank that
arrives last at a timed stretch waits for nobody at its start, so its time is the
stretch's own, where the others' also holds their wait for it.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig

from gpuinfer.decode import runners
from gpuinfer.decode.static import StaticDecoder
from gpuinfer.decode.tensor_parallel import (TensorParallelDecoder, all_gather_last,
                                             all_reduce, rank_bytes)
from gpuinfer.env import scratch_dir
from gpuinfer.experiments.scale import ATTENTION
from gpuinfer.measure.timing import graphed
from gpuinfer.measure.rounds import Rounds, time_call
from gpuinfer.model.configs import build_model, random_prompt

# Llama-3.1-8B's shape, as overrides of the 1B config (its vocabulary, rotary base and
# norm epsilon are the 1B model's): 8.03 B parameters, 16.1 GB in BF16, which one H200
# holds; an untied output projection.
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                tie_word_embeddings=False)


# ------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------

def launch(ranks: int, worker: Callable, *args, **kwargs):
    """`worker(*args, **kwargs)` in `ranks` new processes, in one process group (NCCL, one
    GPU a process; gloo on CPUs, without CUDA); returns rank 0's result. A worker that
    raises stops them all, and the error is raised here with its traceback."""
    gpus = torch.cuda.device_count()
    if gpus and ranks > gpus:
        raise ValueError(f"{ranks} processes need {ranks} GPUs, one each; this machine has "
                         f"{gpus}: ask for fewer")
    folder = scratch_dir("tp")
    result = os.path.join(folder, "result.pkl")
    mp.spawn(_run_rank, args=(ranks, os.path.join(folder, "rendezvous"), result, worker,
                              args, kwargs), nprocs=ranks, join=True)
    with open(result, "rb") as f:
        return pickle.load(f)


def attempt(ranks: int, worker: Callable, *args, **kwargs) -> tuple[object, str | None]:
    """`launch`'s result and None, or None and the error a rank stopped with, in one
    line (the last of its traceback): for a measurement that may not run on every
    machine, and whose failure is itself a result to report."""
    try:
        return launch(ranks, worker, *args, **kwargs), None
    except mp.ProcessRaisedException as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        return None, lines[-1] if lines else type(err).__name__


_host: dist.ProcessGroup | None = None  # all ranks, over gloo (set by _run_rank)


def _run_rank(rank: int, ranks: int, rendezvous: str, result: str, worker: Callable,
              args: tuple, kwargs: dict) -> None:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{rendezvous}",
                            rank=rank, world_size=ranks,
                            device_id=torch.device("cuda", rank) if cuda else None)
    global _host
    # The timed stretches are lined up by the host, over gloo: a barrier or a min over NCCL
    # would put work of its own on the GPUs between the stretches.
    _host = dist.new_group(backend="gloo")
    try:
        out = worker(*args, **kwargs)
        if rank == 0:
            with open(result, "wb") as f:
                pickle.dump(out, f)
    finally:
        dist.destroy_process_group()


def rank_device() -> torch.device:
    """This rank's device: the GPU it was given (`launch` sets it), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")


def _groups(sizes: list[int]) -> dict[int, dist.ProcessGroup | None]:
    """A process group of ranks 0 ... n - 1 for every n (None for n = 1: no split). Every
    rank must create every group, in the same order, member or not."""
    return {n: None if n == 1 else dist.new_group(list(range(n))) for n in sizes}


def _in_a_row(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    """`calls` runs of fn, back to back."""
    def in_a_row():
        for _ in range(calls):
            fn()
    return in_a_row


def replays(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    """`calls` runs of fn back to back: on a GPU one CUDA graph of them (captured here, on
    every member rank at once, since capture runs fn for its warm-up), else a loop. The
    replay keeps fn, and with it the buffers the graph reads: a symmetric-memory buffer
    released after the capture is unmapped, and the next replay stops on an illegal
    address."""
    in_a_row = _in_a_row(fn, calls)
    return graphed(in_a_row, keep=in_a_row)


def timed_rounds(calls: dict, members: dict, rounds: int, per_call: dict,
                  before: dict | None = None) -> Rounds:
    """Time every call of `calls` in `rounds` interleaved rounds (the order rotated by one
    each round, one untimed round first) on the ranks `members[key]` (a number n: ranks
    0 ... n - 1): each timed stretch starts after a barrier of all ranks, and keeps the
    shortest time of its members (see the module's docstring), divided by `per_call[key]`
    and in microseconds. `before[key]`, if given, runs before the barrier, untimed."""
    rank, keys = dist.get_rank(), list(calls)
    times: dict = {key: [] for key in keys}
    for r in range(rounds + 1):
        k = r % len(keys)
        for key in keys[k:] + keys[:k]:
            member = rank < members[key]
            if member and before and key in before:
                before[key]()
            dist.barrier(group=_host)
            ms = time_call(calls[key]) if member else float("inf")
            shortest = torch.tensor([ms], dtype=torch.float64)
            dist.all_reduce(shortest, op=dist.ReduceOp.MIN, group=_host)
            if r:  # round 0 warms up
                times[key].append(1e3 * float(shortest) / per_call[key])
    clock = "cuda-event" if torch.cuda.is_available() else "host"
    return Rounds({key: tuple(t) for key, t in times.items()}, clock)


# ------------------------------------------------------------------------------------------
# Decoding split over N
# ------------------------------------------------------------------------------------------

def _model(config: LlamaConfig, dtype: torch.dtype):
    """The seeded model on this rank's device, checked to be the same on every rank (the
    split assumes it: each rank keeps its slice of *its own* copy)."""
    model = build_model(config, seed=0, dtype=dtype, device=rank_device())
    mark = torch.stack([p.double().sum() for p in model.parameters()])
    marks = [torch.empty_like(mark) for _ in range(dist.get_world_size())]
    dist.all_gather(marks, mark)
    if not all(torch.equal(m, mark) for m in marks):
        raise RuntimeError("the ranks drew different weights from one seed: build the "
                           "model on one rank and broadcast it")
    return model


def _decoder(model, n: int, group, capacity: int):
    """The unsplit StaticDecoder for n = 1, else this rank's TensorParallelDecoder."""
    if n == 1:
        return StaticDecoder(model, 1, capacity, attention=ATTENTION)
    return TensorParallelDecoder(model, 1, capacity, group, attention=ATTENTION)


def step_mode() -> runners.Mode:
    """How each rank runs its step: Chapter 3's fastest, COMPILED_GRAPH_PDL (compiled with
    PDL, captured by hand) on a GPU; eager on a CPU, where the tests and smoke mode run it."""
    return runners.COMPILED_GRAPH_PDL if torch.cuda.is_available() else runners.EAGER


def tokens_by_ranks(config: LlamaConfig, sizes: list[int], *, prompt_len: int,
                    new_tokens: int, dtype: torch.dtype = torch.float32) -> dict[int, list]:
    """A worker for `launch`: the greedy tokens of the model split over each n of `sizes`
    (1: unsplit), each step run `step_mode()`, as lists by n."""
    model = _model(config, dtype)
    prompt = random_prompt(config, prompt_len, device=rank_device())
    capacity = prompt_len + new_tokens + 8  # room for the capture's warm-up steps
    tokens = {}
    for n, group in _groups(sizes).items():
        if dist.get_rank() < n:
            decoder = _decoder(model, n, group, capacity)
            generated = runners.generate(decoder, prompt, new_tokens, step_mode())
            tokens[n] = generated[0].tolist()
            del decoder  # its weights and graphs, before the next split's
        dist.barrier(group=_host)
    return tokens


@dataclass(frozen=True)
class StepSweep:
    """One model's decode step unsplit (n = 1) and split over n ranks, with the collectives
    of a split step, all timed in the same rounds, in µs: `rounds` keys are ("step", n),
    ("all-reduce", n) (one hidden vector) and ("all-gather", n) (the logits)."""

    sizes: tuple[int, ...]
    layers: int
    rank_bytes: dict[int, int]  # the matrices one rank's step streams, by n
    rounds: Rounds

    def step_us(self, n: int) -> float:
        return self.rounds[("step", n)].median

    def speedup(self, n: int):
        """The split step against the unsplit one, round by round (`Comparison`)."""
        return self.rounds.compare(("step", n), ("step", 1))

    def predicted_us(self, n: int) -> float:
        """The unsplit step scaled by the bytes a rank streams, plus the split
        step's collectives at their measured latency: two all-reduces a layer, one
        all-gather."""
        if n == 1:
            return self.step_us(1)
        streamed = self.step_us(1) * self.rank_bytes[n] / self.rank_bytes[1]
        return (streamed + 2 * self.layers * self.rounds[("all-reduce", n)].median
                + self.rounds[("all-gather", n)].median)


def step_sweep(config: LlamaConfig, sizes: list[int], *, prompt_len: int, steps: int,
               rounds: int, calls: int = 100,
               dtype: torch.dtype = torch.bfloat16) -> StepSweep:
    """A worker for `launch`: the decode step at context `prompt_len`, unsplit and split
    over each n of `sizes` (each rank runs its step `step_mode()`), and the all-reduce and
    all-gather that a split step runs, in interleaved rounds; each timed stretch is
    `steps` steps from the same slot (or `calls` collectives)."""
    if 1 not in sizes:
        raise ValueError("the sweep compares with the unsplit step: include 1 in sizes")
    model = _model(config, dtype)
    prompt = random_prompt(config, prompt_len, device=rank_device())
    capacity = prompt_len + steps + 8
    calls_by_key, members, per_call, before, matrix_bytes = {}, {}, {}, {}, {}
    for n, group in _groups(sizes).items():
        if dist.get_rank() < n:
            decoder = _decoder(model, n, group, capacity)
            step = runners.runner_before_prefill(decoder, step_mode())
            with torch.no_grad():
                decoder.prefill(prompt)
            matrix_bytes[n] = rank_bytes(decoder.weights)
            before[("step", n)] = lambda d=decoder: d.pos.fill_(prompt_len)
            calls_by_key[("step", n)] = _in_a_row(step, steps)  # each a graph replay
            if n > 1:
                hidden = torch.zeros(1, config.hidden_size, dtype=dtype, device=rank_device())
                logits = torch.zeros(1, config.vocab_size // n, dtype=dtype,
                                     device=rank_device())
                calls_by_key[("all-reduce", n)] = replays(
                    lambda g=group, x=hidden: all_reduce(x, g), calls)
                calls_by_key[("all-gather", n)] = replays(
                    lambda g=group, x=logits: all_gather_last(x, g), calls)
        dist.barrier(group=_host)
    keys = [(what, n) for n in sizes for what in ("step", "all-reduce", "all-gather")
            if what == "step" or n > 1]
    for key in keys:
        members[key] = key[1]
        per_call[key] = steps if key[0] == "step" else calls
        calls_by_key.setdefault(key, None)  # on ranks outside the group: never called
    timed = timed_rounds({key: calls_by_key[key] for key in keys}, members, rounds,
                          per_call, before)
    # Complete on rank 0, the one whose result `launch` returns: it is in every group.
    return StepSweep(tuple(sizes), config.num_hidden_layers, matrix_bytes, timed)
