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
import logging
import os
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
from gpuinfer.publish.gpumem import PeakMemory
from gpuinfer.publish.hashes import current_hashes, outputs_hashes
from gpuinfer.publish.preflight import (UsageError, book_chapters, check_writable,
                                        find_root, free_mb, missing_packages,
                                        recordings_folders, select_chapters)
from gpuinfer.publish.validation import METADATA_KEY

CELL_TIMEOUT_S = 900
SIZE_LIMIT_MB = 20  # all recordings together, in the repository
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@dataclass
class Result:
    chapter: str
    ok: bool
    seconds: float
    note: str  # "recorded, 1.2 MB" or why it failed


def log(msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def hold_and_recover(chapters: dict[str, Path]):
    """Hold the recordings folders for this run (one recorder at a time), and first finish
    or remove whatever an interrupted run left there."""
    with contextlib.ExitStack() as stack:
        for folder in recordings_folders(chapters):
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


# --- executing one chapter ---------------------------------------------------------------

def _keep_source(after: int, readers: dict[str, str], folder: Path) -> str:
    return (f"__import__('gpuinfer.publish.kept', fromlist=['keep']).keep({after}, "
            f"{readers!r}, globals(), {str(folder)!r})")


def measuring_client(nb, cwd: Path, folder: Path, on_cell_execute=None):
    """An nbclient client that runs nb's measurement cells and skips its presentation
    cells; right after each measurement cell that precedes presentation cells, it keeps
    (gpuinfer.publish.kept) what they read, in `folder`/data.json. Raises ValueError,
    naming the cell, when the chapter breaks a rule of gpuinfer.publish.cells."""
    import nbformat
    from nbclient import NotebookClient

    analysed = cellkinds.code_cells(nb)
    broken = cellkinds.problems(analysed)
    if broken:
        raise ValueError("; ".join(broken))
    readers = cellkinds.kept_names(analysed)
    index_of = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    keeps = {index_of[after - 1]: _keep_source(after, names, folder)
             for after, names in readers.items() if after > 0}

    class Measuring(NotebookClient):
        async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                     store_history=True):
            cell = await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
            if cell is self.nb.cells[cell_index] and cell_index in keeps:
                await super().async_execute_cell(
                    nbformat.v4.new_code_cell(keeps[cell_index]), cell_index,
                    store_history=False)
                self.nb.cells[cell_index] = cell  # nbclient put the keeping there
            return cell

    return Measuring(nb, timeout=CELL_TIMEOUT_S, record_timing=False,
                     skip_cells_with_tag=cellkinds.PRESENTATION,
                     on_cell_execute=on_cell_execute,
                     resources={"metadata": {"path": str(cwd)}})


def execute(chapter: str, nb, cwd: Path, artifacts: Path, connection_file: Path) -> dict:
    """Run notebook nb's measurement cells in a fresh kernel, in place, showing progress,
    keeping what its presentation cells read in artifacts/<chapter>/data.json; returns
    {code cell number: seconds} of the cells it ran. Raises nbclient's CellExecutionError
    (which holds the cell and its traceback) when a cell fails, and KeyboardInterrupt,
    after the kernel is shut down, on Ctrl-C or SIGTERM. The kernel's connection file (it
    holds the kernel's key) goes to `connection_file`, in this run's scratch folder, which
    the next run removes if a kill leaves it."""
    from nbclient.exceptions import CellExecutionError

    numbers = {i: n + 1 for n, i in enumerate(
        i for i, c in enumerate(nb.cells) if c.cell_type == "code")}
    measured = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and
                c.source.strip() and not cellkinds.is_presentation(c)]
    start = time.perf_counter()
    seconds, started = {}, {}

    def on_cell_execute(cell, cell_index):
        if cell is not nb.cells[cell_index]:
            return  # the keeping of values, not a cell of the chapter
        now = time.perf_counter()
        for i, t in started.items():
            seconds[numbers[i]] = round(now - t, 1)
        started.clear()
        started[cell_index] = now
        first_line = cell.source.strip().splitlines()[0][:60]
        log(f"[{chapter} {now - start:6.1f} s] cell "
            f"{measured.index(cell_index) + 1}/{len(measured)}: {first_line}")

    client = measuring_client(nb, cwd, artifacts / chapter, on_cell_execute)
    client.km = client.create_kernel_manager()
    client.km.connection_file = str(connection_file)  # not the system's temporary folder
    old = os.environ.get("GPUINFER_ARTIFACTS")
    os.environ["GPUINFER_ARTIFACTS"] = str(artifacts)  # the kernel inherits it
    # The kernel's own log (its start-up warnings, and the errors it logs when it is shut
    # down mid-cell) goes to a file, shown only when the kernel itself fails.
    kernel_log = tempfile.TemporaryFile("w+", encoding="utf8")
    try:
        client.execute(stderr=kernel_log)
    except BaseException as exc:
        # During execution nbclient handles Ctrl-C/SIGTERM itself: it shuts the kernel down,
        # which then fails the run with some other error (a ZMQError, an AssertionError).
        # This attribute says it did that: report the interrupt, not that error.
        if getattr(client, "_async_cleanup_kernel_future", None) is not None or \
                isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        if not isinstance(exc, CellExecutionError):  # the kernel died: say what it said
            kernel_log.seek(0)
            log(f"[{chapter}] the kernel's log:\n{dying_words(kernel_log.read())}")
        raise
    finally:
        kernel_log.close()
        for i, t in started.items():
            seconds[numbers[i]] = round(time.perf_counter() - t, 1)
        if old is None:
            os.environ.pop("GPUINFER_ARTIFACTS")
        else:
            os.environ["GPUINFER_ARTIFACTS"] = old
    return seconds


