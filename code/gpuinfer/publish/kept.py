"""The values a recording keeps for its presentation cells: `data.json`, as plain JSON.

The record command skips presentation cells (gpuinfer.publish.cells). Right after a
measurement cell that precedes some, it runs `keep` in the chapter's kernel: the names
those presentation cells read are encoded and added to `data.json` in the chapter's
artifacts, which become `book/_recorded/<chapter>/data.json`, hashed with the recording
like its traces. At build time `restore` puts them back, at the same place, into the
kernel that runs the presentation cells (gpuinfer.publish.present).

What can be kept: None, bools, numbers and strings; lists, tuples, sets and dicts of them
(any keys of these kinds); numpy arrays and scalars; torch tensors (kept on the CPU, as
lists: keep them small) and dtypes; instances of the package's dataclasses and enums; and
modules, functions and classes that can be imported by name (`np`, `glue`,
`gpuinfer.report.plots.roofline_plot`), kept as that name. Anything else, a function
defined in a chapter's cell, a model, a figure, is refused with a message naming the
presentation cell that reads it: compute what it needs in a measurement cell.

Plain values stay plain in the file (a dict of strings, a list of floats), so that it reads
as what was measured; others are objects with one key starting with `$`.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import os
from pathlib import Path

DATA_FILE = "data.json"  # in the chapter's artifacts folder
FORMAT = 1


class Unkeepable(TypeError):
    """A value that `data.json` cannot hold."""


def _qualified(obj) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _imported(ref: str):
    module, _, qualname = ref.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split(".") if qualname else []:
        obj = getattr(obj, part)
    return obj


def _importable(obj) -> str | None:
    """'module:qualname' that imports `obj` itself, or None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if _imported(f"{module}:{qualname}") is obj else None
    except (ImportError, AttributeError):
        return None


