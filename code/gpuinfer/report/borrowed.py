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

The same lookup (`kept`: the file, plain or gzipped, a missing one, the workload's
differences) serves the timings a chapter keeps for another (gpuinfer.report.shared).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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


def kept(chapter: str, file_name: str, workload: dict, read: Callable[[Path], tuple],
         verb: str, *, start: Path | None = None) -> tuple[object | None, str]:
    """What `chapter`'s recording kept as `file_name` (plain, or gzipped as the record
    command keeps a chapter's files) for `workload` (its "gpu": this run's device name,
    None on a CPU), and in words where it comes from, `verb` saying how it was made
    ("measured"). `read` turns the file into the workload it was made for and the value.
    No such file, or another workload's, gives None and says why; a damaged one raises
    (`read`'s ValueError)."""
    folder = recordings_folder(start)
    found = [folder / chapter / n for n in (file_name, file_name + ".gz")
             if folder and (folder / chapter / n).is_file()]
    if not found:
        return None, (f"no recording of {chapter} holds {file_name}: record {chapter} "
                      f"first, on this GPU")
    there, value = read(found[0])
    if there != workload:
        differ = ", ".join(f"{k} {there.get(k)!r} there, {v!r} here"
                           for k, v in workload.items() if there.get(k) != v)
        return None, (f"{chapter}'s recording {verb} another workload "
                      f"({differ or 'other fields'})")
    return value, f"{verb} in {chapter}'s recording on {workload.get('gpu')}"


def _stock(path: Path) -> tuple[dict, StockBaselines]:
    stock = StockBaselines.load(path)
    return stock.workload(), stock


def stock_from(chapter: str, *, config: str, dtype: str, prompt_len: int, new_tokens: int,
               gpu: str | None, start: Path | None = None) -> Borrowed:
    """The stock baselines that `chapter` measured on this workload (`gpu`: this run's
    device name, None on a CPU), from its recording (`kept`)."""
    wanted = {"config": config, "dtype": dtype, "prompt_len": prompt_len,
              "new_tokens": new_tokens, "gpu": gpu}
    return Borrowed(*kept(chapter, f"stock-{config}-{dtype}.json", wanted, _stock,
                          "measured", start=start))
