"""Python source as its parse tree, and that tree as text that only a change of meaning
changes: what every hash of a recording's code is taken of (gpuinfer.publish.hashes, the
units of gpuinfer.publish.units, the cells of gpuinfer.publish.reach)."""

from __future__ import annotations

import ast
import functools
import hashlib


@functools.lru_cache(maxsize=None)
def python_tree(source: str) -> ast.Module:
    """`ast.parse`, once per distinct source: a status check follows the imports of every
    module and hashes it, for every chapter, and the chapters share most modules. Callers
    only read the tree."""
    return ast.parse(source)


def is_docstring(node: ast.AST) -> bool:
    """A statement that is a bare string: a docstring, or an attribute's docstring after it
    (either way it computes nothing)."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def canonical(node) -> str:
    """The parse tree as text, without positions, docstrings and empty fields. Not
    `ast.dump`: that prints fields newer Pythons added (`type_params=[]` from 3.12 on), and
    a recording made on the GPU's Python must read as fresh on the CI's older one."""
    if isinstance(node, list):
        return "[" + ",".join(canonical(n) for n in node if not is_docstring(n)) + "]"
    if not isinstance(node, ast.AST):
        return f"{type(node).__name__}:{node!r}"  # a constant, a name, an operator's id
    fields = [(name, getattr(node, name, None)) for name in node._fields]
    return type(node).__name__ + "(" + ",".join(
        f"{name}={canonical(value)}" for name, value in fields
        if value is not None and value != []) + ")"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=None)  # the chapters share most modules
def source_hash(source: str) -> str:
    """sha256 of a module as Python parses it: comments, docstrings, blank lines and layout
    do not count; a changed name, constant or statement does. Source that does not parse
    is hashed as written (running it fails anyway)."""
    try:
        return _sha256(canonical(python_tree(source)))
    except SyntaxError:
        return _sha256(source.replace("\r\n", "\n"))
