"""What a reader needs to reproduce the book, from its recordings: a Sphinx extension (listed
in _config.yml) for the reproduce page.

Three tables, each a row per chapter of the TOC, read from the provenance each recording
keeps (gpuinfer.env.provenance, written by the record command), never typed:

- `{recorded-runtimes}`: the recording's state, GPU, date, run time and the peak GPU memory
  in use while it ran (gpuinfer.publish.gpumem);
- `{recorded-hosts}`: the machine it ran on: GPU, host CPU (model, logical CPUs this
  process could use, clock), driver, CUDA, torch, Triton, Python, date. Host-bound figures
  (launch costs, compile times) depend on the CPU as much as on the GPU;
- `{gpu-memory-fit}`: the peak GPU memory and the smallest common card that holds it.

And two substitutions for the page's text: `{{ gpu_budget_gib }}`, the budget every process
of a recording is capped at (gpuinfer.env.GPU_BUDGET_GIB), and `{{ gpu_budget_gb }}`, the
same in GB. A recording made before a field was recorded shows "not recorded" there.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

from gpuinfer.env import GPU_BUDGET_GIB
from gpuinfer.publish import book, recordings
from gpuinfer.publish.tables import table

STATE_TEXT = {"fresh": "up to date", "stale": "stale (from an older version)",
              "missing": "not recorded yet", "cpu": "CPU smoke run, not a GPU",
              "corrupt": "unreadable", "unfinished": "cut short while being written",
              "linked": "read through a link, not trusted"}
# Common cards' memory, as they are sold: in GB (10^9 bytes), e.g. the L4's 24 GB, the
# A100's 40 and 80 GB, the H200's 141 GB. Vendors round: a "24 GB" card often holds
# 24 GiB, so comparing against 10^9 bytes errs on the safe side.
CARD_GB = (16, 24, 40, 48, 80, 141)
NOT_RECORDED = "not recorded"


def gib_to_gb(gib: float) -> float:
    return gib * 2**30 / 1e9


def smallest_card(peak_gib: float | None) -> int | None:
    """The smallest of CARD_GB (GB) whose memory is at least `peak_gib` (GiB); None where
    none is (or there is no peak)."""
    if not isinstance(peak_gib, (int, float)) or isinstance(peak_gib, bool):
        return None
    return next((gb for gb in CARD_GB if gb * 1e9 >= peak_gib * 2**30), None)


def _field(meta: dict, key: str) -> str:
    """A provenance field as a cell: "not recorded" where the recording predates it, "–"
    where it was recorded as unknown (None)."""
    if key not in meta:
        return NOT_RECORDED
    return "–" if meta[key] is None else str(meta[key])


def clock_text(meta: dict) -> str:
    """'3.7 GHz (maximum)', '2.6 GHz (current)'; "not recorded" or "–" without one."""
    ghz = meta.get("cpu_clock_ghz")
    if not isinstance(ghz, (int, float)):
        return _field(meta, "cpu_clock_ghz")
    which = (meta.get("cpu_clock_source") or "").split(" (")[0]
    return f"{ghz:g} GHz" + (f" ({which})" if which else "")


def host_row(meta: dict) -> list[str]:
    """A recording's host, as the cells of `{recorded-hosts}` after the chapter's: the
    GPU; the CPU (model, logical CPUs, clock); the software; the date. Four cells, so that
    the table fits the text column."""
    gpu = "none (CPU smoke run)" if meta.get("smoke") else _field(meta, "gpu")
    cpu = (f"{_field(meta, 'cpu_model')}, {_field(meta, 'cpu_count')} logical CPUs, "
           f"{clock_text(meta)}")
    software = ", ".join(f"{name} {_field(meta, key)}" for name, key in (
        ("driver", "driver"), ("CUDA", "cuda"), ("torch", "torch"), ("Triton", "triton"),
        ("Python", "python")))
    return [gpu, cpu, software, _field(meta, "date")]


def memory_row(meta: dict) -> list[str]:
    """A GPU recording's peak memory (GiB, GB) and the smallest card that holds it."""
    peak = meta.get("peak_gpu_memory_gib")
    if not isinstance(peak, (int, float)) or isinstance(peak, bool):
        return ["–", "–", "–"]
    card = smallest_card(peak)
    return [f"{peak:.1f}", f"{gib_to_gb(peak):.1f}",
            f"{card} GB" if card else f"none of {CARD_GB[-1]} GB or less"]


