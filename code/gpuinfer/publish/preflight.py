"""What the record command checks before it runs anything, each problem one line that
names the fix (`UsageError`): the packages it needs, the book and the chapters named on its
command line, and that every recording can be written (a writable recordings folder with
room, no link where a recording goes, room in the temporary folder).
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from pathlib import Path

from gpuinfer.publish import book

# Every module the recorder imports that is not in the standard library, with its pip name.
REQUIRED = {"nbclient": "nbclient", "nbformat": "nbformat", "jupytext": "jupytext",
            "ipykernel": "ipykernel", "myst_nb": "myst-nb", "yaml": "pyyaml",
            "torch": "torch"}
# Free space a run needs: in the temporary folder, raw profiler traces and the compilers'
# caches; beside the recordings, the new recording staged next to the old one.
MIN_FREE_TMP_MB = 512
MIN_FREE_RECORDINGS_MB = 64


class UsageError(Exception):
    """Bad input: exit code 2 and a message that names the fix."""


def missing_packages() -> list[str]:
    """The pip names of the required packages that do not import."""
    missing = []
    for module, package in REQUIRED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    return missing


def find_root(start: Path) -> Path:
    """The book that holds `start`: the nearest folder at or above it with a _toc.yml."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    raise UsageError(f"{start} is not inside a book (no _toc.yml in it or above it): run "
                     "this in the book's folder, or name it with --root")


def book_chapters(root: Path) -> dict[str, Path]:
    """The book's chapters; UsageError (its one line) if the TOC or a page is unreadable."""
    if not (root / "_toc.yml").is_file():
        raise UsageError(f"--root {root}: no _toc.yml there; name the book's root folder")
    try:
        known = book.chapters(root)
    except book.BookError as exc:
        raise UsageError(str(exc)) from None
    if not known:
        raise UsageError(f"no chapters (MyST notebooks) in {root / '_toc.yml'}")
    return known


def _as_chapter_file(name: str, root: Path, known: dict[str, Path]) -> str | None:
    """The stem of the chapter that `name`, given as a file path, is; None if `name` is not
    a path. A path is taken from the current folder (then from the book's root, as the
    README writes them); a file that is not one of this book's chapters is an error, not
    the chapter of this book with the same name."""
    if "/" not in name and not name.endswith(".md"):
        return None
    for base in (Path.cwd(), root):
        candidate = (base / name).resolve()
        if candidate.is_file():
            for stem, path in known.items():
                if path.resolve() == candidate:
                    return stem
            raise UsageError(f"{name} is not a chapter of the book at {root}: record it in "
                             "its own book (--root), or name one of these chapters: "
                             f"{', '.join(known)}")
    raise UsageError(f"no file {name}; name a chapter of the book at {root}: "
                     f"{', '.join(known)}")


def select_chapters(root: Path, names: list[str]) -> dict[str, Path]:
    """The chapters named on the command line: a stem, a unique prefix like 01, or the
    chapter's file."""
    known = book_chapters(root)
    if not names:
        return known
    chosen = {}
    for name in names:
        stem = _as_chapter_file(name, root, known)
        if stem is None:
            stem = name
        matches = [stem] if stem in known else [c for c in known if c.startswith(stem)]
        if len(matches) > 1:
            raise UsageError(f"{name!r} is ambiguous: it starts {', '.join(matches)}. "
                             "Give more of the name")
        if not matches:
            raise UsageError(f"unknown chapter {name!r}. The chapters are: "
                             f"{', '.join(known)}")
        chosen[matches[0]] = known[matches[0]]
    return chosen


def recordings_folders(chapters: dict[str, Path]) -> list[Path]:
    return sorted({book.recording_path(p).parent for p in chapters.values()})


def free_mb(folder: Path) -> float:
    return shutil.disk_usage(folder).free / 2**20


def check_not_linked(folder: Path) -> None:
    """UsageError if the recordings folder is a link: the recordings would be written
    through it, outside the book, where git does not see them."""
    if folder.is_symlink():
        raise UsageError(f"{folder} is a link (to {os.readlink(folder)}); recordings are "
                         "written into the book's own folder, never through a link. "
                         f"Replace the link with a folder (rm {folder}; mkdir {folder}, and "
                         "copy back what it pointed to), then record again")


def check_writable(chapters: dict[str, Path]) -> None:
    """Fail now, not after an hour of GPU work, if a recording could not be written: each
    recordings folder must be a folder of the book (not a link), take a file and have
    room, no recording may be a link (it would be written through it), and the temporary
    folder must have room for the run."""
    for folder in recordings_folders(chapters):
        check_not_linked(folder)
        try:
            folder.mkdir(exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check.", suffix=".tmp")
            os.close(fd)
            Path(probe).unlink(missing_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot write recordings into {folder}: "
                             f"{exc.strerror or exc}. Make it a writable folder, then "
                             "record again") from None
        if free_mb(folder) < MIN_FREE_RECORDINGS_MB:
            raise UsageError(f"{folder} has {free_mb(folder):.0f} MB free; a recording "
                             "is staged beside the old one and needs "
                             f"{MIN_FREE_RECORDINGS_MB} MB or more there. Free some space, "
                             "then record again")
    for path in chapters.values():
        for target in (book.recording_path(path), book.artifacts_path(path)):
            if target.is_symlink():
                raise UsageError(f"{target} is a link (to {os.readlink(target)}); a "
                                 "recording is written as plain files in its folder. "
                                 f"Remove the link (rm {target}), then record again")
    tmp = Path(tempfile.gettempdir())
    if free_mb(tmp) < MIN_FREE_TMP_MB:
        raise UsageError(f"the temporary folder {tmp} has {free_mb(tmp):.0f} MB free; a "
                         "recording writes its profiler traces and compiled kernels there "
                         f"and needs {MIN_FREE_TMP_MB} MB or more. Free some space, or set "
                         "TMPDIR to a folder with room")
