"""Chapter 5's measurements of single kernels, each beside what the library runs instead:

- `gemv_variants`: one matrix-vector product, ours (`gpuinfer.kernels.gemv`), cuBLAS
  (`F.linear`) or Inductor's (`F.linear` compiled with coordinate-descent tuning), each
  over copies of the matrix that together exceed the L2 cache, ready to be timed in
  interleaved rounds; with int8 weights, ours or Inductor's compilation of gpt-fast's
  int8 weight-only linear (`F.linear(x, q.to(x.dtype)) * scale`);
  `gemv_bandwidth` times one of them alone;
- `gemv_chain`: every matrix-vector product of a decode step, chained in one CUDA graph,
  ours (with or without programmatic dependent launch), cuBLAS's or Inductor's;
- `attention_us`: decode attention over a context, our split-KV kernel or
  `F.scaled_dot_product_attention`;
- `replays_from`: a decoder's captured step replayed back to back from a given slot of
  its cache, to be timed in interleaved rounds;
- `steps_trace`: the part of a profiler trace that a figure of a step's kernels needs.

All run from CUDA graphs, so that what is measured is the kernels, not their launches
from Python: a product as a replay of many calls over rotated copies, the chain as one
replay per call. Inductor's products are compiled once per matrix shape in a process, and
shared by every measurement that runs them.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gpuinfer.kernels.attention import AttentionWorkspace, decode_attention
from gpuinfer.kernels.common import Workspace, compile_ahead
from gpuinfer.kernels.gemv import GemvConfig, gemv
from gpuinfer.model.quant import Int8Matrix
from gpuinfer.kernels.tiling import PAIRED
from gpuinfer.model.llama import AS_STORED, WeightFormat
from gpuinfer.measure.timing import benchmark, benchmark_graph, fresh_inputs, graphed

IMPLS = ("ours", "cuBLAS", "Inductor")
RECOMPILE_LIMIT = 64  # matrix shapes Inductor's product may compile for, each its own
INDUCTOR_OPTIONS = {"coordinate_descent_tuning": True}  # gpt-fast's M = 1 reduction


def step_matrices(decoder) -> dict[str, tuple[int, int]]:
    """The shapes (rows, columns) of the matrix products of a step of `decoder`."""
    layer = decoder.layers[0]
    return {name: tuple(getattr(layer, name).shape) for name in ("qkv", "o", "gate_up",
                                                                 "down")} | {
        "lm_head": tuple(decoder.lm_head.shape)}


def dense_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear, as a Python function for torch.compile to trace."""
    return F.linear(x, w)


def weight_only_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor):
    """gpt-fast's WeightOnlyInt8Linear: the int8 matrix widened to x's dtype, the
    product scaled per row; compiled, Inductor fuses the widening into its reduction."""
    return F.linear(x, q.to(x.dtype)) * scale


_COMPILED: dict[tuple[str, int], Callable] = {}  # inductor_linear's, made once each


def _another(fn: Callable, compilation: int) -> Callable:
    """fn itself for compilation 0, else a copy of it with a code object of its own:
    torch.compile keeps what it compiled on the code object, so the copy compiles anew."""
    if compilation == 0:
        return fn
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{compilation}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


def inductor_linear(compilation: int = 0) -> Callable:
    """fn(x, w): x @ W^T by the kernels Inductor generates, compiled once per matrix
    shape (`dynamic=False`, as a decode step's shapes are fixed: otherwise the second
    shape would recompile for symbolic sizes, and every later shape would run that
    generic kernel), for a BF16 matrix or an Int8Matrix. Every fn of a process shares
    the compiled functions, so a shape compiled for one measurement (a product alone,
    with coordinate-descent tuning: seconds a shape) runs the same kernel in the next
    (the step's chain) without compiling it again. Another `compilation` number compiles
    functions of its own: under `runners.cold_compile` (no cache to reuse), Inductor
    tunes them anew, and may settle on other kernels."""
    for kind, fn in (("dense", dense_linear), ("int8", weight_only_int8)):
        if (kind, compilation) not in _COMPILED:
            _COMPILED[kind, compilation] = torch.compile(
                _another(fn, compilation), dynamic=False, options=INDUCTOR_OPTIONS)
    dense, int8 = _COMPILED["dense", compilation], _COMPILED["int8", compilation]

    def linear(x, w):
        # one compilation per shape: past the default limit (8) torch would fall back to
        # running eagerly, with a warning only
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            if isinstance(w, Int8Matrix):
                return int8(x, w.q, w.scale)
            return dense(x, w)
    return linear


