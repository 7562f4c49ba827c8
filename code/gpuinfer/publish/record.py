"""Record chapters on the GPU:
`python -m gpuinfer.publish.record [chapter ...] [--allow-cpu]`.

The book is the one of the current directory (the nearest folder at or above it with a
`_toc.yml`), or `--root`. Each chapter (default: every chapter of the TOC) is executed in a
fresh Jupyter kernel, with the chapter's folder as its working directory and
GPUINFER_ARTIFACTS pointing at a scratch folder. Only when every cell succeeded is anything
written: the executed notebook, with its provenance and the hashes of its artifacts in
metadata["gpuinfer"], and the artifacts (JSON traces gzipped) replace
`book/_recorded/<chapter>.ipynb` and `book/_recorded/<chapter>/` together (see
gpuinfer.publish.store). A failing cell, a full disk, Ctrl-C or a kill leaves the previous
recording byte-identical, or, for a kill in the last milliseconds, a journal that the next
run (or `--recover`) completes. One recorder at a time writes into a book.

Without a CUDA device it refuses to record, unless --allow-cpu: a CPU *smoke* recording,
labelled as such, which the book's tests reject. It exists to try the mechanism.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpuinfer.publish import book, store
from gpuinfer.publish import cells as cellkinds
from gpuinfer.publish.measuring import execute, strip
from gpuinfer.publish.gpumem import PeakMemory
from gpuinfer.publish.hashes import current_hashes, outputs_hashes
from gpuinfer.publish.preflight import (UsageError, book_chapters, check_not_linked,
                                        check_writable, find_root, free_mb,
                                        missing_packages, recordings_folders,
                                        select_chapters)
from gpuinfer.publish.validation import METADATA_KEY

SIZE_LIMIT_MB = 20  # all recordings together, in the repository


@dataclass
class Result:
    chapter: str
    ok: bool
    seconds: float
    note: str  # "recorded, 1.2 MB" or why it failed
    written: int = 0  # bytes of the recording it wrote: the notebook and its artifacts


def log(msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def hold_and_recover(chapters: dict[str, Path]):
    """Hold the recordings folders for this run (one recorder at a time), and first finish
    or remove whatever an interrupted run left there."""
    with contextlib.ExitStack() as stack:
        for folder in recordings_folders(chapters):
            check_not_linked(folder)
            try:
                folder.mkdir(exist_ok=True)
            except OSError as exc:
                raise UsageError(f"cannot make the recordings folder {folder}: "
                                 f"{exc.strerror or exc}") from None
            try:
                stack.enter_context(store.lock(folder))
            except store.Busy:
                raise UsageError(f"another recorder is writing into {folder}; wait until "
                                 "it ends (two runs on one GPU would also disturb each "
                                 "other's timings), or stop it") from None
            for line in store.recover(folder):
                log(f"{folder}: {line}")
        from gpuinfer.env import remove_stale_scratch  # the scratch folders of killed runs

        for path in remove_stale_scratch():
            log(f"removed {path}, left by a run that was killed")
        yield


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (e.g. from `timeout`) cleans up like Ctrl-C


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (`timeout`, a job scheduler, `kill`) takes Ctrl-C's path while the command
    holds the book: staged files, scratch folders and the kernel are removed, and the
    previous recording stays. Its default action, a plain exit, would leave them all."""
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _tmp_full_hint() -> str:
    """A sentence for a failure when the temporary folder has (nearly) filled up during the
    run: a cell then fails with whatever error its library gives for a file it could not
    write (a FileNotFoundError for a trace, say)."""
    tmp = Path(tempfile.gettempdir())
    free = free_mb(tmp)
    if free >= 16:
        return ""
    return (f" The temporary folder {tmp} is full ({free:.0f} MB free), which is likely "
            "the cause: free some space, or set TMPDIR to a folder with room.")


def _failure(exc: Exception) -> str:
    """What went wrong, in words: a file error names its file, and a full disk (the write
    that filled it names the path) says what to do."""
    if not (isinstance(exc, OSError) and exc.strerror and exc.filename):
        return f"{type(exc).__name__}: {exc}"
    said = f"{exc.strerror}: {exc.filename}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        said += "; free some space on the disk that holds it, then record again"
    return said


