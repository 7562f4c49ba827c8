"""Under the title of each chapter page, the recording's provenance with download links
(or, for a preview, a banner saying that its outputs are not GPU results, and the hidden
cell that glues its NaN peak memory): a Sphinx extension (listed in _config.yml), on the
statuses gpuinfer.publish.sphinx_recordings found when the build started, which it sets
up first. The recording and the package modules are Sphinx dependencies of the page, so
an incremental build picks up a re-recording or a change of the package."""

from __future__ import annotations

from pathlib import Path

from gpuinfer.env import host_text
from gpuinfer.publish import recordings
from gpuinfer.publish.sources import PACKAGE_DIR
from gpuinfer.publish.sphinx_recordings import PREVIEW_CELL, stop
from gpuinfer.publish.titles import insert_after_title


def _link(label: str, target: Path, page_dir: Path) -> str:
    return f"{{download}}`{label} <{target.relative_to(page_dir).as_posix()}>`"


def box(status: recordings.Status, page_dir: Path) -> str:
    """The MyST block shown under the chapter title."""
    if not status.fresh:
        return ("```{admonition} CPU preview: these outputs are not GPU results\n"
                ":class: danger\n\n"
                f"This chapter has no valid GPU recording: {status.reason}. So this page "
                "was executed on the CPU of the machine that built it, and its numbers and "
                f"figures say nothing about a GPU. Re-record it with "
                f"{recordings.record_command(status.chapter)}.\n```\n")
    meta = status.provenance
    artifacts_dir = status.recording.with_suffix("")
    if isinstance(meta.get("artifacts"), dict):  # checked against the folder by status()
        artifacts = [artifacts_dir / name for name in sorted(meta["artifacts"])]
    else:  # a recording made before artifacts were hashed
        artifacts = sorted(f for f in artifacts_dir.rglob("*") if f.is_file()) \
            if artifacts_dir.is_dir() else []
    downloads = [_link("executed notebook", status.recording, page_dir)]
    downloads += [_link(f.relative_to(artifacts_dir).as_posix(), f, page_dir)
                  for f in artifacts]
    said = recordings.recorded_on(meta)
    title = said[0].upper() + said[1:]
    if meta.get("smoke"):
        kind, device = "warning", f"none, CPU only ({meta.get('cpu', '?')})"
    else:
        kind = "note"
        device = f"{meta.get('gpu')}, driver {meta.get('driver')}, CUDA {meta.get('cuda')}"
    triton = meta.get("triton") or ("not recorded" if "triton" not in meta else "none")
    return (f"```{{admonition}} {title}\n:class: {kind}\n\n"
            f"- **GPU:** {device}\n"
            f"- **Host:** {host_text(meta)}\n"
            f"- **Software:** torch {meta.get('torch')}, Triton {triton}, transformers "
            f"{meta.get('transformers')}, Python {meta.get('python')}\n"
            f"- **Recorded:** {meta.get('date')}, the chapter ran in "
            f"{meta.get('seconds')} s\n"
            f"- **Download:** {', '.join(downloads)}\n```\n")


def note_dependencies(env, status: recordings.Status, path: Path) -> None:
    """Note what a page drawn from the chapter's recording depends on, so that an
    incremental build re-reads it when one changes: the TOC (the chapter may leave it),
    the chapter (its presentation cells), its recording and files (a missing file: re-read
    every build) and the package's code (the presentation cells may call any of it)."""
    folder = status.recording.with_suffix("")
    found = [Path(env.srcdir) / "_toc.yml", path, status.recording]
    found += [folder / name for name in (status.provenance.get("artifacts") or {})]
    for dependency in found + sorted(PACKAGE_DIR.rglob("*.py")):
        env.note_dependency(str(dependency))


def add_box(app, docname: str, source: list[str]) -> None:
    """source-read: note the page's dependencies and put the box under its title (stop
    if a chapter read as fresh was edited since: a CPU run would show as its recording)."""
    status = getattr(app, "gpuinfer_status", {}).get(docname)
    if status is None:
        return
    path = Path(app.env.doc2path(docname))
    if getattr(app, "gpuinfer_seeded", {}).get(docname) not in (None, path.read_text(
            "utf8")):  # myst-nb would miss its seeded cache and run it on the CPU
        stop(f"{path} changed while the site was being built, after its recording was "
             "read: build again")
    note_dependencies(app.env, status, path)
    page_dir = path.parent
    block = box(status, page_dir) + ("" if status.fresh else "\n" + PREVIEW_CELL)
    source[0] = insert_after_title(source[0], block)


def setup(app):
    app.setup_extension("gpuinfer.publish.sphinx_recordings")  # the statuses it reads
    app.connect("source-read", add_box)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
