"""A chapter's two kinds of code cells, and what passes between them.

*Measurement* cells run on the GPU when the chapter is recorded: their outputs, and the
values that presentation cells read from them, are the recording. *Presentation* cells
(tag `presentation`) turn those values into figures, tables and glued numbers; they do not
run when a chapter is recorded, and run at every build, on the CPU, from the recorded
values (gpuinfer.publish.present). So editing a presentation cell never stales a
recording, and what it may do is limited:

- it reads the names that earlier cells bound, as any notebook cell does. A name it reads
  whose last binding before it is in a measurement cell is *kept*: the recorder saves its
  value right after the last measurement cell before the presentation cell
  (gpuinfer.publish.kept), and the build restores it there;
- it cannot touch the GPU or time anything: it may not use `torch.cuda`, `.cuda()`, the
  profiler, the clocks of `time` and `timeit`, Triton, or the package's measuring, decoding
  and kernel modules (`DENIED`), nor call a name a measurement cell imported from them;
- a measurement cell cannot read a name that only a presentation cell binds: what is
  measured never depends on how it is shown.

The analysis is static (Python's parse tree, the same on every Python the book runs on):
for each cell, the names it reads before binding them itself and the names it binds
(gpuinfer.publish.names).
"""

from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuinfer.publish.book import read_chapter
from gpuinfer.publish.names import names_of
from gpuinfer.publish.parsed import python_tree

PRESENTATION = "presentation"  # the cell tag
# Names a Jupyter kernel provides besides Python's builtins.
KERNEL_NAMES = frozenset({"display", "get_ipython", "In", "Out", "exit", "quit"})
# What a presentation cell may not import, or call through a name imported from it.
DENIED = ("time", "timeit", "torch.cuda", "torch.profiler", "torch.utils.benchmark",
          "triton", "gpuinfer.env", "gpuinfer.measure.timing", "gpuinfer.measure.steps",
          "gpuinfer.measure.profiling", "gpuinfer.measure.launch",
          "gpuinfer.measure.ceilings", "gpuinfer.measure.stock", "gpuinfer.measure.quality",
          "gpuinfer.measure.rounds", "gpuinfer.measure.stock_process",
          "gpuinfer.model.stock_generate", "gpuinfer.decode", "gpuinfer.kernels", "gpuinfer.experiments",
          "gpuinfer.model.train", "gpuinfer.model.corpus")


def denied(module: str) -> bool:
    """Whether a presentation cell may not use `module` (or any name imported from it)."""
    return any(module == d or module.startswith(d + ".") for d in DENIED)


@dataclass(frozen=True)
class Cell:
    """A code cell as the analysis sees it. `number` counts the chapter's code cells from
    1, as the record command's progress and the build's messages show them."""

    number: int
    source: str
    presentation: bool
    reads: tuple[str, ...]  # names read before the cell binds them, in first-read order
    binds: frozenset[str]  # names bound at the cell's top level
    imports: dict[str, str] = field(default_factory=dict)  # name -> module it came from

    @property
    def kind(self) -> str:
        return "presentation" if self.presentation else "measurement"

    def __str__(self) -> str:
        return f"{self.kind} cell {self.number}"


def parse(source: str) -> ast.Module:
    """A cell's parse tree (each distinct source parsed once: callers only read it);
    IPython syntax (%magic, !shell) is translated to Python first. SyntaxError if it is
    not Python either."""
    try:
        return python_tree(source)
    except SyntaxError:
        from IPython.core.inputtransformer2 import TransformerManager

        return python_tree(TransformerManager().transform_cell(source))


def is_presentation(cell) -> bool:
    return PRESENTATION in cell.get("metadata", {}).get("tags", [])


def measurement_cells(nb) -> list[tuple[int, object]]:
    """(code-cell number, cell) of each of nb's measurement cells, in order: the cells a
    recording is made of, numbered as messages name them."""
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    return [(number, cell) for number, cell in enumerate(code, 1)
            if not is_presentation(cell)]


def analyse(number: int, source: str, presentation: bool) -> Cell:
    reads, binds, imported = names_of(parse(source))
    provided = set(dir(builtins)) | KERNEL_NAMES
    return Cell(number, source, presentation, tuple(n for n in reads if n not in provided),
                binds, imported)


