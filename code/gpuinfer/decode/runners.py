"""How a decode step is run: eagerly, compiled, captured in a CUDA graph, or both.

`gpuinfer.decode.static.StaticDecoder` defines one decode step with fixed shapes and
addresses; this module runs it. A way of running it is a `Mode` value: compiled by
`torch.compile` or not, with no graph, a graph captured by hand (`torch.cuda.CUDAGraph`), or
the cudagraph trees of `mode="reduce-overhead"`, with or without programmatic dependent
launch (PDL) and Inductor's coordinate-descent tuning. The book's modes are the constants
EAGER ... COMPILED_GRAPH_PDL (`MODES`; the book's short labels for them, V4 ... V9, live
in `gpuinfer.report.labels`). `runner(decoder, mode)` builds (once per decoder and mode)
the function that runs one step; `generate` runs a whole generation with it; `step_timing`
and `profile_steps` measure single steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import LlamaForCausalLM

from gpuinfer.decode import interface
from gpuinfer.decode.interface import Decoder, check_prompt, graphed_step
from gpuinfer.decode.static import StaticDecoder, capacity_for
from gpuinfer.measure import profiling
from gpuinfer.measure.timing import Timing, benchmark

NO_GRAPH, BY_HAND, TREES = "none", "by hand", "cudagraph trees"
GRAPHS = (NO_GRAPH, BY_HAND, TREES)


@dataclass(frozen=True)
class Mode:
    """One way of running a decode step. `name` says what it is ("compiled_graph"); every
    other field changes what runs, and an option that a mode could not honour is refused."""

    name: str
    compiled: bool = False
    graph: str = NO_GRAPH  # one of GRAPHS
    pdl: bool = False  # programmatic dependent launch for Inductor's kernels
    tune: bool = False  # Inductor's coordinate-descent tuning of its kernels' block sizes
    dynamic: bool = False  # one compilation for decoders of every batch size (shapes symbolic)

    def __post_init__(self):
        if self.graph not in GRAPHS:
            raise ValueError(f"graph={self.graph!r}: one of {GRAPHS}")
        needs_compile = [what for what, on in (("pdl", self.pdl), ("tune", self.tune),
                                               ("dynamic", self.dynamic),
                                               (f"graph={TREES!r}", self.graph == TREES))
                         if on]
        if needs_compile and not self.compiled:
            raise ValueError(f"{', '.join(needs_compile)} needs compiled=True: they are "
                             "options of torch.compile (Inductor), which an eager step has not")

    @property
    def words(self) -> str:
        """What the mode does, in words: "compiled with PDL, CUDA graph by hand"."""
        how = "compiled" + (" with PDL" if self.pdl else "") if self.compiled else "eager"
        extras = (", tuned" if self.tune else "") + (", dynamic shapes" if self.dynamic else "")
        graph = {NO_GRAPH: "", BY_HAND: ", CUDA graph by hand",
                 TREES: ", cudagraph trees (reduce-overhead)"}[self.graph]
        return f"{how}{extras}{graph}"

    def compile_options(self) -> dict:
        """The Inductor options the step is compiled with.

        triton.enable_pdl (off by default in Inductor) makes every Triton kernel it generates
        a Programmatic Dependent Launch: the kernel may be launched while the one before it
        is still running, and waits (`griddepcontrol.wait`) before it touches memory that
        kernel writes, so the launch overlaps the previous kernel's tail. It needs a Hopper or
        later GPU (elsewhere Inductor ignores it), and library kernels (cuBLAS, cuDNN)
        launch as before. triton.cudagraphs is what mode="reduce-overhead" turns on (spelled
        out, because torch.compile takes a mode or options, not both).
        """
        return {"coordinate_descent_tuning": self.tune, "triton.enable_pdl": self.pdl,
                "triton.cudagraphs": self.graph == TREES}


# The book's modes (its short labels for them, V4 ... V9: gpuinfer.report.labels)
EAGER = Mode("eager")  # the static step, one eager kernel launch per op
EAGER_GRAPH = Mode("eager_graph", graph=BY_HAND)  # EAGER's kernels captured, replayed
COMPILED = Mode("compiled", compiled=True)  # fused by Inductor, launched one by one
COMPILED_GRAPH = Mode("compiled_graph", compiled=True, graph=BY_HAND)  # captured by hand
COMPILED_TREES = Mode("compiled_trees", compiled=True, graph=TREES)  # "reduce-overhead"
COMPILED_GRAPH_PDL = Mode("compiled_graph_pdl", compiled=True, graph=BY_HAND, pdl=True)
MODES = (EAGER, EAGER_GRAPH, COMPILED, COMPILED_GRAPH, COMPILED_TREES,
         COMPILED_GRAPH_PDL)


# ---------------------------------------------------------------------------------------------
# Runners: built once per decoder and mode
# ---------------------------------------------------------------------------------------------

def _kept_on(owner, name: str) -> dict:
    """A cache dict held by `owner` itself, so that it dies with its owner. A
    WeakKeyDictionary keyed by the owner would keep it forever: its values (bound methods,
    graphs, decoders) hold the owner, so their key never goes."""
    return owner.__dict__.setdefault(name, {})


def runner(decoder: Decoder, mode: Mode) -> Callable[[], object]:
    """The function that runs one decode step of `decoder` the way `mode` says, built on
    first use (compiled, captured) and kept while the decoder lives. Any decoder of the
    book's interface runs uncompiled modes (a Triton decoder's step is its own kernels:
    there is nothing for torch.compile to fuse); compiled modes need a StaticDecoder."""
    if mode.compiled and not isinstance(decoder, StaticDecoder):
        raise ValueError(f"{mode.name} ({mode.words}): torch.compile runs a StaticDecoder's "
                         f"step; a {type(decoder).__name__} runs {EAGER.name} or "
                         f"{EAGER_GRAPH.name} (graphed)")
    built = _kept_on(decoder, "_gpuinfer_runners")
    key = dataclasses.astuple(dataclasses.replace(mode, name=""))
    if key not in built:
        with torch.no_grad():  # as every call will be: no recompilation for grad mode
            step = _compiled(decoder, mode, built) if mode.compiled else decoder.device_step
            if mode.graph == BY_HAND:
                step = graphed_step(decoder, step)  # the decoder's state kept as it was
            built[key] = step
    return built[key]


_shared: dict = {}  # compile options -> decode_step compiled for decoders of any batch


def compiled(fn, mode: Mode, dynamic: bool | None = False):
    """`fn` compiled whole (fullgraph) with `mode`'s Inductor options."""
    with warnings.catch_warnings():
        # Inductor says when it splits a long reduction (the softmax over the cache) and so
        # gives up its online softmax: a note on its choice of kernels, not a problem.
        warnings.filterwarnings("ignore", message="Online softmax is disabled")
        return torch.compile(fn, fullgraph=True, dynamic=dynamic,
                             options=mode.compile_options())


