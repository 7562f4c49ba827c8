"""Whether each chapter's GPU recording is still valid: `status`.

A recording (gpuinfer.publish.book says where) is fresh when what produced it is what the
chapter would run now: its code cells, the gpuinfer modules they import and its artifacts
have the hashes it stored (gpuinfer.publish.hashes), and it is whole and made on a GPU
(gpuinfer.publish.validation). Otherwise it is stale, missing, a CPU smoke run, corrupt,
or unfinished (a write cut short by a kill).

Plain functions, no Sphinx: the record command, the Sphinx extensions and the tests share
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuinfer.publish.book import (artifacts_path, chapters, journal_path, read_chapter,
                                   recording_path)
from gpuinfer.publish.hashes import (PACKAGE_DIR, artifact_hashes, artifacts_differ,
                                     current_hashes)
from gpuinfer.publish.validation import read_provenance

STATES = ("fresh", "stale", "missing", "cpu", "corrupt", "unfinished")


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
    modules: tuple[str, ...] = ()  # package modules the chapter imports now

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"

    @property
    def message(self) -> str:
        if self.fresh:
            return f"chapter {self.chapter}: {self.reason}"
        fix = ("" if self.state == "unfinished"  # the reason says how to finish it
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
    now = current_hashes(read_chapter(path), package_dir)
    modules = tuple(now["modules"])

    def result(state, reason, meta=None):
        return Status(chapter, state, reason, rec, meta or {}, modules)

    if journal_path(path).exists():
        journal = journal_path(path).relative_to(Path(root)).as_posix()
        return result("unfinished", "a recording of it was cut short while being written "
                      f"({journal} is there); "
                      "`python -m gpuinfer.publish.record --recover` finishes writing it")
    if not rec.exists():
        return result("missing", f"there is no recording {shown}")
    try:
        meta = read_provenance(rec)
    except (OSError, ValueError) as exc:
        return result("corrupt", f"the recording {shown} is unreadable ({exc})")
    if meta["chapter_hash"] != now["chapter_hash"]:
        return result("stale", "its code cells changed since it was recorded", meta)
    if meta["package_hash"] != now["package_hash"]:
        old = meta["modules"] if isinstance(meta["modules"], dict) else {}
        changed = sorted(m for m in set(old) | set(now["modules"])
                         if old.get(m) != now["modules"].get(m))
        return result("stale", "the gpuinfer sources it imports changed since it was "
                      f"recorded ({', '.join('gpuinfer/' + m for m in changed)})", meta)
    # Recordings made before artifacts were hashed carry no "artifacts": nothing to check.
    if isinstance(meta.get("artifacts"), dict):
        folder = artifacts_path(path)
        differ = artifacts_differ(meta["artifacts"], artifact_hashes(folder))
        if differ:
            shown_folder = folder.relative_to(Path(root)).as_posix()
            return result("stale", f"its artifacts in {shown_folder}/ are not the ones it "
                          f"recorded ({differ})", meta)
    if meta["smoke"] and not accept_cpu:
        return result("cpu", f"{shown} is a CPU smoke recording (made with --allow-cpu), "
                      "not GPU results", meta)
    return result("fresh", recorded_on(meta), meta)
