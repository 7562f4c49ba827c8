"""Shared test setup: GPU-only tests are marked `gpu` and skip cleanly without CUDA; the
book is built at most once per test session (`built_book`)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (runs on the recording GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The site, built once per session with `jupyter-book build <repo> --path-output <tmp>`
    (the repository is not written to). Returns the html folder; the build's output is in
    build.log two levels above it."""
    out = tmp_path_factory.mktemp("book")
    proc = subprocess.run(
        [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
         "build", str(ROOT), "--path-output", str(out)],
        cwd=out, capture_output=True, text=True)
    (out / "build.log").write_text(proc.stdout + proc.stderr, encoding="utf8")
    if proc.returncode != 0:
        pytest.fail(f"jupyter-book build failed:\n{(proc.stdout + proc.stderr)[-5000:]}",
                    pytrace=False)
    return out / "_build" / "html"
