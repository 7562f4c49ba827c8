"""Timings one chapter measures and a later chapter shows, read from the first one's
recording.

A figure paced by the host (an eager loop's step, the cost of one kernel launch) moves by
10 to 50 % from one process to the next, while the GPU-bound ones repeat within 2 %. Two
pages that each time the same host-bound workload would disagree by that much. So the
chapter that owns a workload keeps its timings beside its recording (`keep`, into its
artifact folder, which the record command stores gzipped), and a later chapter reads them
(`borrow`) rather than timing the workload again, as gpuinfer.report.borrowed does for
the stock baselines, with the same lookup (`borrowed.kept`). A timing of this chapter is
compared with a borrowed one by `Shared.against`.

They are used only for the same workload (the same model, dtype, prompt and new tokens)
on a GPU of the same name. Anything else (a smoke run on a CPU, a GPU the owning chapter
was not recorded on) gives no timings, and says why.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpuinfer.measure.rounds import Comparison, apart
from gpuinfer.measure.timing import Timing
from gpuinfer.report.borrowed import kept


@dataclass(frozen=True)
class Shared:
    """The owning chapter's timings by name (None where they cannot be used) and, in words,
    where they come from or why there are none (`source`)."""

    timings: dict[str, Timing] | None
    source: str

    def get(self, name: str) -> Timing | None:
        """The timing called `name`, or None where there are no timings."""
        return None if self.timings is None else self.timings[name]

    def against(self, name: str, ours: Timing, theirs: str) -> Comparison:
        """`ours` (`name`'s timing, over this chapter's rounds) against the owning
        chapter's timing `theirs`, over its rounds: each side's fastest round paired with
        the other's slowest (gpuinfer.measure.rounds.apart)."""
        if self.timings is None:
            raise ValueError(f"no timing of {theirs} to compare with: {self.source}")
        return apart(name, ours, theirs, self.timings[theirs])


def keep(folder: str | os.PathLike, name: str, workload: dict,
         timings: dict[str, Timing]) -> Path:
    """Write `timings` of `workload` as `folder`/`name`.json; returns its path."""
    path = Path(folder) / f"{name}.json"
    path.write_text(json.dumps({
        "workload": workload,
        "timings": {k: {"times_ms": list(t.times_ms), "clock": t.clock}
                    for k, t in timings.items()}}, indent=1))
    return path


def _read(path: Path) -> tuple[dict, dict[str, Timing]]:
    try:
        opened = gzip.open(path, "rt") if path.suffix == ".gz" else path.open()
        with opened as f:
            data = json.load(f)
        return data["workload"], {k: Timing(tuple(v["times_ms"]), v["clock"])
                                  for k, v in data["timings"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a kept timing file ({exc!r}): record the chapter "
                         f"that measures it again") from None


def borrow(chapter: str, name: str, workload: dict, *, start: Path | None = None) -> Shared:
    """The timings `chapter` kept as `name` for `workload` (its "gpu": this run's device
    name, None on a CPU), from its recording (gpuinfer.report.borrowed.kept)."""
    return Shared(*kept(chapter, f"{name}.json", workload, _read, "timed", start=start))
