"""One row per decode variant: the end-to-end table of a chapter, and the book's results
page.

A chapter times its variants in interleaved rounds
(`gpuinfer.measure.rounds.interleaved_rounds`), turns the rounds into rows (`from_rounds`:
ms per token, speed-ups over its naive loop and over stock `generate()`, each with its
range over the rounds), shows them (`markdown`) and glues `dumps(rows)` under the name
`GLUE_NAME`. The results page
(`gpuinfer.publish.sphinx_results`) reads them back from the chapter's recording with
`loads`, so that the table there is the recording's numbers, never typed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from gpuinfer.measure.rounds import Rounds, apart
from gpuinfer.measure.timing import Timing

GLUE_NAME = "decode_results"


@dataclass(frozen=True)
class Result:
    """A decode variant, measured end to end."""

    variant: str  # its name in the chapter, a short label of report.labels
    model: str  # e.g. "small Llama, FP32"
    ms_per_token: float  # decode only: the prefill is not in it (see prefill_ms)
    # what a step must move (weights and KV cache), from the accounting; None where a pass
    # commits several tokens (speculative decoding), so that no per-token floor applies
    bytes_per_token: float | None
    bandwidth: float  # the chapter's measured copy rate, bytes/s
    x_v0: float | None = None  # speed-up over the chapter's naive loop, where it has one
    x_generate_static: float | None = None  # over stock generate() with a static cache
    section: str = ""  # the label of the section that measures it
    ms_range: tuple[float, float] | None = None  # fastest and slowest round
    x_v0_range: tuple[float, float] | None = None  # lowest and highest per-round speed-up
    x_generate_static_range: tuple[float, float] | None = None
    prefill_ms: float | None = None  # the prompt's prefill, timed apart, where measured
    stock: bool = False  # the library's own code (generate()), not one of the book's loops

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.ms_per_token

    @property
    def gb_per_s(self) -> float | None:
        """The bytes a step must move, per second of step: achieved bandwidth, in GB/s."""
        if self.bytes_per_token is None:
            return None
        return self.bytes_per_token / (self.ms_per_token / 1e3) / 1e9

    @property
    def floor_fraction(self) -> float | None:
        """The bandwidth floor (bytes/copy rate) over the measured time: 1 is the floor."""
        if self.bytes_per_token is None:
            return None
        return self.bytes_per_token / self.bandwidth / (self.ms_per_token / 1e3)

    def datasheet_fraction(self, datasheet_bandwidth: float) -> float | None:
        """The same fraction against a datasheet's bandwidth (bytes/s) instead of the
        measured copy rate: what published MBU figures usually divide by."""
        if self.bytes_per_token is None:
            return None
        return self.bytes_per_token / datasheet_bandwidth / (self.ms_per_token / 1e3)


def from_rounds(rounds: Rounds, *, model: str,
                bytes_per_token: dict[str, float | None], bandwidth: float,
                v0: str | None = None, generate_static: str | None = None,
                sections: dict[str, str] | None = None, names: list[str] | None = None,
                prefill_ms: dict[str, float] | None = None) -> list[Result]:
    """A row per variant of `rounds` (decode times in ms per token, prefill excluded), in
    the order of `names`. Speed-ups are over the variants named `v0` and
    `generate_static`, in the same rounds; `prefill_ms`, where given, is each variant's
    prefill timed apart (its own column)."""

    def over(base, name):
        if base is None:
            return None, None
        c = rounds.compare(name, base)
        return c.ratio, (c.low, c.high)

    rows = []
    for name in names or rounds.names:
        t = rounds[name]
        x_v0, x_v0_range = over(v0, name)
        x_gs, x_gs_range = over(generate_static, name)
        rows.append(Result(name, model, t.median, bytes_per_token.get(name), bandwidth,
                           x_v0, x_gs, (sections or {}).get(name, ""), (t.min, t.max),
                           x_v0_range, x_gs_range, (prefill_ms or {}).get(name)))
    return rows


def with_borrowed(rows: list[Result], ours: dict[str, Timing], borrowed: dict[str, Timing],
                  *, v0: str, model: str, bytes_per_token: float, bandwidth: float,
                  section: str, prefill_ms: dict[str, float]) -> list[Result]:
    """Rows of `borrowed` (loops another chapter timed on the same workload, shown as it
    timed them) and then `rows` (timed here, `ours` their timings), every speed-up over
    `borrowed[v0]`. Not timed in the same rounds: each range pairs the fastest round of
    one side with the slowest of the other (gpuinfer.measure.rounds.apart)."""
    def over(name, t):
        c = apart(name, t, v0, borrowed[v0])
        return c.ratio, (c.low, c.high)

    out = []
    for name, t in borrowed.items():
        x, spread = over(name, t)
        out.append(Result(name, model, t.median, bytes_per_token, bandwidth, x, None,
                          section, (t.min, t.max), spread, None, prefill_ms.get(name)))
    for row in rows:
        x, spread = over(row.variant, ours[row.variant])
        out.append(dataclasses.replace(row, x_v0=x, x_v0_range=spread))
    return out


def _ranged(value: float | None, spread: tuple[float, float] | None, unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:.3g}{unit} ({spread[0]:.3g}–{spread[1]:.3g})" if spread else \
        f"{value:.3g}{unit}"


def with_spread(value: float | None, spread: tuple[float, float] | None,
                unit: str = "") -> str:
    """A figure and, in brackets, its spread over the rounds ('1.62 (1.52–1.71)'): what a
    chapter's table and the results page show of a median; "–" where there is none."""
    return _ranged(value, spread, unit)


def markdown(rows: list[Result]) -> str:
    """The rows as a chapter's end-to-end table: medians over the rounds, and in brackets
    the fastest and slowest round (for the speed-ups, the lowest and highest per round)."""
    prefill = any(r.prefill_ms is not None for r in rows)
    lines = ["| variant | decode ms / token | tokens / s | × V0 | × generate(static) |"
             + (" prefill ms |" if prefill else ""),
             "|---|---:|---:|---:|---:|" + ("---:|" if prefill else "")]
    lines += [f"| {r.variant} | {_ranged(r.ms_per_token, r.ms_range)} "
              f"| {r.tokens_per_s:,.0f} "
              f"| {_ranged(r.x_v0, r.x_v0_range, '×')} "
              f"| {_ranged(r.x_generate_static, r.x_generate_static_range, '×')} |"
              + (f" {_ranged(r.prefill_ms, None)} |" if prefill else "")
              for r in rows]
    return "\n".join(lines)


def dumps(rows: list[Result]) -> str:
    return json.dumps([dataclasses.asdict(r) for r in rows])


def loads(text: str) -> list[Result]:
    rows = []
    for row in json.loads(text):
        for key in ("ms_range", "x_v0_range", "x_generate_static_range"):
            if row.get(key) is not None:
                row[key] = tuple(row[key])  # JSON has lists
        rows.append(Result(**row))
    return rows