def _compiled(decoder: StaticDecoder, mode: Mode, built: dict):
    """device_step compiled with the mode's options; shared by the modes that differ only in
    a graph captured by hand around it (COMPILED_GRAPH captures COMPILED's step). A dynamic
    mode shares one compiled function between the decoders of every batch size."""
    key = ("compiled", *sorted(mode.compile_options().items()))
    if mode.dynamic:
        if key not in _shared:
            _shared[key] = compiled(lambda d: d.device_step(), mode, dynamic=True)
        return functools.partial(_shared[key], decoder)
    if key not in built:
        step = compiled(decoder.device_step, mode)
        if mode.graph == TREES:
            def trees_step():
                # Start a new cudagraph-trees generation: the previous step's outputs may
                # now be overwritten. We never read them: the tokens live in
                # decoder.tokens, our own tensor, not an output of the graph.
                torch.compiler.cudagraph_mark_step_begin()
                step()

            trees_step.compiled = step
            built[key] = trees_step
        else:
            built[key] = step
    return built[key]


def generate(decoder: Decoder, prompt_ids: torch.Tensor, new_tokens: int,
             mode: Mode = EAGER) -> torch.Tensor:
    """`new_tokens` greedy tokens after the prompt, each step run `mode`: an int64 CPU
    tensor (batch, new_tokens)."""
    check_prompt(decoder, prompt_ids, new_tokens)  # before anything is compiled
    if new_tokens == 0:
        return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
    return interface.generate(decoder, prompt_ids, new_tokens, runner_before_prefill(
        decoder, mode))


def runner_before_prefill(decoder: Decoder, mode: Mode) -> Callable[[], object]:
    """`runner(decoder, mode)` for a caller that prefills next: the position is reset
    first, so that building it (a capture runs the step) finds room in the cache
    whatever the last generation left; the state it holds is about to be replaced, and
    the host's count of it goes with it (`host_pos` None: no prompt, until the prefill),
    so that a build that raises leaves the two positions in step."""
    decoder.host_pos = None
    decoder.pos.zero_()
    return runner(decoder, mode)


