"""How a decode step is run: eagerly, compiled, captured in a CUDA graph, or both.

`gpuinfer.decode.static.StaticDecoder` defines one decode step with fixed shapes and
addresses; this module runs it. A way of running it is a `Mode` value: compiled by
`torch.compile` or not, with no graph, a graph captured by hand (`torch.cuda.CUDAGraph`), or
the cudagraph trees of `mode="reduce-overhead"`, with or without programmatic dependent
launch (PDL) and Inductor's coordinate-descent tuning. The book's modes are the constants
V4 ... V9. `runner(decoder, mode)` builds (once per decoder and mode) the function that runs
one step; `generate` runs a whole generation with it; `step_timing` and `profile_steps`
measure single steps.
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

from gpuinfer.decode.static import StaticDecoder, capacity_for
from gpuinfer.measure import profiling
from gpuinfer.measure.steps import decode_steps
from gpuinfer.measure.timing import Timing, benchmark, capture_graph

NO_GRAPH, BY_HAND, TREES = "none", "by hand", "cudagraph trees"
GRAPHS = (NO_GRAPH, BY_HAND, TREES)


@dataclass(frozen=True)
class Mode:
    """One way of running a decode step. `name` is the book's short name (V7); every other
    field changes what runs, and an option that a mode could not honour is refused."""

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
    def label(self) -> str:
        """What the mode is, in words: "V9: compiled with PDL, CUDA graph by hand"."""
        how = "compiled" + (" with PDL" if self.pdl else "") if self.compiled else "eager"
        extras = (", tuned" if self.tune else "") + (", dynamic shapes" if self.dynamic else "")
        graph = {NO_GRAPH: "", BY_HAND: ", CUDA graph by hand",
                 TREES: ", cudagraph trees (reduce-overhead)"}[self.graph]
        return f"{self.name}: {how}{extras}{graph}"

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


V4 = Mode("V4")  # the static step, one eager kernel launch per op
V5 = Mode("V5", graph=BY_HAND)  # the eager step's kernels captured by hand, replayed
V6 = Mode("V6", compiled=True)  # fused by Inductor, launched kernel by kernel
V7 = Mode("V7", compiled=True, graph=BY_HAND)  # V6 captured by hand
V8 = Mode("V8", compiled=True, graph=TREES)  # torch.compile mode="reduce-overhead"
V9 = Mode("V9", compiled=True, graph=BY_HAND, pdl=True)  # V7 with PDL
MODES = (V4, V5, V6, V7, V8, V9)


# ---------------------------------------------------------------------------------------------
# Runners: built once per decoder and mode
# ---------------------------------------------------------------------------------------------

def _kept_on(owner, name: str) -> dict:
    """A cache dict held by `owner` itself, so that it dies with its owner. A
    WeakKeyDictionary keyed by the owner would keep it forever: its values (bound methods,
    graphs, decoders) hold the owner, so their key never goes."""
    return owner.__dict__.setdefault(name, {})


def runner(decoder: StaticDecoder, mode: Mode) -> Callable[[], object]:
    """The function that runs one decode step of `decoder` the way `mode` says, built on
    first use (compiled, captured) and kept while the decoder lives."""
    built = _kept_on(decoder, "_gpuinfer_runners")
    key = dataclasses.astuple(dataclasses.replace(mode, name=""))
    if key not in built:
        with torch.no_grad():  # as every call will be: no recompilation for grad mode
            # Capture and compilation run decode_step a few times: start them from slot 0,
            # so that they stay inside the cache whatever state the last generation left.
            decoder.pos.zero_()
            step = _compiled(decoder, mode, built) if mode.compiled else decoder.decode_step
            if mode.graph == BY_HAND:
                step = capture_graph(step, warmup=3)[0].replay
            built[key] = step
    return built[key]


_shared: dict = {}  # compile options -> decode_step compiled for decoders of any batch


def _compile(fn, options: dict, dynamic: bool | None = None):
    with warnings.catch_warnings():
        # Inductor says when it splits a long reduction (the softmax over the cache) and so
        # gives up its online softmax: a note on its choice of kernels, not a problem.
        warnings.filterwarnings("ignore", message="Online softmax is disabled")
        return torch.compile(fn, fullgraph=True, dynamic=dynamic, options=options)


def _compiled(decoder: StaticDecoder, mode: Mode, built: dict):
    """decode_step compiled with the mode's options; shared by the modes that differ only in
    a graph captured by hand around it (V7 captures V6's compiled step). A dynamic mode
    shares one compiled function between the decoders of every batch size."""
    options = mode.compile_options()
    key = ("compiled", *sorted(options.items()))
    if mode.dynamic:
        if key not in _shared:
            _shared[key] = _compile(lambda d: d.decode_step(), options, dynamic=True)
        return functools.partial(_shared[key], decoder)
    if key not in built:
        compiled = _compile(decoder.decode_step, options)
        if mode.graph == TREES:
            def step():
                # Start a new cudagraph-trees generation: the previous step's outputs may
                # now be overwritten. We never read them: the tokens live in
                # decoder.tokens, our own tensor, not an output of the graph.
                torch.compiler.cudagraph_mark_step_begin()
                compiled()

            step.compiled = compiled
            built[key] = step
        else:
            built[key] = compiled
    return built[key]


def generate(decoder: StaticDecoder, prompt_ids: torch.Tensor, new_tokens: int,
             mode: Mode = V4) -> torch.Tensor:
    """`new_tokens` greedy tokens after the prompt, each step run `mode`: an int64 CPU
    tensor (batch, new_tokens)."""
    if new_tokens < 1:
        return torch.empty((prompt_ids.shape[0], 0), dtype=torch.int64)
    if prompt_ids.shape[1] + new_tokens > decoder.capacity:
        raise ValueError(f"{prompt_ids.shape[1]} + {new_tokens} tokens exceed "
                         f"the decoder's capacity of {decoder.capacity}")
    step = runner(decoder, mode)  # capture or compile first: they run decode_step
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        for _ in decode_steps(range(1, new_tokens)):  # marks each step for the profiler
            step()
    start = prompt_ids.shape[1]
    return decoder.tokens[:, start: start + new_tokens].cpu()  # the one host sync


def decoder_for(model: LlamaForCausalLM, batch: int, capacity: int, *,
                attention: str = "matmul") -> StaticDecoder:
    """The StaticDecoder of `model` for this batch, capacity and attention kernel, built on
    first use and kept while the model lives, with its graphs and compiled steps, as
    generate()'s static cache is."""
    per_model = _kept_on(model, "_gpuinfer_decoders")
    key = (batch, capacity, attention, model.dtype)  # model.to(...) wants a new decoder
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


VARIANTS = {mode.label: decode_fn(mode) for mode in MODES}  # Chapter 3's, by label


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
    fused kernels as the mode's decode_step, with the logits returned."""
    return _compile(decoder.step_logits, mode.compile_options())


# ---------------------------------------------------------------------------------------------
# Single steps, timed and profiled
# ---------------------------------------------------------------------------------------------


def step_timing(decoder: StaticDecoder, prompt_ids: torch.Tensor, mode: Mode, *,
                warmup: int = 10, repeats: int = 100) -> Timing:
    """The time of one decode step run `mode`, from the state just after a prefill.

    Each timed call is one step (CUDA events around it); the steps run back to back, as
    in a generation, so a host slower than the GPU shows up as a longer step.
    """
    if prompt_ids.shape[1] + 1 + warmup + repeats > decoder.capacity:
        raise ValueError(f"{warmup} + {repeats} timed steps after a prompt of "
                         f"{prompt_ids.shape[1]} would run past the cache's "
                         f"{decoder.capacity} slots")
    step = runner(decoder, mode)
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        return benchmark(step, warmup=warmup, repeats=repeats)


def profile_steps(decoder: StaticDecoder, prompt_ids: torch.Tensor, mode: Mode,
                  path: str | None = None, *, steps: int = 20, warmup: int = 3,
                  head_start: bool = False) -> dict:
    """Profile `steps` decode steps run `mode` after a prefill and `warmup` untimed steps
    (`gpuinfer.measure.profiling.profile_steps`, which says what `head_start` does); return the
    Chrome trace, also written to `path` if given."""
    step = runner(decoder, mode)
    with torch.no_grad():
        decoder.prefill(prompt_ids)
        for _ in range(warmup):
            step()
        trace = profiling.profile_steps(step, steps=steps, head_start=head_start)
    if path is not None:
        profiling.save_trace(trace, path)
    return trace