class _ChapterTable(SphinxDirective):
    """A table with a row per chapter of the TOC, linked to its page (titled), from the
    statuses the build found at its start (gpuinfer.publish.sphinx_recordings)."""

    def chapters(self):
        """(link, state shown, provenance) per chapter; a smoke recording that a test
        build accepts as fresh is shown as the CPU run it is."""
        root = Path(self.env.srcdir)
        found = getattr(self.env.app, "gpuinfer_status", {})  # from the start of the build
        self.env.note_dependency(str(root / "_toc.yml"))  # a chapter leaving it: its row
        for chapter, path in book.chapters(root).items():
            self.env.note_dependency(str(book.recording_path(path)))
            docname = self.env.path2doc(str(path))
            link = addnodes.pending_xref("", nodes.inline(text=chapter), refdomain="std",
                                         reftype="doc", reftarget="/" + docname,
                                         refexplicit=False, refdoc=self.env.docname)
            status = found.get(docname) or recordings.status(root, chapter)
            meta = status.provenance
            shown = "cpu" if status.state == "fresh" and meta.get("smoke") else status.state
            yield link, shown, meta


class RecordedRuntimes(_ChapterTable):
    """Per chapter: the state of its recording, the GPU, the date, the run time and the
    peak GPU memory in use while it ran."""

    def run(self):
        header = ["chapter", "recording", "GPU", "recorded", "run time (s)",
                  "peak GPU memory (GiB)"]
        rows, total, timed = [], 0.0, 0
        for link, shown, meta in self.chapters():
            ran = meta if shown in ("fresh", "stale") else {}  # a GPU run's figures only
            seconds, memory = ran.get("seconds"), ran.get("peak_gpu_memory_gib")
            if isinstance(seconds, (int, float)):
                total, timed = total + seconds, timed + 1
            rows.append([link, STATE_TEXT[shown], meta.get("gpu") or "–",
                         meta.get("date") or "–",
                         f"{seconds:.0f}" if isinstance(seconds, (int, float)) else "–",
                         f"{memory:.1f}" if isinstance(memory, (int, float)) else "–"])
        if timed:
            rows.append([nodes.strong(text="all chapters"), "", "", "",
                         nodes.strong(text=f"{total:.0f}"), ""])
        return [table(header, rows, classes=("recorded-runtimes",))]


class RecordedHosts(_ChapterTable):
    """Per chapter: the machine its recording ran on, GPU and host."""

    def run(self):
        header = ["chapter", "GPU", "host CPU", "software", "recorded"]
        rows = []
        for link, shown, meta in self.chapters():
            if shown in ("fresh", "stale", "cpu"):
                rows.append([link, *host_row(meta)])
            else:
                rows.append([link, STATE_TEXT[shown]] + ["–"] * (len(header) - 2))
        return [table(header, rows, classes=("recorded-hosts",))]


class GpuMemoryFit(_ChapterTable):
    """Per chapter: the peak GPU memory its GPU recording used, and the smallest of the
    common cards (CARD_GB) that holds it."""

    def run(self):
        header = ["chapter", "recording", "peak GPU memory (GiB)", "(GB)",
                  "smallest card that holds it"]
        rows = []
        for link, shown, meta in self.chapters():
            ran = meta if shown in ("fresh", "stale") else {}
            rows.append([link, STATE_TEXT[shown], *memory_row(ran)])
        return [table(header, rows, classes=("gpu-memory-fit",))]


def add_substitutions(app, config) -> None:
    """config-inited: the GPU budget, read from gpuinfer.env, for the page's text."""
    config.myst_substitutions = {**config.myst_substitutions,
                                 "gpu_budget_gib": f"{GPU_BUDGET_GIB:g}",
                                 "gpu_budget_gb": f"{gib_to_gb(GPU_BUDGET_GIB):.1f}",
                                 "gpu_cards_gb": ", ".join(f"{gb}" for gb in CARD_GB)}


def setup(app):
    app.add_directive("recorded-runtimes", RecordedRuntimes)
    app.add_directive("recorded-hosts", RecordedHosts)
    app.add_directive("gpu-memory-fit", GpuMemoryFit)
    app.connect("config-inited", add_substitutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
