"""What a recording is checked against: the hashes of what produced it and of what it holds.

A recording keeps, in its provenance (`metadata["gpuinfer"]`, see
gpuinfer.publish.validation), with `format` FORMAT:

- cells: one hash per measurement cell (gpuinfer.publish.cells), as Python parses it: a
  comment or blank-line edit keeps a recording valid, and the page shows the edited cell
  beside the recorded outputs; presentation cells do not count;
- definitions: the package definitions those cells reach, each hashed as parsed
  (gpuinfer.publish.reach says what "reach" means; comments and docstrings never count);
- recorder: the recorder's own set-up, the same for every chapter: the code that starts
  the kernel and runs in it, gpu_record.sh, the start-up hooks, the requirement pins
  (gpuinfer.publish.recorder);
- outputs: one hash per measurement cell of the outputs it recorded, so that a number
  edited in the notebook makes the recording stale;
- artifacts: each file of `_recorded/<stem>/` (profiler traces, the values kept for the
  presentation cells in data.json), so that a missing, altered or extra file makes it stale.

A recording without them (made before this format) is stale: it is never trusted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpuinfer.publish import reach
from gpuinfer.publish.cells import measurement_cells
from gpuinfer.publish.recorder import recorder_hashes
from gpuinfer.publish.sources import PACKAGE_DIR


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FORMAT = 2  # of a recording's provenance; older recordings are stale


def measurement_sources(nb) -> list[str]:
    """The sources of nb's measurement cells, in order."""
    return [cell.source for _, cell in measurement_cells(nb)]


def _joined(value):
    """Output data as nbformat reads it back: multi-line strings joined."""
    if isinstance(value, dict):
        return {k: _joined(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "".join(value)
    if isinstance(value, list):
        return [_joined(v) for v in value]
    return value


def outputs_hashes(nb) -> list[str]:
    """One hash per measurement cell, of its outputs (and nothing else of the cell)."""
    return [_sha256(json.dumps(_joined(cell.get("outputs", [])), sort_keys=True).encode())
            for _, cell in measurement_cells(nb)]


def shown_text(nb) -> str:
    """The chapter's prose, where its `literalinclude`s are."""
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def current_hashes(nb, root: Path, package_dir: Path = PACKAGE_DIR) -> dict:
    """What a recording of notebook `nb` (a chapter of the book at `root`) made now would
    store of its code: the format, the measurement cells' hashes, the package definitions
    they (and the page's literalincludes) reach, with their hashes
    (gpuinfer.publish.reach), and the recorder's set-up (gpuinfer.publish.recorder)."""
    sources = measurement_sources(nb)
    return {"format": FORMAT, "cells": reach.cells_hashes(sources),
            "definitions": reach.definitions(sources, reach.shown(shown_text(nb)),
                                             reach.TreeSources(package_dir)),
            "recorder": recorder_hashes(root, package_dir)}


def artifact_hashes(folder: Path) -> dict[str, str]:
    """{path under folder: sha256} of every file in an artifacts folder ({} when there is
    none). A link counts as a file named `-> target`, so that it matches no recording."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return {"": "-> " + str(folder.readlink())} if folder.is_symlink() else {}
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            found[rel] = _sha256(path.read_bytes())
    return found


def artifacts_differ(recorded: dict[str, str], now: dict[str, str]) -> str | None:
    """None when the artifacts on disk are those recorded; else what differs, in words."""
    if recorded == now:
        return None
    missing = sorted(set(recorded) - set(now))
    extra = sorted(set(now) - set(recorded))
    changed = sorted(k for k in set(recorded) & set(now) if recorded[k] != now[k])
    parts = [f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
             for label, names in (("missing:", missing), ("altered:", changed),
                                  ("not from the recording:", extra)) if names]
    return "; ".join(parts)
