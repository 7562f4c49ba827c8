"""Record chapters on the GPU: `python -m gpuinfer.record [chapter ...] [--allow-cpu]`.

Each chapter (default: every chapter of the TOC) is executed in a fresh Jupyter kernel, with
`book/` as its working directory and GPUINFER_ARTIFACTS pointing at a scratch folder. Only
when every cell succeeded is anything written: the executed notebook, with its provenance in
metadata["gpuinfer"], replaces `book/_recorded/<chapter>.ipynb` atomically, and the
artifacts (JSON traces gzipped) replace `book/_recorded/<chapter>/`. A failing cell, Ctrl-C
or a kill leaves the previous recording byte-identical.

Without a CUDA device it refuses to record, unless --allow-cpu: a CPU *smoke* recording,
labelled as such, which the book's tests reject. It exists to try the mechanism.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpuinfer import recordings

REPO_ROOT = recordings.PACKAGE_DIR.parent.parent  # code/gpuinfer -> the repository
JUPYTER_PACKAGES = ("nbclient", "nbformat", "jupytext", "ipykernel", "myst_nb")
CELL_TIMEOUT_S = 900
SIZE_LIMIT_MB = 20  # all recordings together, in the repository
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class UsageError(Exception):
    """Bad input: exit code 2 and a message that names the fix."""


@dataclass
class Result:
    chapter: str
    ok: bool
    seconds: float
    note: str  # "recorded, 1.2 MB" or why it failed


def log(msg: str) -> None:
    print(msg, flush=True)


def missing_packages() -> list[str]:
    missing = []
    for name in JUPYTER_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def select_chapters(root: Path, names: list[str]) -> dict[str, Path]:
    """The chapters named on the command line (a stem, a path, or a unique prefix like 01)."""
    known = recordings.chapters(root)
    if not known:
        raise UsageError(f"no chapters (MyST notebooks) in {root / '_toc.yml'}")
    if not names:
        return known
    chosen = {}
    for name in names:
        stem = Path(name).stem
        matches = [stem] if stem in known else [c for c in known if c.startswith(stem)]
        if len(matches) != 1:
            raise UsageError(f"unknown chapter {name!r}. The chapters are: {', '.join(known)}")
        chosen[matches[0]] = known[matches[0]]
    return chosen


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (e.g. from `timeout`) cleans up like Ctrl-C


# --- executing one chapter ---------------------------------------------------------------

def execute(chapter: str, nb, cwd: Path, artifacts: Path) -> None:
    """Run notebook nb in a fresh kernel, in place, showing progress. Raises nbclient's
    CellExecutionError (which holds the cell and its traceback) when a cell fails."""
    from nbclient import NotebookClient

    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    start = time.perf_counter()

    def on_cell_execute(cell, cell_index):
        first_line = cell.source.strip().splitlines()[0][:60]
        log(f"[{chapter} {time.perf_counter() - start:6.1f} s] cell "
            f"{code.index(cell_index) + 1}/{len(code)}: {first_line}")

    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, record_timing=False, on_cell_execute=on_cell_execute,
        resources={"metadata": {"path": str(cwd)}},
    )
    old = os.environ.get("GPUINFER_ARTIFACTS")
    os.environ["GPUINFER_ARTIFACTS"] = str(artifacts)  # the kernel inherits it
    try:
        client.execute()
    except Exception as exc:
        # During execution nbclient handles Ctrl-C/SIGTERM itself: it shuts the kernel down,
        # which then fails the run with some other error. This attribute says it did that.
        if getattr(client, "_async_cleanup_kernel_future", None) is not None:
            raise KeyboardInterrupt from exc
        raise
    finally:
        if old is None:
            os.environ.pop("GPUINFER_ARTIFACTS")
        else:
            os.environ["GPUINFER_ARTIFACTS"] = old


def strip(nb) -> None:
    """Keep the recording small and stable: no widget state, no jupytext bookkeeping."""
    for key in ("widgets", "jupytext"):
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            if WIDGET_MIME in out.get("data", {}):
                del out["data"][WIDGET_MIME]


def _atomic_write(path: Path, data: bytes) -> None:
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


def _stage_artifacts(chapter: str, scratch: Path, staged: Path) -> bool:
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


def _replace_dir(new: Path | None, dest: Path) -> None:
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


def record_chapter(chapter: str, path: Path, *, allow_cpu: bool = False) -> Result:
    import nbformat
    from nbclient.exceptions import CellExecutionError

    from gpuinfer.env import provenance

    rec = recordings.recording_path(path)
    nb = recordings.read_chapter(path)
    hashes = recordings.current_hashes(nb)  # of the code that runs, before it runs
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"gpuinfer-{chapter}-") as scratch:
        try:
            execute(chapter, nb, path.parent, Path(scratch))  # cwd: the chapter's folder
        except CellExecutionError as exc:
            seconds = time.perf_counter() - start
            tb = str(exc) if sys.stdout.isatty() else re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
            log(f"\n[{chapter}] FAILED after {seconds:.1f} s; the previous recording is "
                f"kept.\n{tb}\n")
            return Result(chapter, False, seconds, "failed: " + str(exc.ename or "error"))
        except Exception as exc:  # a dead kernel, a timeout, a bad notebook
            seconds = time.perf_counter() - start
            log(f"\n[{chapter}] FAILED after {seconds:.1f} s ({type(exc).__name__}: {exc}); "
                "the previous recording is kept.\n")
            return Result(chapter, False, seconds, f"failed: {type(exc).__name__}")
        seconds = time.perf_counter() - start

        strip(nb)
        meta = provenance()
        meta.update(hashes)
        meta.update(seconds=round(seconds, 1), allow_cpu=allow_cpu,
                    command=f"python -m gpuinfer.record {chapter}")
        nb.metadata[recordings.METADATA_KEY] = meta

        # Stage beside the recordings (same file system, so renames are atomic), then
        # commit; Ctrl-C/SIGTERM wait for the few renames of the commit, SIGKILL cannot.
        rec.parent.mkdir(exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=rec.parent, prefix=f".{chapter}.", suffix=".tmp"))
        try:
            wrote = _stage_artifacts(chapter, Path(scratch), staged)
            staged.chmod(0o755)  # mkdtemp makes it private
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                _replace_dir(staged if wrote else None, recordings.artifacts_path(path))
                _atomic_write(rec, nbformat.writes(nb).encode("utf8"))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already if it was committed
    size = rec.stat().st_size + sum(
        f.stat().st_size for f in recordings.artifacts_path(path).rglob("*") if f.is_file())
    label = " (CPU smoke recording)" if meta["smoke"] else ""
    return Result(chapter, True, seconds, f"recorded{label}, {size / 1e6:.2f} MB")


# --- the command ---------------------------------------------------------------------------

def summary(results: list[Result], root: Path) -> None:
    log("\n| chapter | result | seconds |\n|---|---|---|")
    for r in results:
        log(f"| {r.chapter} | {r.note} | {r.seconds:.1f} |")
    folders = {path.parent / "_recorded" for path in recordings.chapters(root).values()}
    total = sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file())
    over = f"  OVER THE {SIZE_LIMIT_MB} MB LIMIT" if total > SIZE_LIMIT_MB * 1e6 else ""
    log(f"\nAll recordings together: {total / 1e6:.2f} MB{over}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuinfer.record", description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*",
                        help="chapter stems, e.g. 01_roofline (default: every chapter)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="without CUDA, make a CPU smoke recording (rejected by the tests)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="the book's root folder, with _toc.yml (default: %(default)s)")
    args = parser.parse_args(argv)

    try:
        missing = missing_packages()
        if missing:
            raise UsageError(
                f"missing Python packages: {', '.join(missing)}. Install them with "
                "`pip install -r requirements.txt`; on the GPU machine (no network) run "
                "`bash scripts/gpu_record.sh`, which installs the wheels in .whl/.")
        chosen = select_chapters(args.root, args.chapters)
        import torch

        if not torch.cuda.is_available() and not args.allow_cpu:
            raise UsageError(
                "no CUDA device: the book's recordings must come from a GPU. Run this on the "
                "GPU machine, or pass --allow-cpu for a CPU smoke recording (labelled as such "
                "and rejected by the tests).")
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    old_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
    results, current = [], None
    try:
        for current, path in chosen.items():
            log(f"\n=== recording {current} ({path.relative_to(args.root)}) ===")
            results.append(record_chapter(current, path, allow_cpu=args.allow_cpu))
            current = None
    except KeyboardInterrupt:
        if current is not None:
            log(f"\nInterrupted: the previous recording of {current} is kept.")
            results.append(Result(current, False, 0.0, "interrupted"))
        summary(results, args.root)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    summary(results, args.root)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
