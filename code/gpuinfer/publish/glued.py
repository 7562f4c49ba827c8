"""Every value a chapter's page glues, without building the book:
`python -m gpuinfer.publish.glued STEM [--root BOOK]`.

Prints one JSON object, name -> value, in the order the page glues them: the measurement
cells' values read from the recording, the presentation cells' computed as the build
computes them (gpuinfer.publish.present, from the values the recording kept). Numbers are
JSON numbers, markdown glued with `{glue:md}` its text, other values their text.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from gpuinfer.publish import book, recordings
from gpuinfer.publish.book import BookError
from gpuinfer.publish.compare import as_number, glued_outputs
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.preflight import UsageError, find_root, select_chapters
from gpuinfer.publish.present import PresentationError, page

MARKDOWN = "text/markdown"


def _value(data: dict):
    """A glued output's value as JSON: a number, markdown text, or the plain text."""
    if data.get(MARKDOWN) is not None:
        return data[MARKDOWN]
    plain = data.get("text/plain")
    if plain is None:
        return None
    number = as_number(plain)
    if number is not None:
        return int(number) if plain.strip().lstrip("-").isdigit() else number
    try:
        value = ast.literal_eval(plain)  # a glued string shows as its repr
        return value if isinstance(value, (str, bool, int, float)) else plain
    except (ValueError, SyntaxError):
        return plain


def values(nb) -> dict:
    """{name: value} of every value notebook `nb` (with its outputs) glued."""
    return {name: _value(data) for name, data in glued_outputs(nb)}


def page_values(root: Path, chapter: str) -> dict:
    """The glued values of the chapter's page, as the build makes it from its recording;
    ValueError (one line) when the chapter has no fresh recording to read them from."""
    import nbformat

    status = recordings.status(root, chapter, accept_cpu=True)
    if not status.fresh:
        raise ValueError(status.message)
    path = book.chapters(root)[chapter]
    recorded = nbformat.reads(status.recording.read_text(encoding="utf8"), as_version=4)
    nb = page(book.read_chapter(path), recorded, book.artifacts_path(path) / DATA_FILE,
              path.parent, chapter)
    return values(nb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuinfer.publish.glued",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("chapter", help="a chapter's stem, e.g. 04_decode_at_scale, or a "
                                        "unique prefix (04)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the book's root folder (default: the book of this folder)")
    args = parser.parse_args(argv)
    try:
        root = args.root.resolve() if args.root else find_root(Path.cwd())
        (chapter,) = select_chapters(root, [args.chapter])
        found = page_values(root, chapter)
    except (UsageError, BookError, ValueError, PresentationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(found, indent=1, ensure_ascii=False, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
