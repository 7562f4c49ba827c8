"""Compare two recordings of a chapter, number by number:
`python -m gpuinfer.publish.compare BASELINE.ipynb YOURS.ipynb`.

Every number in a chapter's prose is glued from its run (myst_nb.glue): by its measurement
cells, whose outputs the recording holds, and by its presentation cells, which run here
from the values the recording kept beside it (`<chapter>/data.json`, as the build runs
them). So the recording made on the book's GPU and one made on yours can be compared
value by value, with the GPUs they came from, without reading either page.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from gpuinfer.publish.cells import is_presentation
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.present import GLUE_PREFIX, PresentationError, present
from gpuinfer.publish.validation import METADATA_KEY, load_notebook

NUMBER = re.compile(r"^(?:np\.\w+\()?\s*"  # np.float64( ... ) around it, or not
                    r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)\s*\)?$")


def glued_values(path: Path | str) -> dict[str, str]:
    """{name: text} of every value the notebook file glued, in the order it glued them."""
    return glued_in(json.loads(Path(path).read_text(encoding="utf8")))


def glued_outputs(nb):
    """(name, {mime: text}) of every value a notebook (a dict or an nbformat notebook)
    glued, in the order it glued them; each mime without the glue's prefix, its text
    joined."""
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None:
                continue
            data = {}
            for mime, value in out.get("data", {}).items():
                key = mime.removeprefix(GLUE_PREFIX)
                if mime.startswith(GLUE_PREFIX) or key not in data:  # the glued one wins
                    data[key] = "".join(value) if isinstance(value, list) else value
            yield name, data


def glued_in(nb) -> dict[str, str]:
    """{name: text} of every value a notebook glued: its text/plain."""
    return {name: data["text/plain"] for name, data in glued_outputs(nb)
            if "text/plain" in data}


def glued_text(nb) -> dict[str, str]:
    """{name: text} of every value a notebook glued, as a terminal shows it: a glued
    Markdown object (`glue(name, Markdown(...))`, shown by `{glue:md}`) as its markdown
    source, not its text/plain, which is only `<IPython.core.display.Markdown object>`;
    on one line."""
    found = {}
    for name, data in glued_outputs(nb):
        text = data.get("text/markdown", data.get("text/plain"))
        if isinstance(text, str):
            found[name] = " ".join(text.split())
    return found


def as_number(text: str) -> float | None:
    """The float in a glued text/plain value ('4.18', 'np.float64(4.18)'), else None."""
    match = NUMBER.match(text.strip().strip("'\""))
    return float(match.group(1)) if match else None


def provenance(path: Path | str) -> str:
    meta = json.loads(Path(path).read_text(encoding="utf8")).get("metadata", {}).get(
        METADATA_KEY, {})
    return (f"{meta.get('gpu') or 'CPU (smoke mode)'}, torch {meta.get('torch', '?')}, "
            f"{meta.get('date', 'date unknown')}")


def recording_values(path: Path | str) -> dict[str, str]:
    """{name: text} of every value a recording's page glues (`glued_text`): its
    measurement cells' from the recording, its presentation cells' computed from the data
    kept beside it."""
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if any(is_presentation(c) for c in nb.cells if c.cell_type == "code"):
        present(nb, path.with_suffix("") / DATA_FILE, path.parent, path.stem)
    return glued_text(nb)


def compare(baseline: Path | str, yours: Path | str) -> list[tuple[str, str, str, str]]:
    """Rows (name, baseline, yours, yours ÷ baseline) for every value glued by either."""
    a, b = recording_values(baseline), recording_values(yours)
    rows = []
    for name in list(a) + [n for n in b if n not in a]:
        x, y = a.get(name, "–"), b.get(name, "–")
        fx, fy = as_number(x), as_number(y)
        ratio = (f"{fy / fx:.2f}×" if fx not in (None, 0) and fy is not None
                 and math.isfinite(fx) and math.isfinite(fy) else "")
        rows.append((name, x, y, ratio))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuinfer.publish.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path,
                        help="e.g. the H200 recording of the chapter")
    parser.add_argument("yours", type=Path, help="e.g. book/_recorded/01_roofline.ipynb")
    args = parser.parse_args(argv)
    for path in (args.baseline, args.yours):
        if not path.is_file():
            print(f"error: no such notebook {path}", file=sys.stderr)
            return 2
        try:  # a notebook nbformat validates: glued_values can then walk it
            load_notebook(path)
        except ValueError as exc:
            print(f"error: {path} is not a notebook ({exc}); give two recordings (.ipynb) "
                  "of one chapter", file=sys.stderr)
            return 2
    try:
        rows = compare(args.baseline, args.yours)
    except PresentationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"baseline: {args.baseline} ({provenance(args.baseline)})")
    print(f"yours:    {args.yours} ({provenance(args.yours)})\n")
    widths = [max(len(r[i]) for r in rows + [("value", "baseline", "yours", "ratio")])
              for i in range(4)]
    for row in [("value", "baseline", "yours", "ratio")] + rows:
        cells = (cell[:40].ljust(min(w, 40)) for cell, w in zip(row, widths))
        print("  ".join(cells).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
