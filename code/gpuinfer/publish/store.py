"""Writing a recording so that the notebook and its artifacts folder are replaced together:
a reader, a failed run or a killed one leaves the previous pair or the new one, never a mix.

In `book/_recorded/` a chapter's recording is `<chapter>.ipynb` with `<chapter>/` beside it
(the notebook's metadata holds the hashes of that folder's files). A commit:

1. stages the new pair beside them (same file system, so that renames are atomic):
   `.<chapter>.new.tmp/` and `.<chapter>.ipynb.new.tmp`, synced to disk. A failure here (a
   full disk, Ctrl-C) removes them: the previous recording was never touched.
2. writes the journal `.<chapter>.commit`, atomically. From here on the new pair wins.
3. renames: the old folder aside (`.<chapter>.old.tmp/`), the new folder in, the new
   notebook in; then removes the journal and the old folder.

Steps 2-3 run with Ctrl-C and SIGTERM held off (deferred by their handlers). A fault inside
step 3 undoes it (the old pair is put back); a kill cannot be caught, so it leaves the
journal, and `finish_interrupted` (run by the record command before anything else, under
the lock, and by its `--recover`) completes the renames, which are idempotent. Until then
the chapter reads as "unfinished", never as fresh. `tidy` removes what a killed run left
(`.*.tmp`). Only one recorder writes into a recordings folder at a time (`lock`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from gpuinfer.publish import book
from gpuinfer.publish.hashes import artifact_hashes
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.validation import METADATA_KEY

JOURNAL_TEXT = ("A recording of {chapter} is being written. If this file is still here, "
                "that write was cut short: `python -m gpuinfer.publish.record --recover` "
                "finishes it.\n")


class Busy(Exception):
    """Another recorder holds the recordings folder."""


class InterruptedAfterCommit(KeyboardInterrupt):
    """Ctrl-C or SIGTERM came while a commit held them off: the new recording is written."""


# --- files, synced ------------------------------------------------------------------------

@contextlib.contextmanager
def naming(path: Path):
    """An OSError raised while writing `path` names it: a write or a sync that fills the
    disk raises ENOSPC without a file name, and the record command's message must say
    which disk filled."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write a new file and sync it to disk (mode 0644). Removes it on failure."""
    try:
        with naming(path), open(path, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(path, 0o644)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    """Write a temp file in the same folder, then os.replace: readers see old or new."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with naming(tmp), os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove(path: Path) -> None:
    """Remove a file, a link or a folder, whichever `path` is; nothing if none is there."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path)


# --- where a commit's files go ------------------------------------------------------------

def _paths(chapter_path: Path) -> dict[str, Path]:
    folder = book.recording_path(chapter_path).parent
    stem = chapter_path.stem
    return {"notebook": book.recording_path(chapter_path),
            "artifacts": book.artifacts_path(chapter_path),
            "journal": book.journal_path(chapter_path),
            "new_notebook": folder / f".{stem}.ipynb.new.tmp",
            "new_artifacts": folder / f".{stem}.new.tmp",
            "old_artifacts": folder / f".{stem}.old.tmp"}


def stage_artifacts(chapter: str, scratch: Path, staged: Path) -> bool:
    """Copy what the chapter wrote under scratch into `staged` (an existing folder),
    gzipping JSON (profiler traces) but the kept values (data.json), each file synced; False when it wrote nothing.
    env.artifact_dir(chapter) writes into scratch/<chapter>/: those files go to the top."""
    files = [f for f in sorted(Path(scratch).rglob("*")) if f.is_file()]
    for f in files:
        rel = f.relative_to(scratch)
        if rel.parts[0] == chapter and len(rel.parts) > 1:
            rel = rel.relative_to(chapter)
        out = staged / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".json" and rel.as_posix() != DATA_FILE:  # data.json reads as is
            out = out.with_name(out.name + ".gz")
            with naming(out), open(f, "rb") as fin, open(out, "wb") as raw:
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                   filename=f.name) as fout:
                    shutil.copyfileobj(fin, fout)
                raw.flush()
                os.fsync(raw.fileno())
        else:
            write_synced(out, f.read_bytes())
    return bool(files)


# --- the commit ---------------------------------------------------------------------------

def _roll_forward(p: dict[str, Path]) -> None:
    """Step 3, from wherever an earlier attempt stopped: each rename happens once."""
    if p["new_artifacts"].exists():  # the new folder is not in place yet
        if p["artifacts"].exists() or p["artifacts"].is_symlink():
            os.replace(p["artifacts"], p["old_artifacts"])
        if any(p["new_artifacts"].iterdir()):
            os.replace(p["new_artifacts"], p["artifacts"])
        else:  # the new recording has no artifacts
            p["new_artifacts"].rmdir()
    if p["new_notebook"].exists():
        os.replace(p["new_notebook"], p["notebook"])
    # The new pair is in place. What is left only tidies: should it fail, the journal
    # stays, the chapter reads as unfinished, and recovery repeats these steps.
    for step in (lambda: _fsync_dir(p["notebook"].parent), p["journal"].unlink,
                 lambda: remove(p["old_artifacts"])):
        with contextlib.suppress(OSError):
            step()


