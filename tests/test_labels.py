"""The book's short labels (V0 ... V9) are written once, in gpuinfer.report.labels: the code
names what it holds by what it is, and no public name or string of the package is a
chapter label."""

import ast
import re
from pathlib import Path

import gpuinfer

PACKAGE = Path(gpuinfer.__file__).parent
LABEL = re.compile(r"V\d")  # V0, V2L, V9 ...
TABLE = PACKAGE / "report" / "labels.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                     ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_name_and_no_string_of_the_code_is_a_chapter_label():
    names, strings = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf8"))
        docs = _docstrings(tree)
        where = path.relative_to(PACKAGE)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) or \
                    isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                name = getattr(node, "id", None) or node.name
                if LABEL.match(name):
                    names.append(f"{where}: {name}")
            if path != TABLE and isinstance(node, ast.Constant) and \
                    isinstance(node.value, str) and id(node) not in docs and \
                    LABEL.match(node.value):
                strings.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not names, f"names that are chapter labels: {names}"
    assert not strings, f"chapter labels outside report/labels.py: {strings}"
