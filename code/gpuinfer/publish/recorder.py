"""How the cells run is part of every recording: the recorder's own set-up, hashed.

A chapter's timings depend on more than its cells and the package definitions they reach
(gpuinfer.publish.reach): on how the recorder starts the kernel that runs them and what
that kernel inherits. So every recording keeps, under `recorder`, one hash per file of
that set-up, and a change to any of them stales every chapter:

- the recorder's modules that set up the kernel and run code inside it
  (`RECORDER_MODULES`: publish/measuring.py starts the kernel and its environment,
  publish/kept.py runs in it), hashed as parsed, like every module;
- what starts the recorder on the book's GPU (`RECORDER_SCRIPTS`: scripts/gpu_record.sh,
  which exports the environment the recorder and the kernel inherit), as written;
- a `sitecustomize.py` or `usercustomize.py` in the book's root or in code/ (Python runs
  one at every start-up when it is on the path, as code/ is on the GPU machine), as
  parsed; where there is none, that absence is what is hashed;
- the requirement pins (the lines of requirements.txt without comments and blanks). Not
  the installed versions: the GPU records with one torch and CI checks staleness on the
  CPU with another, so only what both read alike can be compared; the recording's
  provenance names the versions it ran with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpuinfer.publish.parsed import source_hash
from gpuinfer.publish.sources import PACKAGE_DIR

RECORDER_MODULES = ("publish/measuring.py", "publish/kept.py")  # under the package
RECORDER_SCRIPTS = ("scripts/gpu_record.sh",)  # under the book's root
STARTUP_HOOKS = tuple(f"{folder}{name}" for folder in ("", "code/")
                      for name in ("sitecustomize.py", "usercustomize.py"))
REQUIREMENTS = "requirements.txt"
ABSENT = "absent"  # the hash of a file that is not there


def _text_hash(text: str) -> str:
    return hashlib.sha256(text.replace("\r\n", "\n").encode()).hexdigest()


def pins(text: str) -> str:
    """The requirement lines of a requirements file, without comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf8") if path.is_file() else None


def recorder_hashes(root: Path, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{file: hash} of the recorder's set-up for the book at `root` and the package at
    `package_dir`: files under the package named 'publish/...', the others by their path
    under the root; a file that is not there hashes as ABSENT."""
    root, package_dir = Path(root), Path(package_dir)
    found = {}
    for rel in RECORDER_MODULES:
        text = _read(package_dir / rel)
        found[rel] = ABSENT if text is None else source_hash(text)
    for rel in RECORDER_SCRIPTS:
        text = _read(root / rel)
        found[rel] = ABSENT if text is None else _text_hash(text)
    for rel in STARTUP_HOOKS:
        text = _read(root / rel)
        found[rel] = ABSENT if text is None else source_hash(text)
    text = _read(root / REQUIREMENTS)
    found[REQUIREMENTS] = ABSENT if text is None else _text_hash(pins(text))
    return found


def recorder_changed(old: dict[str, str] | None, new: dict[str, str]) -> str | None:
    """Why the recorder's set-up is not the one a recording was made with, or None:
    "the recorder's set-up changed (publish/measuring.py)"."""
    if old == new:
        return None
    if not old:
        return ("the recorder's set-up (its kernel's start, gpu_record.sh, the start-up "
                "hooks, the requirement pins) was not hashed when it was recorded")
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return f"the recorder's set-up changed ({', '.join(differ)})"
