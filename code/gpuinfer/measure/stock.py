"""Stock `transformers` `generate()`, timed in a fresh Python process: the book's baseline.

Timed inside a chapter's own process, `generate()` measures what that process did before it:
with `cache_implementation="static"` it compiles the model's forward on its first decode
step, and what torch.compile holds by then (other variants' graphs, recompilations counted
against its limit, a recipe that swapped the forward) changes what runs. The same
generate(static) of the 1B shape measured 6.34 ms per token in one chapter, 3.34 in another
and 2.83 in a process of its own. A user meets `generate()` in a process of their own, so
`stock_fresh` times each variant that way: one `python -m gpuinfer.measure.stock` process
per variant, which builds the chapter's model (same config, seed, dtype and prompt), makes a
first generation (which compiles), `warmup` more, then `rounds` interleaved rounds of a
whole generation (t_N) and a one-token one (t_1, the prefill and the first token). The
decode time per token, (t_N - t_1) / (N - 1) round by round, leaves the prefill out.

A variant that raises (the docs' recipe can) is reported in its `StockRun.error`; a process
that fails otherwise (the model cannot be built, say) raises, its stderr passed through.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpuinfer.decode.loops import BASELINES
from gpuinfer.measure.timing import Comparison, Rounds, Timing

# The variants, by short name, with the labels the chapters' tables use.
VARIANTS = {
    "dynamic": list(BASELINES)[0],
    "static": list(BASELINES)[1],
    "docs": "generate(), static cache + the docs' torch.compile recipe",
}
# The docs' recipe raises past this many recompilations of a function, where by default
# dynamo would quietly run it uncompiled after 8: a recipe that keeps recompiling is then
# reported as such, and cannot eat the run's budget.
DOCS_RECOMPILE_LIMIT = 4
LOG_CHARS = 20_000  # the end of a process's stderr kept in its StockRun


@dataclass(frozen=True)
class StockRun:
    """One stock variant, timed in its own process. Times are milliseconds per round:
    `decode_ms` per decode token (prefill excluded), `prefill_ms` of a one-token generation,
    `whole_ms` of the whole generation (t_N). Empty where the variant failed (`error`)."""

    variant: str  # a key of VARIANTS
    decode_ms: tuple[float, ...] = ()
    prefill_ms: tuple[float, ...] = ()
    whole_ms: tuple[float, ...] = ()
    first_call_s: float | None = None  # the first generation, compile included (wall clock)
    peak_bytes: int | None = None  # peak GPU memory of that process, up to the first call
    compiled: bool = False  # its forward was compiled (by generate() itself, or the recipe)
    graphs_in_rounds: int = 0  # graphs torch.compile compiled during the timed rounds
    # graphs that mode "reduce-overhead" ran without capturing them into a CUDA graph
    # (Inductor skips the capture of a graph that mutates its inputs, a static cache say)
    cudagraph_skips: int = 0
    tokens: tuple[int, ...] = ()  # the first generation's new tokens (batch 1)
    error: str | None = None
    log: str = ""  # the end of the process's stderr (torch.compile's warnings, say)
    clock: str = "host"
    # where the process's time went (s): "process" (all of it, start and imports included),
    # "warm-up", "rounds"
    seconds: dict = dataclasses.field(default_factory=dict)

    @property
    def label(self) -> str:
        return VARIANTS[self.variant]

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def decode(self) -> Timing:
        return Timing(self.decode_ms, self.clock)

    def _stat(self, times: tuple[float, ...], how) -> float:
        return float(how(Timing(times, self.clock))) if times else math.nan

    # Decode time per token (ms) over the rounds, and the prefill's median (a one-token
    # generation: the prefill and the first token); NaN for a variant that failed.
    median = property(lambda self: self._stat(self.decode_ms, lambda t: t.median))
    low = property(lambda self: self._stat(self.decode_ms, lambda t: t.min))
    high = property(lambda self: self._stat(self.decode_ms, lambda t: t.max))
    prefill = property(lambda self: self._stat(self.prefill_ms, lambda t: t.median))

    def against(self, name: str, ours: Timing) -> Comparison:
        """`ours` (decode ms per token over a chapter's rounds) against this variant. Not
        timed in the same rounds, so the range is the widest the two spreads allow: this
        variant's fastest round over ours' slowest, to its slowest over ours' fastest."""
        if not self.ok:
            raise ValueError(f"{self.label} failed in its fresh process: {self.error}")
        separated = ours.max < self.low or self.high < ours.min
        return Comparison(name, self.label, self.median / ours.median, self.low / ours.max,
                          self.high / ours.min, separated, min(ours.repeats,
                                                               len(self.decode_ms)))


@dataclass(frozen=True)
class StockBaselines:
    """The stock variants of one workload, each timed in a fresh process."""

    runs: dict[str, StockRun]  # by short name ("static")
    config: str
    prompt_len: int
    new_tokens: int
    rounds: int

    def __getitem__(self, variant: str) -> StockRun:
        return self.runs[variant]

    def as_rounds(self) -> Rounds:
        """The decode times of the variants that ran, keyed by their labels, for
        `gpuinfer.report.results.from_rounds` (not one set of rounds: one process each, so
        never compare two of them with `Rounds.compare`)."""
        ran = {r.label: r.decode_ms for r in self.runs.values() if r.ok}
        clocks = {r.clock for r in self.runs.values() if r.ok}
        return Rounds(ran, clocks.pop() if len(clocks) == 1 else "host")

    def rebase(self, rows: list) -> list:
        """Result rows (`gpuinfer.report.results.Result`) with their × generate(static) over
        this static baseline: its median over the row's, the range from the two spreads;
        the rows of these stock runs marked `stock`."""
        static = self.runs.get("static")
        ours = {r.label for r in self.runs.values()}  # rows of the stock runs themselves
        if static is None or not static.ok:
            return [dataclasses.replace(r, x_generate_static=None,
                                        x_generate_static_range=None,
                                        stock=r.variant in ours) for r in rows]
        return [dataclasses.replace(r, x_generate_static=static.median / r.ms_per_token,
                                    x_generate_static_range=(static.low / r.ms_range[1],
                                                             static.high / r.ms_range[0]),
                                    stock=r.variant in ours)
                for r in rows]

    def glue_values(self) -> dict[str, float]:
        """`stock_<variant>_fresh_ms`, `_low`, `_high` (decode ms per token: median,
        fastest and slowest round), `_prefill_ms` and `_first_call_s` of every variant
        asked, as plain floats (NaN where the variant failed)."""
        values = {}
        for name, r in self.runs.items():
            key = f"stock_{name}_fresh"
            values.update({f"{key}_ms": r.median, f"{key}_low": r.low,
                           f"{key}_high": r.high, f"{key}_prefill_ms": r.prefill,
                           f"{key}_first_call_s": float(r.first_call_s or math.nan)})
        return values

    def sentence(self) -> str:
        """Each variant's decode time per token, in words."""
        parts = []
        for r in self.runs.values():
            if r.ok:
                parts.append(f"{r.label}: {r.median:.3g} ms per decode token "
                             f"({r.low:.3g}–{r.high:.3g} over {len(r.decode_ms)} rounds), "
                             f"prefill and first token {r.prefill:.3g} ms")
            else:
                parts.append(f"{r.label}: failed ({r.error})")
        return "; ".join(parts)


def stock_fresh(config_name: str, *, dtype: torch.dtype | str = torch.bfloat16,
                prompt_len: int, new_tokens: int,
                variants: tuple[str, ...] = ("dynamic", "static", "docs"), rounds: int = 5,
                warmup: int = 3, seed: int = 0, prompt_seed: int = 1,
                device: torch.device | str | None = None, attn_implementation: str = "sdpa",
                overrides: dict | None = None, timeout: float = 600) -> StockBaselines:
    """Time each of `variants` (keys of VARIANTS) in a fresh process of its own, on the
    model `build_model(model_config(config_name, **overrides), seed=seed, dtype=dtype)` and
    the prompt `random_prompt(config, prompt_len, seed=prompt_seed)`: a first generation,
    `warmup` more (each a whole and a one-token one: generate(static) compiles on its first
    decode step and may recompile once), then `rounds` interleaved rounds."""
    from gpuinfer.model.configs import CONFIGS

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown stock variant(s) {unknown}; choose from "
                         f"{list(VARIANTS)}")
    if config_name not in CONFIGS:
        raise ValueError(f"unknown model config {config_name!r}; one of "
                         f"{', '.join(CONFIGS)}")
    if new_tokens < 2 or rounds < 1 or warmup < 0:
        raise ValueError(f"need new_tokens >= 2 (a decode step to time), rounds >= 1 and "
                         f"warmup >= 0, got {new_tokens=} {rounds=} {warmup=}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args = {"config": config_name, "overrides": overrides or {},
            "dtype": str(dtype).removeprefix("torch."), "prompt_len": prompt_len,
            "new_tokens": new_tokens, "rounds": rounds, "warmup": warmup, "seed": seed,
            "prompt_seed": prompt_seed, "device": str(device),
            "attn_implementation": attn_implementation}
    runs = {v: _run_fresh({**args, "variant": v}, timeout) for v in variants}
    return StockBaselines(runs, config_name, prompt_len, new_tokens, rounds)


