"""A chapter's title line in its MyST text: read it, and put a block under it."""

from __future__ import annotations

import re
from pathlib import Path


def _front_matter_end(lines: list[str]) -> int:
    """The index of the first line after the front matter (0 without one)."""
    if lines and lines[0].startswith("---"):
        return next((i + 1 for i in range(1, len(lines)) if lines[i].startswith("---")), 0)
    return 0


def _title_line(lines: list[str]) -> int | None:
    """The index of the first `# ` heading after the front matter, outside code fences."""
    fence = None
    for i in range(_front_matter_end(lines), len(lines)):
        marker = lines[i].lstrip()[:3]
        if marker in ("```", "~~~"):
            fence = None if fence == marker else fence or marker
        elif fence is None and re.match(r"#\s", lines[i]):
            return i
    return None


def chapter_title(path: Path) -> str:
    """A page's title, its first `# ` heading as written (e.g. '4. Decode at scale: ...');
    the file's stem where it has none."""
    lines = path.read_text(encoding="utf8").splitlines()
    at = _title_line(lines)
    return lines[at][1:].strip() if at is not None else path.stem


def insert_after_title(text: str, block: str) -> str:
    """Insert a markdown block after the first `# ` heading (after the front matter)."""
    lines = text.splitlines(keepends=True)
    at = _title_line(lines)
    at = _front_matter_end(lines) if at is None else at + 1
    return "".join(lines[:at]) + "\n" + block + "\n" + "".join(lines[at:])