def _product(impl: str, x: torch.Tensor, n: int, config: GemvConfig, pdl: bool):
    """fn(w) computing W @ x the way `impl` does, for matrices W of n rows."""
    if impl == "ours":
        out = torch.empty(n, device=x.device, dtype=x.dtype)
        ws = Workspace(x.device, 1 << 20, 1 << 16)

        config = config.fit(x.numel())

        def ours(w):
            return gemv(w, x, out, config=config, pdl=pdl, workspace=ws)

        return ours
    if impl == "cuBLAS":
        def library(w):
            if not isinstance(w, torch.Tensor):
                raise ValueError("cuBLAS has no int8 x BF16 product: for int8 weights "
                                 "compare impl='ours' with impl='Inductor'")
            return F.linear(x[None], w)
        return library
    if impl == "Inductor":
        linear = inductor_linear()
        return lambda w: linear(x[None], w)
    raise ValueError(f"impl={impl!r}: one of {IMPLS}")


def gemv_variants(n: int, k: int, impls=IMPLS, *, dtype=torch.bfloat16, device="cuda",
                  config: GemvConfig = GemvConfig(8, 2048, 1, 8), pdl: bool = False,
                  weights: WeightFormat = AS_STORED) -> tuple[dict, int]:
    """({impl: fn}, bytes): each fn runs the product of an (n, k) matrix with a vector,
    the way impl does, once over each of several copies of the matrix that together
    exceed the L2 cache (each product reads its matrix from memory), as one graph
    replay; bytes is what one call reads of the matrices. Time the fns together
    (`rounds.interleaved_rounds`). `weights` (e.g. INT8): the format the matrices
    are stored in, their bytes counted as stored (scales included)."""
    def matrix():
        w = torch.randn(n, k, device=device, dtype=dtype) * 0.02
        return (weights.apply(w),)

    first = matrix()
    stored = first[0].nbytes  # as stored: int8 values and their scales, if quantized
    weights = [first] + fresh_inputs(matrix, stored, max_sets=63)
    x = torch.randn(k, device=device, dtype=dtype)
    calls = max(len(weights), 8)
    fns = {}
    for impl in impls:
        fn = _product(impl, x, n, config, pdl)

        def calls_in_a_row(fn=fn):
            for i in range(calls):
                fn(*weights[i % len(weights)])

        calls_in_a_row()  # compiles (Inductor), outside the graph and the timing
        fns[impl] = graphed(calls_in_a_row, (weights, x))
    return fns, stored * calls


def gemv_bandwidth(n: int, k: int, impl: str, *, dtype=torch.bfloat16, device="cuda",
                   config: GemvConfig = GemvConfig(8, 2048, 1, 8), pdl: bool = False,
                   weights: WeightFormat = AS_STORED, repeats: int = 10) -> float:
    """Bytes of an (n, k) matrix per second of its product with a vector, by `impl`,
    timed alone (`gemv_variants`, one impl)."""
    fns, nbytes = gemv_variants(n, k, (impl,), dtype=dtype, device=device,
                                config=config, pdl=pdl, weights=weights)
    timing = benchmark(fns[impl], warmup=3, repeats=repeats)
    return nbytes / (timing.median / 1e3)


def row_tiling(configs: dict[str, GemvConfig], name: str) -> GemvConfig:
    """The tiling `configs` (a decoder's convention) gives matrix `name`, for a plain
    GEMV of that matrix: the decoder counts the rows of qkv and gate_up in pairs
    (`kernels.tiling.PAIRED`), a plain GEMV counts rows, so their block_n doubles."""
    c = configs[name]
    return dataclasses.replace(c, block_n=c.block_n * (2 if name in PAIRED else 1))


def gemv_chain(decoder, impl: str, *, pdl: bool = False,
               configs: dict[str, GemvConfig] | None = None,
               int8_widen: str = "bits", compilation: int = 0) -> Callable[[], None]:
    """All the matrix-vector products of one decode step of `decoder` (every layer's
    q/k/v, o, gate/up and down, and the lm_head, on its own weights), back to back: a
    call runs them once, on a GPU as one replay of the CUDA graph they were captured
    into. impl: "ours" (tiled by `configs`, in the decoder's convention, default the
    decoder's own), "cuBLAS" or "Inductor" (int8 weights: gpt-fast's weight-only
    linear). Each product reads a fixed input vector of its width: the chain measures
    the streaming of the weights and the hand-over between kernels, not the step's
    arithmetic. `int8_widen`: how ours widens int8 weights (`gemv.widen`); `compilation`:
    which of Inductor's compilations (`inductor_linear`). Time the variants together
    (`rounds.interleaved_rounds`)."""
    mats = [(name, getattr(layer, name)) for layer in decoder.layers
            for name in ("qkv", "o", "gate_up", "down")]
    mats.append(("lm_head", decoder.lm_head))
    dev, dt = decoder.device, decoder.dtype
    xs = {w.shape[1]: torch.randn(w.shape[1], device=dev, dtype=dt) for _, w in mats}
    if impl == "ours":
        outs = {w.shape[0]: torch.empty(w.shape[0], device=dev, dtype=dt)
                for _, w in mats}
        ws = Workspace(dev, 1 << 20, 1 << 16)
        configs = configs or decoder.configs
        k = {name: w.shape[1] for name, w in mats}
        tiles = {name: row_tiling(configs, name).fit(k[name]) for name in configs}

        def chain():
            for name, w in mats:
                gemv(w, xs[w.shape[1]], outs[w.shape[0]], config=tiles[name], pdl=pdl,
                     workspace=ws, int8_widen=int8_widen)
    elif impl == "cuBLAS":
        if decoder.quantized:
            raise ValueError("cuBLAS has no int8 x BF16 product: time impl='ours' or "
                             "impl='Inductor'")

        def chain():
            for _, w in mats:
                F.linear(xs[w.shape[1]][None], w)
    elif impl == "Inductor":
        linear = inductor_linear(compilation)

        def chain():
            for _, w in mats:
                linear(xs[w.shape[1]][None], w)

        chain()  # compiles, one shape at a time, outside the graph
    else:
        raise ValueError(f"impl={impl!r}: one of {IMPLS}")
    if impl == "ours":
        compile_ahead(chain)  # its kernels at once, in parallel (on a GPU)
    if dev.type != "cuda":
        return chain
    return graphed(chain, chain)  # the closure holds xs, outs and the workspace