def _run_fresh(args: dict, timeout: float) -> StockRun:
    """One variant in `python -m gpuinfer.measure.stock ARGS`, its result read from a file
    (stdout is left to whatever the libraries print)."""
    variant = args["variant"]
    env = dict(os.environ)  # the package, also where it is not installed
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="gpuinfer-stock-") as folder:
        out = os.path.join(folder, "result.json")
        cmd = [sys.executable, "-m", "gpuinfer.measure.stock", json.dumps(args), out]
        rerun = f"run `python -m gpuinfer.measure.stock '{cmd[3]}'` to see the whole error"
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"stock variant {variant!r} did not finish in {timeout:.0f} "
                               f"s in its fresh process: fewer new_tokens or rounds, or a "
                               f"longer timeout; {rerun}") from None
        if proc.returncode != 0 or not os.path.exists(out):
            sys.stderr.write(proc.stderr)  # the whole story, where the chapter shows it
            last = next((line for line in reversed(proc.stderr.splitlines())
                         if line.strip()), "no output")
            raise RuntimeError(f"stock variant {variant!r} failed in its fresh process "
                               f"(exit {proc.returncode}): {last.strip()}; {rerun}")
        with open(out, encoding="utf8") as f:
            result = json.load(f)
    for key in ("decode_ms", "prefill_ms", "whole_ms", "tokens"):
        result[key] = tuple(result[key])
    result["seconds"] = {"process": time.perf_counter() - start, **result["seconds"]}
    return StockRun(**result, log=proc.stderr[-LOG_CHARS:])