def recorded_bytes(chapters: dict[str, Path]) -> int:
    """The bytes of the chapters' recordings: each notebook and its artifacts, the files the
    record command writes (not the folder's README, nor anything else put there)."""
    files = [f for path in chapters.values() for f in (
        [book.recording_path(path)] + sorted(book.artifacts_path(path).rglob("*")))]
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def record_chapter(chapter: str, path: Path, root: Path, *,
                   allow_cpu: bool = False) -> Result:
    """Execute one chapter and, if every cell succeeded, write its recording. Raises
    KeyboardInterrupt with the seconds it ran and whether the recording was written."""
    from nbclient.exceptions import CellExecutionError

    from gpuinfer.env import provenance, scratch_dir

    rec = book.recording_path(path)
    start = time.perf_counter()
    scratch = None
    try:
        # removed at exit, or by the next run if this one is killed
        scratch = Path(scratch_dir(f"record-{chapter}"))
        artifacts = scratch / "artifacts"
        artifacts.mkdir()
        nb = book.read_chapter(path)
        hashes = current_hashes(nb, root)  # of the code that runs, before it runs
        with PeakMemory() as memory:  # what a reader's GPU needs for this chapter
            cell_seconds = execute(chapter, nb, path.parent, artifacts,
                                   scratch / "kernel.json")
        seconds = time.perf_counter() - start
        strip(nb)
        meta = provenance()
        meta.update(hashes)
        meta.update(outputs=outputs_hashes(nb), seconds=round(seconds, 1),
                    cell_seconds={str(k): v for k, v in sorted(cell_seconds.items())},
                    peak_gpu_memory_gib=memory.peak_gib, allow_cpu=allow_cpu,
                    command=f"python -m gpuinfer.publish.record {chapter}")
        nb.metadata[METADATA_KEY] = meta
        store.commit(path, nb, artifacts)
    except store.InterruptedAfterCommit:
        log(f"[{chapter}] wrote {rec.resolve()}")
        raise KeyboardInterrupt(time.perf_counter() - start, True) from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(time.perf_counter() - start, False) from None
    except CellExecutionError as exc:
        seconds = time.perf_counter() - start
        tb = str(exc) if sys.stdout.isatty() else re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        log(f"\n[{chapter}] FAILED after {seconds:.1f} s; the previous recording is "
            f"kept.{_tmp_full_hint()}\n{tb}\n")
        return Result(chapter, False, seconds, "failed: " + str(exc.ename or "error"))
    except Exception as exc:  # a dead kernel, a timeout, a bad notebook, a full disk
        seconds = time.perf_counter() - start
        log(f"\n[{chapter}] FAILED after {seconds:.1f} s ({_failure(exc)}); the previous "
            f"recording is kept.{_tmp_full_hint()}\n")
        return Result(chapter, False, seconds, f"failed: {type(exc).__name__}")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    log(f"[{chapter}] wrote {rec.resolve()}")
    size = recorded_bytes({chapter: path})  # the commit replaced the pair whole
    label = " (CPU smoke recording)" if meta["smoke"] else ""
    return Result(chapter, True, seconds, f"recorded{label}, {size / 1e6:.2f} MB", size)


# --- the command --------------------------------------------------------------------------

def summary(results: list[Result], chapters: dict[str, Path]) -> None:
    """The table of the run, then the bytes it wrote and those of every recording of the
    book's `chapters` (what the repository keeps, against SIZE_LIMIT_MB)."""
    log("\n| chapter | result | seconds |\n|---|---|---|")
    for r in results:
        log(f"| {r.chapter} | {r.note} | {r.seconds:.1f} |")
    written, total = sum(r.written for r in results), recorded_bytes(chapters)
    over = f"  OVER THE {SIZE_LIMIT_MB} MB LIMIT" if total > SIZE_LIMIT_MB * 1e6 else ""
    log(f"\nThis run wrote {written / 1e6:.2f} MB; all recordings together: "
        f"{total / 1e6:.2f} MB{over}")


