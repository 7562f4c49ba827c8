"""What a recording depends on: the package definitions its measurement cells reach.

A recording is made from a chapter's measurement cells (gpuinfer.publish.cells) and the
package code they run. It depends on:

- its **measurement cells, as parsed** (`cells_hashes`, one hash per cell): an edited
  comment or blank line keeps it fresh; presentation cells do not count;
- the **definitions those cells reach** (`definitions`, {unit: hash}). A *unit* is a
  top-level function or class of a module (`measure/timing.py::benchmark`; a class is one
  unit, methods and all), or a module's *module-level statements* (`measure/timing.py`: its
  body without its top-level functions, classes and docstrings, which runs whenever the
  module is imported). A unit is hashed as Python parses it: comments, docstrings and
  layout never count.

What is reached, starting from the names the cells use:

- a name or attribute chain (`benchmark`, `ceilings.copy_bandwidth`, `rl.lookup_spec`,
  `runners.EAGER`, `gpuinfer.measure.timing.benchmark`) is resolved through the imports that
  bind it, re-exports followed (`from gpuinfer.a import f` in module b: b's `f` is a.py's),
  to the unit that defines it; attributes past a function or class stop there. A name
  only imported, never used, reaches no definition;
- importing a module runs its module-level statements, so every module imported on the way
  counts with them, with the `__init__.py` of every package above it, and every module
  those statements import, transitively;
- inside a reached unit, every name it uses is followed in its own module's namespace (its
  module's functions and classes, the module's imports, imports made in the body), and
  so are base classes, decorators and default values; the names a reached module's
  statements use too (`MODES = {"eager": run_eager}` reaches `run_eager`). Annotations do not run
  and are not followed (the unit's hash still covers them). A name is looked up at module
  level even where a local variable shadows it: more is reached, never less;
- a name looked up by string (`importlib.import_module`, `__import__`, `sys.modules`,
  `globals()`, `vars()`, `eval`, `exec`, `getattr` with a computed name, `from m import
  *`) cannot be followed: the **whole module** whose code does it counts (every unit, and
  what they reach), and so does the object's module where the object is a package module
  (`getattr(ceilings, name)`, `vars(ceilings)`, the module of `from m import *`);
- a string in reached code that names a package module (`"gpuinfer.measure.stock"` in
  `[sys.executable, "-m", "gpuinfer.measure.stock"]`, an `import_module` argument), or
  Python source in a string that imports one (the code of `python -c`), reaches that whole
  module: it runs as a subprocess entry point or is imported by name. What cannot be
  followed (a module run by its file's path, an `import_module` of a name built at run
  time) the package does not do: tests/test_reach.py scans it and names any such place;
- what the page shows with `literalinclude` (`shown`): `:pyobject: benchmark` reaches that
  unit, `:pyobject: StaticDecoder.decode_step` the class `StaticDecoder`, and a
  literalinclude without `:pyobject:` the whole module: the page renders today's source of
  it beside the recorded numbers.

So a function no measurement cell reaches can be added or changed freely, and a method's
change stales whoever reaches its class. `reach` also says why each unit counts (`why`:
'measurement cell 3 -> measure/timing.py::benchmark -> env.py::sync'), and `changed`
which units differ between two `definitions`, for the messages of a stale recording. Not followed: the decorators, defaults and class
bodies of definitions nothing reaches, though they run at import (the package registers
nothing that way), and code outside the package (torch's own changes are in the recorded
provenance, not here; the recorder's set-up and the requirement pins are hashed apart, by
gpuinfer.publish.recorder). The analysis reads only the parse tree (never `ast.dump` or
`symtable`), so Python 3.11 and 3.12 agree; sources come through `Sources`, so past
commits can be read without a checkout (scripts/blast.py).
"""

from __future__ import annotations

import ast
import collections
import functools
import posixpath
import re
from dataclasses import dataclass, field

from gpuinfer.publish.cells import parse as parse_cell
from gpuinfer.publish.parsed import canonical
from gpuinfer.publish.sources import Sources, TreeSources
from gpuinfer.publish.units import (NOTHING, ROOT, Code, Module, analyse, code_of,
                                    dotted_name, sha256)