def code_cells(nb) -> list[Cell]:
    """The notebook's code cells, analysed. SyntaxError (naming the cell) if one is not
    Python."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            cells.append(analyse(len(cells) + 1, cell.source, is_presentation(cell)))
        except SyntaxError as exc:
            raise SyntaxError(f"code cell {len(cells) + 1}: {exc.msg} (line {exc.lineno})") \
                from None
    return cells


# --- what passes between them --------------------------------------------------------------

def kept_names(cells: list[Cell]) -> dict[int, dict[str, str]]:
    """{number of a measurement cell: {name: the first presentation cell that reads it}}:
    for each presentation cell, the names it reads whose last binding is in a measurement
    cell, kept after the last measurement cell before it (where their values are final
    for it)."""
    owner: dict[str, Cell] = {}
    last_measured = 0  # before any measurement cell: 0
    kept: dict[int, dict[str, str]] = {}
    for cell in cells:
        if cell.presentation:
            for name in cell.reads:
                if name in owner and not owner[name].presentation:
                    kept.setdefault(last_measured, {}).setdefault(name, str(cell))
        else:
            last_measured = cell.number
        for name in cell.binds:
            owner[name] = cell
    return kept


_CLOCKS = {"time", "timeit"}


def _dotted(node) -> list[str] | None:
    """['torch', 'cuda', 'synchronize'] for `torch.cuda.synchronize`; None if the chain
    does not start at a name (`f().cuda`: then its last part alone counts)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


def _touches(tree: ast.Module) -> list[str]:
    """What in a presentation cell's code would touch the GPU or a clock, in words."""
    found = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if denied(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if denied(node.module):
                found.append(f"imports from {node.module}")
            else:
                found += [f"imports {node.module}.{a.name}" for a in node.names
                          if denied(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Attribute):  # the whole chain, once
            parts = _dotted(node) or ["", node.attr]
            if "cuda" in parts[1:] or parts[0] in _CLOCKS or "profiler" in parts[1:]:
                found.append(f"uses {ast.unparse(node)}")
                continue
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (node.value == "cuda" or node.value.startswith("cuda:")):
            found.append(f"names the device {node.value!r}")
        todo += reversed(list(ast.iter_child_nodes(node)))
    return list(dict.fromkeys(found))


def problems(cells: list[Cell]) -> list[str]:
    """What breaks the rules of the module docstring, one line each, naming the cell."""
    said = []
    owner: dict[str, Cell] = {}
    imported_from: dict[str, str] = {}  # name -> module, for names imported by any cell
    for cell in cells:
        if cell.presentation:
            for what in _touches(parse(cell.source)):
                said.append(f"{cell} {what}: a presentation cell runs at build time on the "
                            "CPU and cannot touch the GPU or time anything; move that "
                            "into a measurement cell")
            for name in cell.reads:
                module = imported_from.get(name) if name in owner else None
                if module and not owner[name].presentation and denied(module):
                    said.append(f"{cell} uses {name} (from {module}), which measures, "
                                "decodes or touches the GPU: call it in a measurement cell "
                                "and present its result")
        else:
            for name in cell.reads:
                if name in owner and owner[name].presentation:
                    said.append(f"{cell} reads {name}, which only {owner[name]} binds: "
                                "a measurement cannot depend on a presentation cell; bind "
                                "it in a measurement cell")
        for name in cell.binds:
            owner[name] = cell
            if name in cell.imports:
                imported_from[name] = cell.imports[name]
            else:
                imported_from.pop(name, None)
    return said


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuinfer.publish.cells CHAPTER.md`: each code cell's kind, what the
    recording keeps after each measurement cell, and what breaks the rules."""
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m gpuinfer.publish.cells CHAPTER.md ...", file=sys.stderr)
        return 2
    broken = 0
    for path in paths:
        analysed = code_cells(read_chapter(Path(path)))
        kept = kept_names(analysed)
        print(f"{path}: {sum(not c.presentation for c in analysed)} measurement cells, "
              f"{sum(c.presentation for c in analysed)} presentation cells")
        for cell in analysed:
            first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
            print(f"  {cell.number:3d} {cell.kind[:4]}  {first}")
            if cell.number in kept:
                print(f"        keeps: {', '.join(kept[cell.number])}")
        for line in problems(analysed):
            broken += 1
            print(f"  PROBLEM: {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
