"""Whether each chapter's GPU recording is still valid: `status`.

A recording (gpuinfer.publish.book says where) is fresh when what produced it is what the
chapter would run now and what it holds is what it recorded (gpuinfer.publish.hashes): the
chapter's measurement cells as parsed and the package definitions they reach, its recorded
outputs, its artifacts and kept data; when it keeps every value the chapter's presentation
cells read (gpuinfer.publish.present); and when it is whole and made on a GPU
(gpuinfer.publish.validation). Otherwise it is stale, missing, a CPU smoke run, corrupt,
unfinished (a write cut short by a kill) or linked (its recordings folder is a link to
files outside the book), with one line that says why.

Plain functions, no Sphinx: the record command, the Sphinx extensions and the tests share
them. `python -m gpuinfer.publish.recordings [--root .]` prints every chapter's state, a
line each, and fails unless all are fresh.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuinfer.publish.book import (BookError, artifacts_path, chapters, journal_path,
                                   read_chapter, recording_path)
from gpuinfer.publish import cells as cellkinds
from gpuinfer.publish.hashes import (FORMAT, artifact_hashes, artifacts_differ,
                                     current_hashes, measurement_sources, outputs_hashes)
from gpuinfer.publish.reach import cells_hashes
from gpuinfer.publish.reach import changed as changed_units
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.present import missing as not_kept
from gpuinfer.publish.sources import PACKAGE_DIR
from gpuinfer.publish.validation import METADATA_KEY, read_recording

STATES = ("fresh", "stale", "missing", "cpu", "corrupt", "unfinished", "linked")


def record_command(chapter: str) -> str:
    return (f"`python -m gpuinfer.publish.record {chapter}` on a CUDA machine "
            f"(on the book's H200: `bash scripts/gpu_record.sh {chapter}`)")


@dataclass(frozen=True)
class Status:
    chapter: str
    state: str  # one of STATES
    reason: str  # why, in words
    recording: Path
    provenance: dict = field(default_factory=dict)  # the recording's metadata["gpuinfer"]
    modules: tuple[str, ...] = ()  # package modules whose definitions the chapter reaches

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"

    @property
    def message(self) -> str:
        if self.fresh:
            return f"chapter {self.chapter}: {self.reason}"
        fix = ("" if self.state in ("unfinished", "linked")  # the reason says the fix
               else f" Re-record it with {record_command(self.chapter)}.")
        return f"chapter {self.chapter} has no valid GPU recording: {self.reason}.{fix}"


def recorded_on(meta: dict) -> str:
    """Where and when a recording ran, as every page says it: 'recorded on an NVIDIA H200,
    2026-12-01 09:33 UTC', or, for a CPU smoke run, a warning in place of the GPU."""
    where = ("a CPU smoke run, not GPU results" if meta.get("smoke")
             else f"recorded on an {meta.get('gpu')}")
    return f"{where}, {meta.get('date', '?')}"