# ------------------------------------------------------------------------------------------
# The fresh process
# ------------------------------------------------------------------------------------------


def _describe(err: BaseException) -> str:
    """`Type: first line of the message`, short enough for a table cell."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first.replace('`', chr(39)).replace('|', '/')[:240]}"


def _measure(args: dict) -> dict:
    """Build the model, run the variant, time it: a dict of StockRun's fields."""
    import warnings

    import transformers
    from torch._dynamo.utils import counters

    from gpuinfer.decode.loops import decode_generate, decode_generate_static
    from gpuinfer.measure.timing import interleaved_rounds, wall_seconds
    from gpuinfer.model.configs import build_model, model_config, random_prompt

    warnings.filterwarnings("ignore", message="IProgress not found")  # transformers' tqdm
    transformers.logging.set_verbosity_error()  # generate()'s advice to users
    variant, n = args["variant"], args["new_tokens"]
    device = torch.device(args["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but this process sees no CUDA device")
    if device.type == "cpu":
        torch.set_num_threads(1)  # a smoke run's tiny ops only lose to threads' syncs
    torch.set_float32_matmul_precision("highest")  # FP32 stays FP32, as in the chapters
    config = model_config(args["config"], **args["overrides"])
    model = build_model(config, seed=args["seed"], dtype=getattr(torch, args["dtype"]),
                        device=device, attn_implementation=args["attn_implementation"])
    prompt = random_prompt(config, args["prompt_len"], seed=args["prompt_seed"],
                           device=device)
    fn = decode_generate if variant == "dynamic" else decode_generate_static
    generate = functools.partial(fn, model)
    clock = "cuda-event" if device.type == "cuda" else "host"
    result = {"variant": variant, "clock": clock}
    try:
        if variant == "docs":  # the transformers docs' recipe ("Optimizing inference")
            model.forward = torch.compile(model.forward, mode="reduce-overhead",
                                          fullgraph=True)
        with torch._dynamo.config.patch(
                **({"recompile_limit": DOCS_RECOMPILE_LIMIT,
                    "fail_on_recompile_limit_hit": True} if variant == "docs" else {})):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            tokens, result["first_call_s"] = wall_seconds(lambda: generate(prompt, n))
            if device.type == "cuda":
                result["peak_bytes"] = torch.cuda.max_memory_allocated()
            result["tokens"] = tokens[0].tolist()
            start = time.perf_counter()
            for _ in range(args["warmup"]):
                generate(prompt, n)
                generate(prompt, 1)
            result["seconds"] = {"warm-up": time.perf_counter() - start}
            start = time.perf_counter()
            result["compiled"] = variant == "docs" or "_compiled_call" in vars(model)
            graphs = counters["stats"]["unique_graphs"]
            timed = interleaved_rounds({n: functools.partial(generate, prompt, n),
                                        1: functools.partial(generate, prompt, 1)},
                                       rounds=args["rounds"], warmup=0)
            result["graphs_in_rounds"] = counters["stats"]["unique_graphs"] - graphs
            result["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
            result["seconds"]["rounds"] = time.perf_counter() - start
    except Exception as err:  # noqa: BLE001 - a stock variant that fails is reported
        return {**result, "error": _describe(err)}  # with what it got to, its first call
    whole, first = timed.times_ms[n], timed.times_ms[1]
    result.update(whole_ms=list(whole), prefill_ms=list(first),
                  decode_ms=[(w - f) / (n - 1) for w, f in zip(whole, first)])
    return result


def main(argv: list[str]) -> None:
    """`python -m gpuinfer.measure.stock ARGS [OUT]`: the result as JSON, into the file OUT
    (where `stock_fresh` reads it), or without OUT onto stdout (to run one by hand)."""
    empty = {"decode_ms": [], "prefill_ms": [], "whole_ms": [], "tokens": [], "seconds": {}}
    result = {**empty, **_measure(json.loads(argv[0]))}
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf8") as f:
            json.dump(result, f)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
