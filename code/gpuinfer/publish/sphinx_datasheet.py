"""`{gpu-spec-table}`: the datasheet table of gpuinfer.roofline, rendered at build
time, so that the appendix cannot drift from the numbers the chapters use; the GPUs the
book's recordings ran on are marked. A Sphinx extension (listed in _config.yml)."""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from gpuinfer import roofline
from gpuinfer.publish import book
from gpuinfer.publish.tables import table
from gpuinfer.publish.validation import read_provenance


def recorded_gpus(root: Path) -> dict[str, dict]:
    """{chapter: provenance} of every chapter whose recording is readable (and not read
    through a link: gpuinfer.publish.recordings does not trust one)."""
    found = {}
    for chapter, path in book.chapters(root).items():
        if book.recording_path(path).parent.is_symlink():
            continue
        try:
            found[chapter] = read_provenance(book.recording_path(path))
        except (OSError, ValueError):
            pass
    return found


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


class GPUSpecTable(SphinxDirective):
    """The datasheet ceilings of gpuinfer.roofline.GPU_SPECS, with the BF16 ridge
    point."""

    def run(self):
        root = Path(self.env.srcdir)
        for path in book.chapters(root).values():
            self.env.note_dependency(str(book.recording_path(path)))
        self.env.note_dependency(str(root / "_toc.yml"))  # the chapters whose GPUs count
        self.env.note_dependency(roofline.__file__)
        book_gpus = {spec.name for meta in recorded_gpus(root).values()
                     if not meta.get("smoke")
                     for spec in [roofline.lookup_spec(meta.get("gpu"))] if spec}
        header = ["GPU", "memory", "memory TB/s", "FP32 TFLOP/s", "TF32 TFLOP/s",
                  "BF16 TFLOP/s", "BF16 ridge FLOP/B"]
        rows, sources = [], {}
        for s in roofline.GPU_SPECS:
            ridge = (roofline.ridge_point(s.bf16_tflops * 1e12, s.hbm_tbs * 1e12)
                     if s.bf16_tflops else None)
            name = nodes.strong(text=s.name + " (the book's GPU)") if s.name in book_gpus \
                else s.name
            rows.append([name, s.memory, _fmt(s.hbm_tbs), _fmt(s.fp32_tflops),
                         _fmt(s.tf32_tflops), _fmt(s.bf16_tflops),
                         "–" if ridge is None else f"{ridge:.0f}"])
            sources.setdefault(s.source, []).append(s.name)
        # The sources under the table, not in a column: the table must fit the page width.
        note = nodes.paragraph("", "", nodes.emphasis(text="Sources:"))
        listed = nodes.bullet_list()
        for source, names in sources.items():
            listed += nodes.list_item("", nodes.paragraph(
                text=f"{', '.join(names)}: {source}."))
        return [table(header, rows, classes=("gpu-spec-table",)), note, listed]


def setup(app):
    app.add_directive("gpu-spec-table", GPUSpecTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
