"""Running a chapter's measurement cells, as the record command does: in a fresh Jupyter
kernel, presentation cells skipped, and right after each measurement cell that precedes
presentation cells, what they read kept in data.json (gpuinfer.publish.kept), so that the
build can run them later from the recording. The smoke tests run chapters the same way.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

from gpuinfer.publish import cells as cellkinds

CELL_TIMEOUT_S = 900
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def log(msg: str) -> None:
    print(msg, flush=True)


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
    # nbclient puts SIGTERM back to the default action (a plain kill) when it is done:
    # the caller's handler, which cleans up as Ctrl-C does, is restored below.
    on_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
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
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
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
