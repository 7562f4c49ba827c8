"""Stock `transformers` `generate()`, timed in a fresh Python process: the book's baseline.

Timed inside a chapter's own process, `generate()` measures what that process did before it:
with `cache_implementation="static"` it compiles the model's forward on its first decode
step, and what torch.compile holds by then (other variants' graphs, recompilations counted
against its limit, a recipe that swapped the forward) changes what runs. The same
generate(static) of the 1B shape measured 6.34 ms per token in one chapter, 3.34 in another
and 2.83 in a process of its own. A user meets `generate()` in a process of their own, so
`stock_fresh` times each variant that way: one `python -m gpuinfer.measure.stock_process` process
per variant, which builds the chapter's model (same config, seed, dtype and prompt), makes a
first generation (which compiles), `warmup` more, then `rounds` interleaved rounds of a
whole generation (t_N) and a one-token one (t_1, the prefill and the first token). The
decode time per token, (t_N - t_1) / (N - 1) round by round, leaves the prefill out.

Each process starts with empty compile caches of its own (Inductor's, Triton's, and
dynamo's record of which dimensions it found dynamic, all on disk by default): otherwise a
"fresh" process compiles from what earlier ones left, and two of them may run different
code (first calls of 16 s and 5 s were seen for the same call). On a GPU it is capped at
what the chapter's process leaves of `gpuinfer.env.GPU_BUDGET_GIB`, so that the chapter with
its stock processes fits the card the book says it needs.

A workload is measured once, by the chapter that owns it, which saves it beside its
recording (`StockBaselines.save`); a later chapter showing the same workload reads that
figure (`gpuinfer.report.borrowed`) rather than measuring a second one: one process's
figure of a host-bound loop moves by ±10 % from one process to the next, so two pages
measuring the same call would disagree by that much.

A variant that raises (the docs' recipe can) is reported in its `StockRun.error`; a process
that fails otherwise (the model cannot be built, say) raises, its stderr passed through.
"""

from __future__ import annotations

import dataclasses
import gzip
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

from gpuinfer.measure.rounds import Comparison, Rounds, apart
from gpuinfer.measure.timing import Timing
from gpuinfer.model.stock_generate import STOCK_LABELS

# The variants, by short name, with the labels the chapters' tables use.
STOCK_VARIANTS = {
    **STOCK_LABELS,
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

    variant: str  # a key of STOCK_VARIANTS
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
        return STOCK_VARIANTS[self.variant]

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
        variant's fastest round over ours' slowest, to its slowest over ours' fastest
        (`gpuinfer.measure.rounds.apart`)."""
        if not self.ok:
            raise ValueError(f"{self.label} failed in its fresh process: {self.error}")
        return apart(name, ours, self.label, self.decode)


@dataclass(frozen=True)
class StockBaselines:
    """The stock variants of one workload, each timed in a fresh process."""

    runs: dict[str, StockRun]  # by short name ("static")
    config: str
    prompt_len: int
    new_tokens: int
    rounds: int
    dtype: str = ""  # "float32", "bfloat16"
    gpu: str | None = None  # the device's name, None on a CPU

    def workload(self) -> dict:
        """What identifies the measured workload: the call's arguments that change it."""
        return {"config": self.config, "dtype": self.dtype, "prompt_len": self.prompt_len,
                "new_tokens": self.new_tokens, "gpu": self.gpu}

    @property
    def file_name(self) -> str:
        return f"stock-{self.config}-{self.dtype}.json"

    def save(self, folder: str | os.PathLike) -> Path:
        """Write these runs as plain JSON into `folder` (a chapter's artifacts, kept with
        its recording), under `file_name`; the path written."""
        path = Path(folder) / self.file_name
        data = dataclasses.asdict(self)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf8")
        os.replace(tmp, path)  # whole or not at all
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StockBaselines":
        """The runs `save` wrote, plain or gzipped (a `.gz` file: the record command keeps a
        chapter's files so); ValueError naming the file if it is not such a file."""
        try:
            raw = Path(path).read_bytes()
            if Path(path).suffix == ".gz":
                raw = gzip.decompress(raw)
            data = json.loads(raw.decode("utf8"))
            runs = {}
            for name, run in data.pop("runs").items():
                for key in ("decode_ms", "prefill_ms", "whole_ms", "tokens"):
                    run[key] = tuple(run[key])
                runs[name] = StockRun(**run)
            return cls(runs, **data)
        except (OSError, EOFError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path} is not a saved stock measurement ({exc}): record "
                             f"the chapter that measures it again") from None

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
    """Time each of `variants` (keys of STOCK_VARIANTS) in a fresh process of its own, on the
    model `build_model(model_config(config_name, **overrides), seed=seed, dtype=dtype)` and
    the prompt `random_prompt(config, prompt_len, seed=prompt_seed)`: a first generation,
    `warmup` more (each a whole and a one-token one: generate(static) compiles on its first
    decode step and may recompile once), then `rounds` interleaved rounds."""
    from gpuinfer.model.configs import CONFIGS

    unknown = [v for v in variants if v not in STOCK_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown stock variant(s) {unknown}; choose from "
                         f"{list(STOCK_VARIANTS)}")
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
    runs = {}
    for v in variants:
        args["gpu_budget_gib"] = _budget_left(device)
        runs[v] = _run_fresh({**args, "variant": v}, timeout)
    return StockBaselines(runs, config_name, prompt_len, new_tokens, rounds,
                          dtype=args["dtype"],
                          gpu=torch.cuda.get_device_name(device)
                          if device.type == "cuda" else None)


def _budget_left(device: torch.device) -> float | None:
    """GiB of the GPU budget this process leaves to a stock process (None on a CPU): the
    budget less what the device has in use once this process's allocator gave back what
    it caches."""
    from gpuinfer.env import CONTEXT_GIB, GPU_BUDGET_GIB

    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    left = GPU_BUDGET_GIB - (total - free) / 2**30
    if left < CONTEXT_GIB + 1:
        raise RuntimeError(f"the chapter's process holds {(total - free) / 2**30:.1f} GiB "
                           f"of its {GPU_BUDGET_GIB:g} GiB budget, leaving {left:.1f} GiB "
                           f"for stock generate()'s process: free tensors (del, then "
                           f"torch.cuda.empty_cache()) before timing it")
    return left


def _run_fresh(args: dict, timeout: float) -> StockRun:
    """One variant in `python -m gpuinfer.measure.stock_process ARGS`, its result read
    from a file (stdout is left to whatever the libraries print)."""
    variant = args["variant"]
    env = dict(os.environ)  # the package, also where it is not installed
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="gpuinfer-stock-") as folder:
        out = os.path.join(folder, "result.json")
        # empty compile caches of its own (see the module's docstring)
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
        env["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
        cmd = [sys.executable, "-m", "gpuinfer.measure.stock_process", json.dumps(args),
               out]
        rerun = (f"run `python -m gpuinfer.measure.stock_process '{cmd[3]}'` to see the "
                 f"whole error")
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