# --- the measurement cells ----------------------------------------------------------------

@functools.lru_cache(maxsize=None)  # the same cells are read at every status check
def _cell_tree(source: str) -> ast.Module | None:
    """A cell's parse (IPython syntax such as %magic translated first), None if it is not
    Python either."""
    try:
        return parse_cell(source)
    except (ImportError, SyntaxError):
        return None


def cells_hashes(sources: list[str]) -> list[str]:
    """One hash per measurement cell, of the cell as Python parses it, so a message can name
    the cell that changed. A cell that does not parse is hashed as written."""
    found = []
    for source in sources:
        tree = _cell_tree(source)
        found.append(sha256(canonical(tree) if tree is not None
                             else source.replace("\r\n", "\n")))
    return found


# --- reaching -----------------------------------------------------------------------------

@dataclass
class Reached:
    """The units reached, {key: hash}, and for each what reached it first (another key, a
    'measurement cell k', or what the page shows), to say why a unit counts."""

    hashes: dict[str, str] = field(default_factory=dict)
    via: dict[str, str] = field(default_factory=dict)

    def why(self, key: str) -> str:
        """'measurement cell 3 -> measure/timing.py::benchmark -> env.py::sync'."""
        path = [key]
        while path[-1] in self.via and len(path) <= len(self.via):
            path.append(self.via[path[-1]])
        return " -> ".join(reversed(path))


class _Walk:
    """One chapter's reaching over one version of the package."""

    def __init__(self, sources: Sources):
        self.sources = sources
        self.relpaths = {dotted_name(rel): rel for rel in sources.files()}
        self.modules: dict[str, Module] = {}
        self.found = Reached()
        self.imported: set[str] = set()
        self.whole: set[str] = set()
        self.todo: collections.deque[tuple[Code, str | None, str, dict]] = \
            collections.deque()  # breadth first: `why` gives a shortest path

    def module(self, dotted: str) -> Module:
        if dotted not in self.modules:
            rel = self.relpaths[dotted]
            self.modules[dotted] = analyse(self.sources.read(rel) or "", dotted,
                                           rel.endswith("__init__.py"))
        return self.modules[dotted]

    def add(self, key: str, digest: str, code: Code, module: str, via: str) -> None:
        if key not in self.found.hashes:
            self.found.hashes[key], self.found.via[key] = digest, via
            self.todo.append((code, module, key, dict(code.bindings)))

    def import_module(self, dotted: str, via: str) -> None:
        """Importing `dotted` runs the statements of it and of every package above it."""
        parts = dotted.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[:n])
            if name not in self.relpaths:
                return
            if name not in self.imported:
                self.imported.add(name)
                self.add(self.relpaths[name], *self.module(name).statements, name, via)

    def unit(self, dotted: str, name: str, via: str) -> None:
        self.import_module(dotted, via)
        self.add(f"{self.relpaths[dotted]}::{name}", *self.module(dotted).units[name],
                 dotted, via)

    def whole_module(self, dotted: str, via: str) -> None:
        if dotted not in self.whole:
            self.whole.add(dotted)
            self.import_module(dotted, via)
            for name in self.module(dotted).units:
                self.unit(dotted, name, via)

    def resolve(self, parts: tuple[str, ...], via: str, seen=frozenset()) -> str | None:
        """Reach what the dotted path `parts` names; the dotted module it names, if one."""
        if parts[0] != ROOT or ROOT not in self.relpaths:
            return None
        dotted, n = ROOT, 1
        while True:
            self.import_module(dotted, via)  # a module reached through was imported
            if n == len(parts):
                return dotted
            bound = self.module(dotted).namespace.get(parts[n])
            if bound == "unit":
                self.unit(dotted, parts[n], via)
                return None
            if isinstance(bound, tuple) and (dotted, parts[n]) not in seen:
                return self.resolve(bound + parts[n + 1:], via, seen | {(dotted, parts[n])})
            if bound is not None or f"{dotted}.{parts[n]}" not in self.relpaths:
                return None  # a value its statements compute: they count already
            dotted, n = f"{dotted}.{parts[n]}", n + 1

    def lookup(self, chain: tuple[str, ...], module: str | None, bindings: dict,
               via: str) -> str | None:
        """Reach what `chain` names in `module` (None: the cells), local imports first."""
        first, rest = chain[0], chain[1:]
        bound = bindings.get(first)
        if bound is None and module is not None:
            bound = self.module(module).namespace.get(first)
        if bound == "unit":
            self.unit(module, first, via)
        elif isinstance(bound, tuple):
            return self.resolve(bound + rest, via)
        return None

    def run(self) -> Reached:
        while self.todo:
            code, module, via, bindings = self.todo.popleft()
            for name in code.imported:
                self.import_module(name, via)
            for chain in sorted(code.refs):
                self.lookup(chain, module, bindings, via)
            for name in sorted(code.named & set(self.relpaths)):
                self.whole_module(name, via)  # run as `python -m`, or imported by name
            if code.dynamic and module is not None:
                self.whole_module(module, via)
            for chain in sorted(code.looked_in):
                target = self.lookup(chain, module, bindings, via)
                if target is not None:
                    self.whole_module(target, via)
        return self.found