def _quiet_interrupted_kernel() -> None:
    """After Ctrl-C the kernel's client libraries log the errors of the kernel they were
    shut down with (ZMQError and the like): noise around the one message that matters."""
    for name in ("traitlets", "asyncio", "NotebookClient"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuinfer.publish.record", description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*",
                        help="chapter stems, e.g. 01_roofline (default: every chapter)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="without CUDA, make a CPU smoke recording (rejected by the "
                             "tests)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the book's root folder, with _toc.yml (default: the book of "
                             "the current directory)")
    parser.add_argument("--recover", action="store_true",
                        help="only finish writing a recording that a kill cut short, and "
                             "remove what interrupted runs left; record nothing")
    args = parser.parse_args(argv)

    try:
        missing = missing_packages()
        if missing:
            raise UsageError(
                f"missing Python packages: {', '.join(missing)}. Install them with "
                "`pip install -r requirements.txt`; on the GPU machine (no network) run "
                "`bash scripts/gpu_record.sh`, which installs the wheels in .whl/.")
        if args.root is not None and not args.root.is_dir():
            raise UsageError(f"--root {args.root}: not a folder; name the book's root "
                             "folder (the one with _toc.yml)")
        root = args.root.resolve() if args.root else find_root(Path.cwd())
        chosen = select_chapters(root, args.chapters)
        check_cells(root, chosen)
        if args.recover:
            with sigterm_as_interrupt(), hold_and_recover(book_chapters(root)):
                log(f"book: {root}: nothing else to recover")
            return 0
        import torch

        if not torch.cuda.is_available() and not args.allow_cpu:
            raise UsageError(
                "no CUDA device: the book's recordings must come from a GPU. Run this on "
                "the GPU machine, or pass --allow-cpu for a CPU smoke recording (labelled "
                "as such and rejected by the tests).")
        check_writable(chosen)
        with sigterm_as_interrupt(), hold_and_recover(chosen):
            return record_all(root, chosen, allow_cpu=args.allow_cpu)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a chapter's run (record_all reports those)
        log("\nInterrupted while no chapter was being recorded: every recording is whole "
            "(`--recover` finishes one whose earlier write a kill cut short).")
        return 130


def check_cells(root: Path, chosen: dict[str, Path]) -> None:
    """UsageError, naming the chapter and the cell, if a chosen chapter's cells break the
    rules of gpuinfer.publish.cells: found here, before a kernel starts."""
    for chapter, path in chosen.items():
        try:
            broken = cellkinds.problems(cellkinds.code_cells(book.read_chapter(path)))
        except SyntaxError as exc:
            broken = [str(exc)]
        if broken:
            shown = path.relative_to(root).as_posix()
            raise UsageError(f"{shown}: {broken[0]}" + (
                f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""))


def record_all(root: Path, chosen: dict[str, Path], *, allow_cpu: bool) -> int:
    """Record the chosen chapters one after the other; the exit code. Ctrl-C, or SIGTERM
    (which `main` turns into it), stops the run with 130, the interrupted chapter's
    previous recording kept."""
    log(f"book: {root}")
    every = book_chapters(root)  # the summary's total: read now, as the run starts
    results, current = [], None
    try:
        for current, path in chosen.items():
            log(f"\n=== recording {current} ({path.relative_to(root)}) ===")
            results.append(record_chapter(current, path, root, allow_cpu=allow_cpu))
            current = None
    except KeyboardInterrupt as interrupt:
        _quiet_interrupted_kernel()
        seconds, written = (interrupt.args + (0.0, False))[:2]
        if current is not None and written:
            log(f"\nInterrupted after {seconds:.1f} s, once the recording of {current} was "
                "written; the chapters after it were not recorded.")
            results.append(Result(current, True, seconds, "recorded, then interrupted"))
        elif current is not None:
            log(f"\nInterrupted after {seconds:.1f} s: the previous recording of {current} "
                "is kept.")
            results.append(Result(current, False, seconds, "interrupted"))
        summary(results, every)
        return 130
    summary(results, every)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
