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
from gpuinfer.publish.recorder import recorder_changed
from gpuinfer.publish.sources import PACKAGE_DIR
from gpuinfer.publish.validation import METADATA_KEY, read_recording

STATES = ("fresh", "stale", "missing", "cpu", "corrupt", "unfinished", "linked")


def record_command(chapter: str) -> str:
    return (f"`python -m gpuinfer.publish.record {chapter}` on a CUDA machine "
            f"(on the book's GPU machine: `bash scripts/gpu_record.sh {chapter}`)")


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

    Classified in three steps: whether there is a recording of the book's own to check
    (`unreadable`), whether it is still what the chapter would record (each of `STALE`),
    and whether it ran on a GPU. accept_cpu=True counts a CPU smoke recording as fresh
    (tests of the mechanism only).
    """
    all_chapters = chapters(root)
    if chapter not in all_chapters:
        raise KeyError(f"unknown chapter {chapter!r}; chapters: {', '.join(all_chapters)}")
    path = all_chapters[chapter]
    rec = recording_path(path)
    nb = read_chapter(path)
    now = current_hashes(nb, Path(root), package_dir)
    modules = tuple(sorted({key.split("::")[0] for key in now["definitions"]}))
    recorded = unreadable(Path(root), path)
    if isinstance(recorded, tuple):
        return Status(chapter, *recorded, rec, {}, modules)
    found = Found(Path(root), path, nb, now, recorded)
    reasons = (check(found) for check in STALE)
    why = next((reason for reason in reasons if reason), None)
    if why:
        return Status(chapter, "stale", why, rec, found.meta, modules)
    if found.meta["smoke"] and not accept_cpu:
        return Status(chapter, "cpu", f"{found.shown} is a CPU smoke recording (made with "
                      "--allow-cpu), not GPU results", rec, found.meta, modules)
    return Status(chapter, "fresh", recorded_on(found.meta), rec, found.meta, modules)


def unreadable(root: Path, path: Path):
    """The chapter's recording, read; or (state, reason) when there is none of the book's
    own to check: its folder is a link, a write of it was cut short, it is missing, or it
    cannot be read."""
    rec = recording_path(path)
    shown = rec.relative_to(root).as_posix()
    if rec.parent.is_symlink():  # not the book's own files: never trusted
        folder = rec.parent.relative_to(root).as_posix()
        return ("linked", f"its recordings folder {folder} is a link (to "
                f"{os.readlink(rec.parent)}), whose files are not the book's; replace the "
                f"link with a folder (rm {folder}; mkdir {folder}, and copy back what it "
                "pointed to)")
    if journal_path(path).exists():
        journal = journal_path(path).relative_to(root).as_posix()
        return ("unfinished", "a recording of it was cut short while being written "
                f"({journal} is there); "
                "`python -m gpuinfer.publish.record --recover` finishes writing it")
    if not rec.exists():
        return ("missing", f"there is no recording {shown}")
    try:
        return read_recording(rec)
    except (OSError, ValueError) as exc:
        return ("corrupt", f"the recording {shown} is unreadable ({exc})")


@dataclass(frozen=True)
class Found:
    """A readable recording of a chapter, with what the chapter would record now."""

    root: Path
    path: Path  # the chapter
    nb: object  # the chapter as written
    now: dict  # gpuinfer.publish.hashes.current_hashes of it
    recorded: object  # the recording's notebook

    @property
    def meta(self) -> dict:
        return self.recorded.metadata[METADATA_KEY]

    @property
    def shown(self) -> str:
        return recording_path(self.path).relative_to(self.root).as_posix()

    @property
    def folder(self) -> Path:
        return artifacts_path(self.path)


def older_format(found: Found) -> str | None:
    if found.meta.get("format") != FORMAT:
        return (f"{found.shown} was recorded before recordings hashed their outputs and "
                "data (an older format), so it is not trusted")
    return None


def code_changed(found: Found) -> str | None:
    return changed(found.nb, found.recorded, found.meta, found.now)


def outputs_edited(found: Found) -> str | None:
    outputs, meta = outputs_hashes(found.recorded), found.meta
    if outputs == meta.get("outputs"):
        return None
    edited = [str(n) for (n, _), a, b in zip(cellkinds.measurement_cells(found.recorded),
                                             outputs, meta.get("outputs") or []) if a != b]
    return (f"its recorded outputs in {found.shown} (cell {', '.join(edited) or '?'}) are "
            "not those it recorded")


def files_differ(found: Found) -> str | None:
    differ = artifacts_differ(found.meta.get("artifacts") or {},
                              artifact_hashes(found.folder))
    if differ:
        return (f"its files in {found.folder.relative_to(found.root).as_posix()}/ are not "
                f"the ones it recorded ({differ})")
    return None


def values_not_kept(found: Found) -> str | None:
    absent = not_kept(found.nb, found.folder / DATA_FILE, found.recorded)
    if absent:
        return f"{absent[0]} ({found.folder.relative_to(found.root).as_posix()}/{DATA_FILE})"
    return None


# What makes a readable recording stale, checked in this order (the first that says why
# is the reason given): its format, its code, its outputs, its files, its kept values.
STALE = (older_format, code_changed, outputs_edited, files_differ, values_not_kept)


def changed(nb, recorded, meta: dict, now: dict) -> str | None:
    """Why the chapter's code is no longer what made the recording, or None: its
    measurement cells, the definitions they reach, the recorder's set-up, or the
    recording's own cells edited."""
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
    return recorder_changed(meta.get("recorder"), now["recorder"])


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
