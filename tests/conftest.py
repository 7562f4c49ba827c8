"""Shared test setup: GPU-only tests are marked `gpu` and skip cleanly without CUDA; the
book is built at most once per test session (`built_book`)."""

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def recorded_files(root: Path) -> dict[str, bytes]:
    """Every file under the book's book/_recorded/, by path there, with its bytes: what
    "the recording is intact, byte for byte" compares."""
    folder = root / "book" / "_recorded"
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def book_chapters(root: Path, with_drafts: bool = False) -> tuple[dict[str, Path], str | None]:
    """The book's chapters (and drafts), or none and the one-line BookError that says why
    they cannot be read: a test module lists its cases from this at collection time, and a
    test fails with the message, instead of the collection stopping on a traceback."""
    from gpuinfer.publish import book

    try:
        found = book.chapters(root)
        return ({**found, **book.drafts(root)} if with_drafts else found), None
    except book.BookError as exc:
        return {}, str(exc)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (runs on the recording GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Build:
    """A finished `jupyter-book build`: its html folder, its log (no colour codes), its time."""

    html: Path
    log: str
    seconds: float


def jupyter_book_build(root: Path, out: Path | None = None) -> Build:
    """`jupyter-book build root [--path-output out]`, failing the test if the build fails."""
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
           "build", str(root)] + (["--path-output", str(out)] if out else [])
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out or root, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    log = ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"jupyter-book build of {root} failed:\n{log[-5000:]}", pytrace=False)
    return Build((out or root) / "_build" / "html", log, seconds)


BUILD_SECONDS = []  # the session's build of the book, for the end of the run to print


@pytest.fixture(scope="session")
def book_build(tmp_path_factory) -> Build:
    """The real book, built once per test session from a clean _build into a temporary
    folder (the repository is not written to); its log is also in build.log beside _build."""
    out = tmp_path_factory.mktemp("book")
    built = jupyter_book_build(ROOT, out)
    (out / "build.log").write_text(built.log, encoding="utf8")
    BUILD_SECONDS.append(built.seconds)
    return built


def pytest_terminal_summary(terminalreporter):
    """The seconds the book's build took, printed, never asserted: a benchmark (the README
    keeps it), which a busy machine slows without anything being wrong."""
    for seconds in BUILD_SECONDS:
        terminalreporter.write_line(f"jupyter-book build of the book, from a clean _build: "
                                    f"{seconds:.1f} s")


@pytest.fixture(scope="session")
def built_book(book_build) -> Path:
    """The html folder of the session's build of the book."""
    return book_build.html


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """A small Llama (the 1B structure shrunk: grouped-query heads 4/2, tied embeddings),
    trained a few steps on a repeating sequence, saved with save_pretrained: a checkpoint
    folder whose greedy text is not one token repeated, as a random model's may be."""
    from gpuinfer.model.configs import build_model, model_config
    from gpuinfer.model.train import train

    model = build_model(model_config("reduced"), seed=0)
    tokens = torch.arange(64).repeat(40) % model.config.vocab_size
    train(model, tokens, steps=20, batch=4, seq_len=32, lr=3e-3, warmup=2)
    folder = tmp_path_factory.mktemp("checkpoint")
    model.eval().save_pretrained(folder)
    return folder