@functools.lru_cache(maxsize=None)
def cell_code(source: str) -> Code:
    tree = _cell_tree(source)
    return code_of(tree.body) if tree is not None else NOTHING


def reach(cell_sources: list[str], shown: list[tuple[str, str | None]] = (),
          sources: Sources | None = None) -> Reached:
    """The units the measurement cells (their sources, in order) and the page's
    literalincludes (`shown`) reach, with why each counts."""
    walk = _Walk(TreeSources() if sources is None else sources)
    codes = [cell_code(source) for source in cell_sources]
    bindings = {name: path for code in codes for name, path in code.bindings}  # one kernel
    for number, code in enumerate(codes, 1):
        walk.todo.append((code, None, f"measurement cell {number}", bindings))
    walk.run()
    for rel, pyobject in shown:
        dotted = dotted_name(rel)
        if walk.relpaths.get(dotted) != rel:
            continue  # not a package module: the build fails on it anyway
        via = f"shown ({rel}{' :pyobject: ' + pyobject if pyobject else ''})"
        top = (pyobject or "").split(".")[0]
        if top in walk.module(dotted).units:
            walk.unit(dotted, top, via)
        else:
            walk.whole_module(dotted, via)
        walk.run()
    walk.found.hashes = dict(sorted(walk.found.hashes.items()))
    return walk.found


def definitions(cell_sources: list[str], shown: list[tuple[str, str | None]] = (),
                sources: Sources | None = None) -> dict[str, str]:
    """{unit: hash} of what the measurement cells and the page's literalincludes reach."""
    return reach(cell_sources, shown, sources).hashes


def changed(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What differs between two `definitions`, in words: 'measure/timing.py::benchmark
    changed', '... newly reached', '... no longer reached'."""
    said = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            said.append(f"{key} newly reached")
        elif key not in new:
            said.append(f"{key} no longer reached")
        elif old[key] != new[key]:
            said.append(f"{key} changed")
    return said


# --- what the page shows ------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(?:`{3,}|:{3,})\{literalinclude\}\s+(\S+)\s*$")
_OPTION = re.compile(r"^\s*:([\w-]+):\s*(.*?)\s*$")
_PACKAGE = f"code/{ROOT}/"


def shown(markdown_text: str, chapter_dir: str = "book") -> list[tuple[str, str | None]]:
    """The package sources a page shows with `literalinclude`: (path under the package,
    its `:pyobject:` or None). Paths are relative to the page's folder `chapter_dir`, or to
    the book's root when they start with '/'; other files are left out."""
    found = []
    lines = markdown_text.splitlines()
    for number, line in enumerate(lines):
        fence = _FENCE.match(line)
        if not fence:
            continue
        options = {}
        for option in lines[number + 1:]:
            matched = _OPTION.match(option)
            if not matched:
                break
            options[matched.group(1)] = matched.group(2).strip("\"'")
        path = fence.group(1)
        path = (path.lstrip("/") if path.startswith("/")
                else posixpath.normpath(posixpath.join(chapter_dir, path)))
        if path.startswith(_PACKAGE) and path.endswith(".py"):
            found.append((path[len(_PACKAGE):], options.get("pyobject") or None))
    return found
