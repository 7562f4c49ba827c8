"""Reading a recording, and checking it for what would break its page.

A recording is the executed notebook of a chapter with its provenance in
`metadata["gpuinfer"]` (`METADATA_KEY`): the GPU and software it ran on, and the hashes of
gpuinfer.publish.hashes. It is checked for a notebook that nbformat does not validate, an
image that is not base64 and provenance missing; each problem is a ValueError that says what
is wrong and where.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

METADATA_KEY = "gpuinfer"  # where a recording keeps its provenance
REQUIRED_METADATA = ("smoke",)


def load_notebook(path: Path) -> dict:
    """A notebook file as the dict its JSON holds, once nbformat validates it; ValueError,
    saying what is wrong and where, when it is not one (not UTF-8, not JSON, nested past
    the parser's depth, not a valid nbformat 4 notebook), OSError when it cannot be read."""
    data = Path(path).read_bytes()
    try:
        raw = json.loads(data.decode("utf8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 (byte {exc.start})") from None
    except RecursionError:  # the parser nests one call per bracket
        raise ValueError("its JSON nests too deeply to be a notebook") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    _validate(raw)
    return raw


def read_recording(recording: Path):
    """The recording as an nbformat notebook, once checked (`load_notebook`, then
    `check_recording`); ValueError, saying what is wrong and where, when it is unreadable or
    damaged, OSError when it cannot be read at all."""
    import nbformat.v4

    raw = load_notebook(recording)  # before nbformat's reader, which trips on bad structure
    try:  # the parsed dict as nbformat's v4 reader turns it into a notebook (lines joined)
        nb = nbformat.v4.to_notebook_json(raw)
    except Exception as exc:  # valid, yet unreadable: say so rather than crash a build
        raise ValueError(f"not a readable notebook: {str(exc).splitlines()[0][:200]}") \
            from None
    check_recording(nb)
    return nb


def read_provenance(recording: Path) -> dict:
    """metadata["gpuinfer"] of a recording, once it is checked; ValueError/OSError when it
    is unreadable or damaged."""
    return read_recording(recording).metadata[METADATA_KEY]


def _where(path) -> str:
    """['cells', 3, 'outputs', 0, 'data'] -> 'cell 4, output 1, data'."""
    parts, names = list(path), {"cells": "cell", "outputs": "output"}
    shown = []
    while parts:
        key = parts.pop(0)
        if key in names and parts and isinstance(parts[0], int):
            shown.append(f"{names[key]} {parts.pop(0) + 1}")
        else:
            shown.append(str(key))
    return ", ".join(shown) or "the notebook"


def _validate(nb: dict) -> None:
    """ValueError, saying where, unless `nb` is a valid nbformat 4 notebook (outputs with
    their data, data of the right types, ...)."""
    import warnings

    import nbformat

    if not isinstance(nb, dict) or nb.get("nbformat") != 4:
        raise ValueError("not an nbformat 4 notebook")
    with warnings.catch_warnings():  # an old notebook's missing cell ids are not damage
        warnings.simplefilter("ignore")
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            where = _where(getattr(exc, "absolute_path", []))
            message = str(getattr(exc, "message", exc)).splitlines()[0][:200]
            raise ValueError(f"{where}: {message}") from None


def check_recording(nb) -> None:
    """Raise ValueError, saying where, if the recording (read, and valid as a notebook) is
    not one that renders: an image that is not base64, or provenance missing. Valid JSON
    can still be damaged inside; myst-nb would stop the build on it. (Whether its cells,
    outputs and files are those it recorded is gpuinfer.publish.recordings' question.)"""
    meta = nb.metadata.get(METADATA_KEY)
    if not isinstance(meta, dict):
        raise ValueError(f"no metadata['{METADATA_KEY}']")
    missing = [k for k in REQUIRED_METADATA if k not in meta]
    if missing:
        raise ValueError(f"metadata['{METADATA_KEY}'] lacks {', '.join(missing)}")
    for i, cell in enumerate(nb.cells, start=1):
        for j, out in enumerate(cell.get("outputs", []), start=1):
            for mime, value in out.get("data", {}).items():
                if mime.startswith("image/") and mime != "image/svg+xml":
                    try:
                        base64.b64decode("".join(value.split()), validate=True)
                    except (AttributeError, TypeError, ValueError):
                        raise ValueError(f"cell {i}, output {j}: its {mime} is not "
                                         "base64") from None