def dying_words(text: str, most: int = 20_000) -> str:
    """What a dead kernel's log says about its death: from Python's "Fatal Python error"
    (faulthandler's stack of every thread, where a chapter enabled it) on, without the
    list of every loaded extension module that ends it; else the log's last 4,000
    characters."""
    fatal = text.find("Fatal Python error")
    if fatal < 0:
        return text[-4000:]
    return re.sub(r"\nExtension modules:[^\n]*", "", text[fatal:])[:most]


def strip(nb) -> None:
    """Keep the recording small and stable: no widget state, no jupytext bookkeeping."""
    for key in ("widgets", "jupytext"):
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if WIDGET_MIME in out.get("data", {}):
                del out["data"][WIDGET_MIME]


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


def record_chapter(chapter: str, path: Path, *, allow_cpu: bool = False) -> Result:
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
        hashes = current_hashes(nb)  # of the code that runs, before it runs
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
        said = (f"{exc.strerror}: {exc.filename}"
                if isinstance(exc, OSError) and exc.strerror and exc.filename
                else f"{type(exc).__name__}: {exc}")
        log(f"\n[{chapter}] FAILED after {seconds:.1f} s ({said}); the previous recording "
            f"is kept.{_tmp_full_hint()}\n")
        return Result(chapter, False, seconds, f"failed: {type(exc).__name__}")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    log(f"[{chapter}] wrote {rec.resolve()}")
    size = rec.stat().st_size + sum(
        f.stat().st_size for f in book.artifacts_path(path).rglob("*") if f.is_file())
    label = " (CPU smoke recording)" if meta["smoke"] else ""
    return Result(chapter, True, seconds, f"recorded{label}, {size / 1e6:.2f} MB")


# --- the command --------------------------------------------------------------------------

def summary(results: list[Result], chosen: dict[str, Path]) -> None:
    log("\n| chapter | result | seconds |\n|---|---|---|")
    for r in results:
        log(f"| {r.chapter} | {r.note} | {r.seconds:.1f} |")
    total = sum(f.stat().st_size for folder in recordings_folders(chosen) if folder.is_dir()
                for f in folder.rglob("*") if f.is_file())
    over = f"  OVER THE {SIZE_LIMIT_MB} MB LIMIT" if total > SIZE_LIMIT_MB * 1e6 else ""
    log(f"\nAll recordings together: {total / 1e6:.2f} MB{over}")


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
            with hold_and_recover(book_chapters(root)):
                log(f"book: {root}: nothing else to recover")
            return 0
        import torch

        if not torch.cuda.is_available() and not args.allow_cpu:
            raise UsageError(
                "no CUDA device: the book's recordings must come from a GPU. Run this on "
                "the GPU machine, or pass --allow-cpu for a CPU smoke recording (labelled "
                "as such and rejected by the tests).")
        check_writable(chosen)
        with hold_and_recover(chosen):
            return record_all(root, chosen, allow_cpu=args.allow_cpu)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


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
    """Record the chosen chapters one after the other; the exit code."""
    log(f"book: {root}")
    old_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
    results, current = [], None
    try:
        for current, path in chosen.items():
            log(f"\n=== recording {current} ({path.relative_to(root)}) ===")
            results.append(record_chapter(current, path, allow_cpu=allow_cpu))
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
        summary(results, chosen)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    summary(results, chosen)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
