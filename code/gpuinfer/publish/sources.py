"""The package's source files, where the reach analysis (gpuinfer.publish.reach) reads
them: the working tree's by default, or any other version through `Sources`."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the gpuinfer sources chapters import


class Sources(Protocol):
    """The package's source files: relpaths under the package folder ('__init__.py',
    'measure/timing.py')."""

    def read(self, relpath: str) -> str | None: ...

    def files(self) -> list[str]: ...


class TreeSources:
    """The package as it is on disk (the working tree's by default)."""

    def __init__(self, package_dir: Path = PACKAGE_DIR):
        self.package_dir = Path(package_dir)

    def read(self, relpath: str) -> str | None:
        path = self.package_dir / relpath
        return path.read_text(encoding="utf8") if path.is_file() else None

    def files(self) -> list[str]:
        return sorted(p.relative_to(self.package_dir).as_posix()
                      for p in self.package_dir.rglob("*.py"))