def attention_us(kv_heads: int, group: int, head_dim: int, context: int, impl: str, *,
                 dtype=torch.bfloat16, device="cuda", n_split: int = 32,
                 block_s: int = 64, num_warps: int = 4) -> float:
    """Microseconds of one layer's decode attention, one query per head over `context`
    cached keys and values, by our split-KV kernel ("ours") or by
    F.scaled_dot_product_attention with grouped-query heads ("SDPA"), over caches that
    together exceed the L2 cache."""
    heads = kv_heads * group
    caches = fresh_inputs(lambda: tuple(torch.randn(kv_heads, context, head_dim,
                                                    device=device, dtype=dtype)
                                        for _ in range(2)),
                          2 * kv_heads * context * head_dim * dtype.itemsize,
                          max_sets=1024)
    q = torch.randn(heads * head_dim, device=device, dtype=dtype)
    if impl == "ours":
        pos = torch.tensor([context - 1], device=device)
        out = torch.empty_like(q)
        ws = AttentionWorkspace(device, kv_heads, group, head_dim, n_split)

        def fn(k, v):
            decode_attention(q, k, v, pos, out, n_split=n_split, block_s=block_s,
                             num_warps=num_warps, workspace=ws)
    elif impl == "SDPA":
        q4 = q.view(1, heads, 1, head_dim)

        def fn(k, v):
            F.scaled_dot_product_attention(q4, k[None], v[None], enable_gqa=True)
    else:
        raise ValueError(f"impl={impl!r}: ours or SDPA")
    if not torch.cuda.is_available():
        return benchmark(fn, inputs=caches, warmup=1, repeats=3).median * 1e3
    return benchmark_graph(fn, calls=max(len(caches), 8), inputs=caches).median * 1e3


def replays_from(decoder, slot: int, replays: int) -> Callable[[], None]:
    """fn(): `decoder`'s position set to `slot`, then `replays` steps of it (its captured
    graph's replays, on a GPU) back to back, each writing the next slot of the cache:
    every call starts from the same context. What the cache holds does not change a
    step's time. Time it in interleaved rounds with per_call=replays, for one step's
    time at a context of about `slot` (`rounds.interleaved_rounds`)."""
    if slot + replays >= decoder.capacity:
        raise ValueError(f"{replays} steps from slot {slot} pass the cache's "
                         f"{decoder.capacity} slots")
    step = decoder.step_function()

    def steps():
        decoder.pos.fill_(slot)
        for _ in range(replays):
            step()
    return steps


def steps_trace(trace: dict, steps: int = 3) -> dict:
    """The first `steps` decode steps of a profiler trace (`report.trace.step_work`), with
    only what drawing their GPU work needs (`report.traceplot.plot_step_kernels`): each
    step's range, the CUDA calls made in it, the GPU work they launched, every event's
    arguments cut to its correlation id. Tens of kilobytes, where the whole trace is
    hundreds: small enough to keep for a chapter's presentation cells."""
    from gpuinfer.measure.trace_events import Ranges
    from gpuinfer.report.trace import step_work

    work = step_work(trace)
    kept = work.steps[:steps]
    in_kept = Ranges(kept)
    api = [e for e in work.api if in_kept.holding(e)]
    launched = {e.correlation for e in api}
    gpu = [e for e in work.gpu if e.correlation in launched]

    def raw(e, args):
        return {"ph": "X", "cat": e.cat, "name": e.name, "ts": e.ts, "dur": e.dur,
                "pid": e.pid, "tid": e.tid, "args": args}

    return {"traceEvents": [raw(e, {}) for e in kept]
            + [raw(e, {"correlation": e.correlation}) for e in api + gpu]}