def _roll_back(p: dict[str, Path]) -> None:
    """Undo step 3 after a fault inside it (the notebook is renamed last, so it is still the
    old one): the old folder back in place, the journal and the staged files gone."""
    if not p["new_notebook"].exists():
        return  # the commit is complete but for its tidying: keep the new pair
    if p["old_artifacts"].exists() or p["old_artifacts"].is_symlink():
        if not p["new_artifacts"].exists() and p["artifacts"].exists():
            os.replace(p["artifacts"], p["new_artifacts"])  # the new folder back out
        os.replace(p["old_artifacts"], p["artifacts"])
    elif not p["new_artifacts"].exists() and p["artifacts"].exists():
        os.replace(p["artifacts"], p["new_artifacts"])  # there was no old folder
    _fsync_dir(p["notebook"].parent)
    p["journal"].unlink(missing_ok=True)
    for key in ("new_artifacts", "new_notebook"):
        remove(p[key])


@contextlib.contextmanager
def _signals_held():
    """Hold off Ctrl-C and SIGTERM until the block ends, then deliver the first that came.
    Their handlers only note them meanwhile: Python runs handlers in the main thread,
    whichever thread the system hands the signal to, whereas a thread's signal mask
    (pthread_sigmask) leaves the signal to any other thread, torch's among them. Off the
    main thread no handler runs there anyway, and nothing needs holding."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    held = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum))
            for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        for signum in arrived[:1]:
            if callable(held[signum]):
                held[signum](signum, None)
            elif held[signum] == signal.SIG_DFL:
                signal.raise_signal(signum)


def commit(chapter_path: Path, notebook, scratch: Path) -> None:
    """Write the recording of the chapter at `chapter_path`: the nbformat notebook, with the
    hashes of its artifacts added to metadata["gpuinfer"]["artifacts"], and the artifacts
    the run wrote under `scratch`. The old pair or the new, never a mix (see the module)."""
    import nbformat

    p = _paths(chapter_path)
    finish_interrupted(chapter_path)
    for key in ("new_notebook", "new_artifacts", "old_artifacts"):
        remove(p[key])
    try:
        p["new_artifacts"].mkdir()
        stage_artifacts(chapter_path.stem, scratch, p["new_artifacts"])
        os.chmod(p["new_artifacts"], 0o755)
        hashes = artifact_hashes(p["new_artifacts"])
        notebook.metadata[METADATA_KEY]["artifacts"] = hashes
        write_synced(p["new_notebook"], nbformat.writes(notebook).encode("utf8"))
        _fsync_dir(p["notebook"].parent)
    except BaseException:
        for key in ("new_notebook", "new_artifacts"):
            remove(p[key])
        raise
    committed = False
    try:
        with _signals_held():
            try:
                atomic_write(p["journal"], JOURNAL_TEXT.format(
                    chapter=chapter_path.stem).encode("utf8"))
                _fsync_dir(p["notebook"].parent)
                _roll_forward(p)
            except BaseException:
                _roll_back(p)
                raise
            committed = True
    except KeyboardInterrupt:
        if committed:  # delivered as the signals were released
            raise InterruptedAfterCommit from None
        raise


# --- after a kill -------------------------------------------------------------------------

def finish_interrupted(chapter_path: Path) -> bool:
    """Complete a commit that a kill cut short after its journal was written (the caller
    holds the lock). True if there was one."""
    p = _paths(chapter_path)
    if not p["journal"].exists():
        return False
    _roll_forward(p)
    return True


def recover(folder: Path) -> list[str]:
    """In a recordings folder (the caller holds its lock): finish every commit a kill cut
    short, then remove every leftover (`tidy`). Returns what it did, a line each."""
    done = []
    for journal in sorted(Path(folder).glob(".*.commit")):
        stem = journal.name[1:-len(".commit")]
        finish_interrupted(Path(folder).parent / f"{stem}.md")
        done.append(f"finished writing the recording of {stem}, which a kill had cut short")
    done += [f"removed {path.name}, left by an earlier run" for path in tidy(folder)]
    return done


def tidy(folder: Path) -> list[Path]:
    """Remove what killed runs left in a recordings folder (the caller holds the lock, and
    has finished interrupted commits first): staged files, set-aside folders, temp files,
    all named `.*.tmp`. Returns what it removed."""
    removed = []
    for path in sorted(Path(folder).glob(".*.tmp")):
        remove(path)
        removed.append(path)
    return removed


@contextlib.contextmanager
def lock(folder: Path):
    """Hold the recordings folder for one recorder: Busy if another holds it. The lock is
    the folder's own (flock), so nothing is left behind, even by a kill."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise Busy(str(folder)) from None
            # a file system without locks: record without one
        yield
    finally:
        os.close(fd)
