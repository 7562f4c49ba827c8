"""A module as *units*, the pieces whose changes gpuinfer.publish.reach follows.

A unit is a top-level function or class of a module (a class is one unit, its methods
with it), or the module's *module-level statements*: its body without its top-level
functions, classes and docstrings, which run whenever it is imported. Each unit is hashed
as Python parses it (comments, docstrings and layout never count), and comes with a `Code`:
the names it uses, the imports it makes, the strings that may name a module, and whether
it looks names up by string. The analysis is static and reads only the parse tree, so the
Pythons the book runs on (3.11 on CI, 3.12 on the GPU) agree on every hash.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass

from gpuinfer.publish.parsed import canonical, python_tree

ROOT = "gpuinfer"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- what one piece of code uses ----------------------------------------------------------

@dataclass(frozen=True)
class Code:
    """What a unit, a module's statements or a cell does that reaching follows."""

    refs: frozenset[tuple[str, ...]]  # names and attribute chains it uses
    bindings: tuple[tuple[str, tuple[str, ...]], ...]  # name -> dotted path it imports
    imported: tuple[str, ...]  # dotted names it imports (some are attributes, not modules)
    named: frozenset[str]  # strings that may name a module ('-m gpuinfer.x': gpuinfer.x)
    dynamic: bool  # looks names up by string: its whole module counts
    looked_in: frozenset[tuple[str, ...]]  # objects it looks names up in by string


_DYNAMIC_CALLS = {"eval", "exec", "globals", "locals", "vars", "__import__"}
_SKIPPED = ("returns", "annotation")  # annotations do not run


def _chain(node) -> tuple[str, ...] | None:
    """('ceilings', 'copy_bandwidth') for `ceilings.copy_bandwidth`; None when the chain
    does not start at a name (`f().x`)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, *reversed(parts)) if isinstance(node, ast.Name) else None


def _absolute(node: ast.ImportFrom, module: str | None, is_package: bool) -> str | None:
    """The dotted module a `from ... import` names, relative imports resolved."""
    if not node.level:
        return node.module
    if module is None:
        return None
    parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
    return ".".join(parts + ([node.module] if node.module else [])) or None


def _module_names(text: str) -> set[str]:
    """The package module names a string may name: itself, what follows '-m', or what it
    imports where it is Python code (`python -c "from gpuinfer.x import f; f()"`)."""
    words = text.split()
    found = {text} if len(words) == 1 else set()
    found |= {b for a, b in zip(words, words[1:]) if a == "-m"}
    if "import" in text and ROOT in text:
        found |= _imported_by_code(text)
    return {w for w in found if w == ROOT or w.startswith(ROOT + ".")}


def _imported_by_code(text: str) -> set[str]:
    """The dotted modules a piece of Python source imports ({} if it is not Python)."""
    try:
        tree = python_tree(text)
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def code_of(nodes: list, module: str | None = None, is_package: bool = False) -> Code:
    """What `nodes` use, import and look up, walking every nested body (conservative)."""
    refs, bindings, imported, named, looked_in = set(), {}, [], set(), set()
    dynamic = False
    todo = list(reversed(nodes))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # a docstring
        if isinstance(node, ast.Import):
            for a in node.names:
                imported.append(a.name)
                bound = a.asname or a.name.split(".")[0]
                bindings[bound] = tuple((a.name if a.asname else bound).split("."))
            continue
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for a in node.names if base else ():
                if a.name == "*":  # names unknown here: this module and that one whole
                    dynamic = True
                    named.add(base)
                    imported.append(base)
                    continue
                imported += [base, f"{base}.{a.name}"]
                bindings[a.asname or a.name] = (*base.split("."), a.name)
            continue
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is not None:
                refs.add(chain)
                dynamic |= chain[:2] == ("sys", "modules")  # modules by name
                continue
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            refs.add((node.id,))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named |= _module_names(node.value)
        elif isinstance(node, ast.Call):
            func = _chain(node.func) or ()
            first = _chain(node.args[0]) if node.args else None
            if func == ("getattr",) and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    if first:
                        refs.add((*first, name.value))
                else:
                    dynamic = True
                    looked_in |= {first} if first else set()
            elif func in {(n,) for n in _DYNAMIC_CALLS} or func[-1:] == ("import_module",):
                dynamic = True
                looked_in |= {first} if first and func == ("vars",) else set()
        for name, value in ast.iter_fields(node):
            if name in _SKIPPED:
                continue
            if isinstance(value, list):
                todo += reversed([v for v in value if isinstance(v, ast.AST)])
            elif isinstance(value, ast.AST):
                todo.append(value)
    return Code(frozenset(refs), tuple(bindings.items()), tuple(dict.fromkeys(imported)),
                frozenset(named), dynamic, frozenset(looked_in))


NOTHING = code_of([])


# --- a module's units ---------------------------------------------------------------------

@dataclass(frozen=True)
class Module:
    """A module as units: {name: (hash, code)} of its top-level functions and classes, the
    (hash, code) of its module-level statements, and what each top-level name is bound to:
    'unit', 'statement' (a value the statements compute) or the dotted path it imports."""

    units: dict[str, tuple[str, Code]]
    statements: tuple[str, Code]
    namespace: dict[str, str | tuple[str, ...]]


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@functools.lru_cache(maxsize=None)  # once per distinct text, across chapters and commits
def analyse(text: str, dotted: str, is_package: bool) -> Module:
    """`text`, the source of module `dotted`, as units. Source that does not parse is one
    unit, its statements, hashed as written (running it fails anyway)."""
    try:
        tree = python_tree(text)
    except SyntaxError:
        return Module({}, (sha256(text.replace("\r\n", "\n")), NOTHING), {})
    defs: dict[str, list] = {}
    rest = []
    for stmt in tree.body:
        if isinstance(stmt, _DEFS):
            defs.setdefault(stmt.name, []).append(stmt)  # defined twice: one unit of both
        else:
            rest.append(stmt)
    units = {name: (sha256(canonical(nodes[0] if len(nodes) == 1 else nodes)),
                    code_of(nodes, dotted, is_package)) for name, nodes in defs.items()}
    statements = code_of(rest, dotted, is_package)
    namespace: dict[str, str | tuple[str, ...]] = {
        node.id: "statement" for stmt in rest for node in ast.walk(stmt)
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    namespace.update(statements.bindings)
    namespace.update((name, "unit") for name in units)
    return Module(units, (sha256(canonical(rest)), statements), namespace)


def dotted_name(relpath: str) -> str:
    """'measure/timing.py' -> 'gpuinfer.measure.timing'; 'measure/__init__.py' ->
    'gpuinfer.measure'."""
    parts = relpath[: -len(".py")].split("/")
    return ".".join([ROOT] + parts[:-1] + ([] if parts[-1] == "__init__" else parts[-1:]))
