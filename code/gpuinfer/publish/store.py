"""Writing a recording so that a reader, or a failed run, sees the old one or the new one,
never a mix: the notebook by one atomic rename, its artifacts folder by two, staged beside
the recordings (the same file system) and committed with Ctrl-C and SIGTERM held off."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import tempfile
from pathlib import Path

from gpuinfer.publish import recordings


def atomic_write(path: Path, data: bytes) -> None:
    """Write a temp file in the same folder, then os.replace: readers see old or new."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def stage_artifacts(chapter: str, scratch: Path, staged: Path) -> bool:
    """Copy what the chapter wrote under scratch into `staged`, gzipping JSON (profiler
    traces); False when it wrote nothing. env.artifact_dir(chapter) writes into
    scratch/<chapter>/: those files go to the top of `staged`."""
    files = [f for f in sorted(scratch.rglob("*")) if f.is_file()]
    for f in files:
        rel = f.relative_to(scratch)
        if rel.parts[0] == chapter and len(rel.parts) > 1:
            rel = rel.relative_to(chapter)
        out = staged / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".json":
            with open(f, "rb") as fin, gzip.GzipFile(f"{out}.gz", "wb", mtime=0) as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copyfile(f, out)
    return bool(files)


def replace_dir(new: Path | None, dest: Path) -> None:
    """Put `new` at `dest` (or remove dest when new is None) by renames, old one last."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old.tmp")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    if new is not None:
        os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old)


def commit(chapter: str, notebook: str, scratch: Path, path: Path) -> None:
    """Write the recording and its artifacts. Staged beside the recordings (same file
    system, so renames are atomic); Ctrl-C/SIGTERM wait for the few renames of the commit,
    SIGKILL cannot."""
    rec = recordings.recording_path(path)
    staged = Path(tempfile.mkdtemp(dir=rec.parent, prefix=f".{chapter}.", suffix=".tmp"))
    try:
        wrote = stage_artifacts(chapter, scratch, staged)
        staged.chmod(0o755)  # mkdtemp makes it private
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            replace_dir(staged if wrote else None, recordings.artifacts_path(path))
            atomic_write(rec, notebook.encode("utf8"))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone already if it was committed