def status(root: Path | str, chapter: str, *, accept_cpu: bool = False,
           package_dir: Path = PACKAGE_DIR) -> Status:
    """Is `chapter`'s recording fresh, stale, missing, a CPU smoke run, or corrupt?

    accept_cpu=True counts a CPU smoke recording as fresh (tests of the mechanism only).
    """
    all_chapters = chapters(root)
    if chapter not in all_chapters:
        raise KeyError(f"unknown chapter {chapter!r}; chapters: {', '.join(all_chapters)}")
    path = all_chapters[chapter]
    rec = recording_path(path)
    shown = rec.relative_to(Path(root)).as_posix()
    nb = read_chapter(path)
    now = current_hashes(nb, package_dir)
    modules = tuple(sorted({key.split("::")[0] for key in now["definitions"]}))

    def result(state, reason, meta=None):
        return Status(chapter, state, reason, rec, meta or {}, modules)

    if rec.parent.is_symlink():  # not the book's own files: never trusted
        folder = rec.parent.relative_to(Path(root)).as_posix()
        return result("linked", f"its recordings folder {folder} is a link (to "
                      f"{os.readlink(rec.parent)}), whose files are not the book's; "
                      f"replace the link with a folder (rm {folder}; mkdir {folder}, and "
                      "copy back what it pointed to)")
    if journal_path(path).exists():
        journal = journal_path(path).relative_to(Path(root)).as_posix()
        return result("unfinished", "a recording of it was cut short while being written "
                      f"({journal} is there); "
                      "`python -m gpuinfer.publish.record --recover` finishes writing it")
    if not rec.exists():
        return result("missing", f"there is no recording {shown}")
    try:
        recorded = read_recording(rec)
    except (OSError, ValueError) as exc:
        return result("corrupt", f"the recording {shown} is unreadable ({exc})")
    meta = recorded.metadata[METADATA_KEY]
    if meta.get("format") != FORMAT:
        return result("stale", f"{shown} was recorded before recordings hashed their "
                      "outputs and data (an older format), so it is not trusted", meta)
    why = changed(nb, recorded, meta, now)
    if why:
        return result("stale", why, meta)
    outputs = outputs_hashes(recorded)
    if outputs != meta.get("outputs"):
        edited = [str(n) for (n, _), a, b in zip(cellkinds.measurement_cells(recorded),
                                                 outputs, meta.get("outputs") or [])
                  if a != b]
        return result("stale", f"its recorded outputs in {shown} (cell "
                      f"{', '.join(edited) or '?'}) are not those it recorded", meta)
    folder = artifacts_path(path)
    shown_folder = folder.relative_to(Path(root)).as_posix()
    differ = artifacts_differ(meta.get("artifacts") or {}, artifact_hashes(folder))
    if differ:
        return result("stale", f"its files in {shown_folder}/ are not the ones it "
                      f"recorded ({differ})", meta)
    absent = not_kept(nb, folder / DATA_FILE, recorded)
    if absent:
        return result("stale", f"{absent[0]} ({shown_folder}/{DATA_FILE})", meta)
    if meta["smoke"] and not accept_cpu:
        return result("cpu", f"{shown} is a CPU smoke recording (made with --allow-cpu), "
                      "not GPU results", meta)
    return result("fresh", recorded_on(meta), meta)


def changed(nb, recorded, meta: dict, now: dict) -> str | None:
    """Why the chapter's code is no longer what made the recording, or None: its
    measurement cells, the definitions they reach, or the recording's own cells edited."""
    if cells_hashes(measurement_sources(recorded)) != meta.get("cells"):
        return ("its code cells are not the ones it was recorded with (the hashes in its "
                "metadata differ): it was edited after recording")
    old, new = meta.get("cells") or [], now["cells"]
    if old != new:
        numbers = [n for n, _ in cellkinds.measurement_cells(nb)]
        if len(old) != len(new):
            return (f"its measurement cells changed since it was recorded ({len(new)} now, "
                    f"{len(old)} then)")
        which = [str(n) for n, a, b in zip(numbers, old, new) if a != b]
        return (f"its measurement cell{'s' if len(which) > 1 else ''} {', '.join(which)} "
                "changed since it was recorded")
    old, new = meta.get("definitions") or {}, now["definitions"]
    if old != new:
        said = changed_units(old, new)
        shown = "; ".join("gpuinfer/" + line for line in said[:3]) + (
            f"; and {len(said) - 3} more" if len(said) > 3 else "")
        return f"the package definitions it reaches changed since it was recorded ({shown})"
    return None


def main(argv: list[str] | None = None) -> int:
    """Every chapter of the book and its state, a line each; 1 unless all are fresh."""
    parser = argparse.ArgumentParser(prog="python -m gpuinfer.publish.recordings",
                                     description="Which chapters' recordings are fresh.")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the book's folder, with _toc.yml (default: here)")
    root = parser.parse_args(argv).root
    try:
        found = [status(root, chapter) for chapter in chapters(root)]
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for st in found:
        print(f"{st.state:<10} {st.message}")
    stale = [st.chapter for st in found if not st.fresh]
    print(f"{len(found) - len(stale)} of {len(found)} chapters fresh" +
          (f"; re-record {', '.join(stale)}" if stale else ""))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
