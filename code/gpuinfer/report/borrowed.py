"""A stock baseline measured by another chapter, read from that chapter's recording.

Stock `generate()` is host-bound, and one fresh process's figure of it moves by about ±10 %
from one process to the next (gpuinfer.measure.stock). So each stock workload is measured
once, by the chapter that owns it, which saves it beside its recording
(`StockBaselines.save`, into `book/_recorded/<chapter>/`); a later chapter that shows the
same workload reads it here, in a presentation cell, and every page gives the same figure.

It is used only where it is the same workload: the same model config, dtype, prompt and
number of new tokens, on a GPU of the same name. Anything else (a smoke run's toy model on a
CPU, a reader's own GPU before the owning chapter was recorded on it, no recording) gives no
baseline and says why, rather than a figure from another machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuinfer.measure.stock import StockBaselines, StockRun


@dataclass(frozen=True)
class Borrowed:
    """The owning chapter's measurement (`stock`, None where it cannot be used) and, in
    words, where it comes from or why there is none (`source`)."""

    stock: StockBaselines | None
    source: str

    def glue_values(self, variant: str = "static") -> dict[str, float]:
        """`StockBaselines.glue_values` of `variant` alone (`stock_<variant>_fresh_ms`, …),
        NaN for each where there is no baseline: a page glues the same names either way."""
        stock = self.stock or StockBaselines({variant: StockRun(variant)}, "", 0, 0, 0)
        prefix = f"stock_{variant}_fresh_"
        return {k: v for k, v in stock.glue_values().items() if k.startswith(prefix)}


def recordings_folder(start: Path | None = None) -> Path | None:
    """`_recorded` of the book this runs in: in `start` (the current folder: a chapter runs
    in `book/`) or `book/` under it, or in one of their parents; None if there is none."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        for candidate in (folder / "_recorded", folder / "book" / "_recorded"):
            if candidate.is_dir():
                return candidate
    return None


def stock_from(chapter: str, *, config: str, dtype: str, prompt_len: int, new_tokens: int,
               gpu: str | None, start: Path | None = None) -> Borrowed:
    """The stock baselines that `chapter` measured on this workload (`gpu`: this run's
    device name, None on a CPU), from its recording."""
    wanted = {"config": config, "dtype": dtype, "prompt_len": prompt_len,
              "new_tokens": new_tokens, "gpu": gpu}
    name = f"stock-{config}-{dtype}.json"
    folder = recordings_folder(start)
    # the record command keeps a chapter's files gzipped (as it does its traces)
    found = [folder / chapter / n for n in (name, name + ".gz")
             if folder and (folder / chapter / n).is_file()]
    if not found:
        return Borrowed(None, f"no recording of {chapter} holds {name}: record {chapter} "
                              f"first, on this GPU")
    stock = StockBaselines.load(found[0])
    if stock.workload() != wanted:
        differ = ", ".join(f"{k} {stock.workload()[k]!r} there, {v!r} here"
                           for k, v in wanted.items() if stock.workload()[k] != v)
        return Borrowed(None, f"{chapter}'s recording measured another workload ({differ})")
    return Borrowed(stock, f"measured in {chapter}'s recording on {gpu}")