def decoder_for(model: LlamaForCausalLM, batch: int, capacity: int, *,
                attention: str = "matmul", rebuild: bool = False) -> StaticDecoder:
    """The StaticDecoder of `model` for this batch, capacity and attention kernel, built on
    first use and kept while the model lives, with its graphs and compiled steps, as
    generate()'s static cache is; built anew when the model's weights changed (a
    replaced or moved parameter, an in-place write, a `load_state_dict`, before or after
    a prefill: `interface.WeightsSeen`), and with `rebuild` (after writes that bypass
    PyTorch's version counter, `p.data.mul_(...)`, which no check sees cheaply)."""
    per_model = _kept_on(model, "_gpuinfer_decoders")
    key = (batch, capacity, attention, model.dtype, model.device)  # .to(...): a new one
    if key in per_model:
        try:
            per_model[key].seen.check()
        except ValueError:  # load_state_dict, a replaced parameter: decode the new ones
            rebuild = True
        if rebuild:
            del per_model[key]
    if key not in per_model:
        # Ordinary tensors even if the caller is in inference mode: the state is written in
        # place by every later call, whatever mode that call runs in.
        with torch.inference_mode(False), torch.no_grad():
            per_model[key] = StaticDecoder(model, batch, capacity, attention=attention)
    return per_model[key]


def decode_fn(mode: Mode, *, attention: str = "matmul"):
    """The decode variant that runs each step `mode`, as fn(model, prompt_ids, new_tokens)
    like Chapter 2's loops, on the model's StaticDecoder (`decoder_for`) for that many
    tokens. Another length may need a decoder of another capacity, compiled and captured
    anew: to compare generations of different lengths (a one-token one against a whole
    one), run them on one decoder with `generate`."""

    def decode(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        capacity = capacity_for(prompt_ids.shape[1], new_tokens)
        decoder = decoder_for(model, prompt_ids.shape[0], capacity, attention=attention)
        return generate(decoder, prompt_ids, new_tokens, mode)

    decode.__name__ = decode.__qualname__ = f"decode_{mode.name}_{attention}"
    decode.mode = mode
    return decode


DECODE_FN_BY_MODE = {mode.name: decode_fn(mode) for mode in MODES}  # by Mode.name


@contextlib.contextmanager
def cold_compile():
    """Compile with Inductor's caches off (FX graphs, autotuning results) and with fresh,
    empty cache folders for Inductor and Triton (`fresh_cache`: force_disable_caches leaves
    Triton's cache of compiled kernels on, so a mode whose kernels another mode compiled
    would find them there), so that a compile time does not profit from what an earlier
    compilation left behind. The folders are kept: compiled code may still load from them.
    (Code already compiled in this process stays, and keeps running.)"""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import fresh_cache

    with inductor_config.patch(force_disable_caches=True), fresh_cache(delete=False):
        yield


def compiled_step_logits(decoder: StaticDecoder, mode: Mode):
    """decoder.step_logits compiled with `mode`'s options, for teacher forcing: the same
    fused kernels as the mode's step, with the logits returned. Unchecked (the
    compiled function is `device_step_logits`): the caller keeps to the capacity."""
    return compiled(decoder.device_step_logits, mode)


# ---------------------------------------------------------------------------------------------
# Single steps, timed and profiled
# ---------------------------------------------------------------------------------------------


def step_timing(decoder: StaticDecoder, prompt_ids: torch.Tensor, mode: Mode, *,
                warmup: int = 10, repeats: int = 100) -> Timing:
    """The time of one decode step run `mode`, from the state just after a prefill.

    Each timed call is one step (CUDA events around it); the steps run back to back, as
    in a generation, so a host slower than the GPU shows up as a longer step.
    """
    check_prompt(decoder, prompt_ids, 1 + warmup + repeats)
    step = runner_before_prefill(decoder, mode)
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        return benchmark(step, warmup=warmup, repeats=repeats)


def profile_steps(decoder: StaticDecoder, prompt_ids: torch.Tensor, mode: Mode,
                  path: str | None = None, *, steps: int = 20, warmup: int = 3,
                  head_start: bool = False) -> dict:
    """Profile `steps` decode steps run `mode` after a prefill and `warmup` untimed steps
    (`gpuinfer.measure.profiling.profile_steps`, which says what `head_start` does); return the
    Chrome trace, also written to `path` if given."""
    step = runner_before_prefill(decoder, mode)
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        for _ in range(warmup):
            step()
        trace = profiling.profile_steps(step, steps=steps, head_start=head_start)
    if path is not None:
        profiling.save_trace(trace, path)
    return trace
