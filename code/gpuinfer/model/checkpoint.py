"""What a model must be before a decoder reads it: its device there, its checkpoint
folder's files whole, its weights finite numbers of a floating dtype.

transformers reads a damaged checkpoint with messages that name neither the file nor
the fix ("header too small", "Unrecognized model"), casts an int32 tensor to the dtype
asked for without a word, and loads a NaN that then decodes to token 0 forever. Each
check here runs before the work it guards (the device before the load, the files
before transformers reads them) and names the file or tensor, and what to do.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

FIX = "save the checkpoint again with save_pretrained(), or copy the folder whole"


def check_device(device) -> torch.device:
    """`device` as a torch.device, refused up front where it is not here (a GPU that is
    not visible), not after a whole load."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r}: not a device ({exc}); give 'cpu' or "
                         "'cuda'") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={device!r}: no CUDA GPU is visible to this process; "
                             "load on device='cpu' (or run where a GPU is)")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={device!r}: this process sees {count} GPU(s), "
                             f"cuda:0 ... cuda:{count - 1}; give one of them")
    return dev


def same_device(where: torch.device, asked: torch.device) -> bool:
    """Whether a tensor on `where` is on `asked` ('cuda' without an index: any GPU)."""
    return where.type == asked.type and asked.index in (None, where.index)


def readable(path: Path) -> bool:
    """Whether `path` exists; refused, naming it, where it is a symlink that leads
    nowhere or to itself (a loop), which `exists` reports as missing."""
    if path.is_symlink() and not path.exists():
        try:
            path.stat()
        except OSError as exc:
            raise FileNotFoundError(f"{path}: a symlink that cannot be followed "
                                    f"({exc.strerror}); point it at the real file, or "
                                    "copy the file there") from None
    return path.exists()


def check_config_file(path: Path) -> None:
    """Refuse a config.json that is not a JSON object (`[]`, a truncated write)."""
    try:
        config = json.loads(path.read_text(encoding="utf8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc}); {FIX}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: holds a JSON {type(config).__name__}, not an object "
                         f"of the model's settings; {FIX}")


FLOATING = ("F", "BF")  # safetensors' dtype names of floating types: F16, BF16, F32 ...


def check_safetensors(path: Path) -> None:
    """Refuse a .safetensors file that is empty, truncated or damaged (its header read
    here: 8 bytes of length, a JSON table of each tensor's dtype and byte range), or that
    holds a tensor of an integer or bool dtype, which loading would cast silently."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if length is None or 8 + length > size:
            raise ValueError(f"{path}: {'empty' if size == 0 else 'truncated'} "
                             f"({size} bytes, no whole header); {FIX}")
        try:
            table = json.loads(f.read(length))
        except ValueError:
            table = None
    if not isinstance(table, dict):
        raise ValueError(f"{path}: its header is not a safetensors table; {FIX}")
    tensors = {k: v for k, v in table.items() if k != "__metadata__"}
    try:
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise ValueError(f"{path}: its header is not a safetensors table; {FIX}") from None
    if 8 + length + end > size:
        raise ValueError(f"{path}: truncated ({size} bytes of {8 + length + end}); {FIX}")
    for name, v in sorted(tensors.items()):
        if not str(v.get("dtype", "")).startswith(FLOATING):
            raise ValueError(f"{path}: tensor {name} is {v.get('dtype')}; a model's "
                             "weights are floating point, and loading would cast it "
                             "silently: save the weights as float (BF16, FP32)")


def check_weights(model: torch.nn.Module) -> None:
    """Refuse a model with a weight that is not floating point, or that holds a NaN or
    an infinity (naming the first few): greedy decoding on it is meaningless, and
    silent. One read of each weight (its min and max), one host sync in all."""
    params = [(n, p) for n, p in model.named_parameters() if p.numel()]
    for name, p in params:
        if not p.dtype.is_floating_point:
            raise TypeError(f"weight {name} is {p.dtype}: a model's weights are floating "
                            "point; convert it (model.to(torch.bfloat16)) or fix the "
                            "checkpoint")
    if not params:
        return
    with torch.no_grad():
        ends = torch.stack([torch.stack(torch.aminmax(p)).float() for _, p in params])
    finite = torch.isfinite(ends).all(dim=1).tolist()
    bad = [name for (name, _), ok in zip(params, finite) if not ok]
    if bad:
        raise ValueError(f"weight {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''} "
                         "holds NaN or infinite values: the checkpoint is damaged or its "
                         "training diverged; load an intact one")