def encode(value, what: str):
    """`value` as JSON-able data; Unkeepable, naming `what`, if it cannot be kept."""
    import numpy as np

    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, np.generic):  # before float: np.float64 is a float too
        return {"$numpy": value.item(), "dtype": str(value.dtype)}
    if isinstance(value, enum.Enum) and _importable(type(value)):
        return {"$enum": _qualified(type(value)), "name": value.name}
    for plain in (bool, int, float, str):  # a subclass of one: keep the plain value
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, list):
        return [encode(v, what) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {"$tuple": [encode(v, what) for v in value]}
    if isinstance(value, (set, frozenset)):
        key = "$set" if isinstance(value, set) else "$frozenset"
        return {key: [encode(v, what) for v in sorted(value, key=repr)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v, what) for k, v in value.items()}
        return {"$dict": [[encode(k, what), encode(v, what)] for k, v in value.items()]}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise Unkeepable(f"{what} is a numpy array of Python objects")
        return {"$ndarray": value.tolist(), "dtype": str(value.dtype),
                "shape": list(value.shape)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        ref = _importable(type(value))
        if ref is None or not ref.startswith("gpuinfer."):
            raise Unkeepable(f"{what} is a {type(value).__qualname__}, a dataclass from "
                             "outside the package or defined in the chapter")
        return {"$dataclass": ref, "fields": {
            f.name: encode(getattr(value, f.name), f"{what}.{f.name}")
            for f in dataclasses.fields(value)}}
    torch_kept = _encode_torch(value, what)
    if torch_kept is not None:
        return torch_kept
    if type(value).__name__ == "module":
        return {"$module": value.__name__}
    ref = _importable(value) if callable(value) else None
    if ref is not None:
        return {"$import": ref}
    if type(value).__module__.startswith("IPython.") and hasattr(value, "data") and \
            type(value).__name__ in ("Markdown", "HTML", "Latex"):
        return {"$display": _qualified(type(value)), "data": value.data}
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if callable(value):
        raise Unkeepable(f"{what} is {kind}, defined in the chapter: a presentation cell "
                         "cannot call what a measurement cell defined; define it in a "
                         "presentation cell or in the package")
    raise Unkeepable(f"{what} is a {kind}, which a recording cannot keep")


def _encode_torch(value, what: str):
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(value, torch.Tensor):
        cpu = value.detach().cpu()
        return {"$tensor": cpu.tolist(), "dtype": str(cpu.dtype).removeprefix("torch."),
                "shape": list(cpu.shape)}
    if isinstance(value, torch.dtype):
        return {"$torch_dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        raise Unkeepable(f"{what} is a torch.device: a presentation cell has no device")
    return None


def decode(data):
    """The value `encode` kept."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    tag = next((k for k in data if k.startswith("$")), None)
    if tag is None:
        return {k: decode(v) for k, v in data.items()}
    body = data[tag]
    if tag == "$tuple":
        return tuple(decode(v) for v in body)
    if tag in ("$set", "$frozenset"):
        return (set if tag == "$set" else frozenset)(decode(v) for v in body)
    if tag == "$dict":
        return {_hashable(decode(k)): decode(v) for k, v in body}
    if tag == "$ndarray":
        import numpy as np

        return np.array(body, dtype=data["dtype"]).reshape(data["shape"])
    if tag == "$numpy":
        import numpy as np

        return np.dtype(data["dtype"]).type(body)
    if tag == "$dataclass":
        cls = _imported(body)
        obj = object.__new__(cls)
        for name, value in data["fields"].items():
            object.__setattr__(obj, name, decode(value))
        return obj
    if tag == "$enum":
        return _imported(body)[data["name"]]
    if tag == "$tensor":
        import torch

        return torch.tensor(body, dtype=getattr(torch, data["dtype"])).reshape(
            data["shape"])
    if tag == "$torch_dtype":
        import torch

        return getattr(torch, body)
    if tag == "$module":
        return importlib.import_module(body)
    if tag == "$import":
        return _imported(body)
    if tag == "$display":
        return _imported(body)(data["data"])
    raise ValueError(f"unknown kept value {tag}")


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def keep(after: int, readers: dict[str, str], namespace: dict, folder: str) -> None:
    """In the recorded kernel, right after measurement cell `after` (0: before any): add
    the values of `readers`' names ({name: the presentation cell that reads it}) to
    `folder`/data.json. A name not bound at this point is left out, as a NameError a live
    run would raise too."""
    path = Path(folder) / DATA_FILE
    data = json.loads(path.read_text(encoding="utf8")) if path.exists() else \
        {"format": FORMAT, "kept": {}}
    kept = data["kept"].setdefault(str(after), {})
    for name, reader in readers.items():
        if name in namespace:
            kept[name] = encode(namespace[name], f"{name}, which {reader} reads,")
    os.makedirs(folder, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(_dumps(data), encoding="utf8")
    os.replace(tmp, path)


def _dumps(data: dict) -> str:
    """One kept value a line, each compact: readable, and a diff shows what changed."""
    lines = ['{"format": %d, "kept": {' % data["format"]]
    groups = list(data["kept"].items())
    for g, (after, names) in enumerate(groups):
        lines.append(f" {json.dumps(after)}: {{")
        items = list(names.items())
        for i, (name, value) in enumerate(items):
            comma = "," if i < len(items) - 1 else ""
            lines.append(f"  {json.dumps(name)}: {json.dumps(value)}{comma}")
        lines.append(" }" + ("," if g < len(groups) - 1 else ""))
    return "\n".join(lines) + "\n}}\n"


def read(path: Path) -> dict[int, dict]:
    """{measurement cell number: {name: encoded value}} of a data.json; ValueError, naming
    the file, when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
        return {int(after): dict(names) for after, names in data["kept"].items()}
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise ValueError(f"{path} is not a recording's kept data ({exc})") from None


def restore(after: int, namespace: dict, path: str) -> None:
    """In the presentation kernel: bind the names kept after measurement cell `after`."""
    for name, value in read(Path(path)).get(after, {}).items():
        namespace[name] = decode(value)
