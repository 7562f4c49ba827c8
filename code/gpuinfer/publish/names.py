"""The names a notebook cell reads and binds, from its parse tree.

A name a cell *reads* is one it loads before binding it itself: at the cell's top level in
the order the statements run, and in nested functions, lambdas, class bodies and
comprehensions wherever no enclosing scope of theirs binds it (those run later, once the
cell has bound its names). A name it *binds* is one its top level assigns, imports, defines
or loops over. gpuinfer.publish.cells uses both to say what passes from a chapter's
measurement cells to its presentation cells.
"""

from __future__ import annotations

import ast

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _bound_in(nodes) -> set[str]:
    """Names bound directly in a body (not in the scopes nested in it)."""
    names: set[str] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo += node.decorator_list  # evaluated here, not in the nested scope
            if not isinstance(node, ast.ClassDef):
                todo += node.args.defaults + [d for d in node.args.kw_defaults if d]
            continue
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        if isinstance(node, _SCOPES) and node not in nodes:
            continue
        todo += list(ast.iter_child_nodes(node))
    return names


def _scope_locals(node) -> set[str]:
    """The names local to a function, lambda, class body or comprehension."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                  if x is not None}
        body = [node.body] if isinstance(node, ast.Lambda) else node.body
        declared = {n for stmt in ast.walk(ast.Module(body=list(body), type_ignores=[]))
                    if isinstance(stmt, (ast.Global, ast.Nonlocal)) for n in stmt.names}
        return (params | _bound_in(body)) - declared
    if isinstance(node, ast.ClassDef):
        return _bound_in(node.body)
    return _bound_in([g.target for g in node.generators])


class _Reader(ast.NodeVisitor):
    """Walks one cell's top-level statements in order: a name loaded while neither this
    cell (so far) nor an enclosing nested scope binds it is a read."""

    def __init__(self, bound_anywhere: set[str]):
        self.bound: set[str] = set()  # bound at top level so far
        self.anywhere = bound_anywhere  # bound at top level somewhere in the cell
        self.local: list[set[str]] = []  # the nested scopes we are in
        self.reads: dict[str, None] = {}

    def read(self, name: str) -> None:
        if any(name in scope for scope in self.local):
            return
        if name in (self.anywhere if self.local else self.bound):
            return  # nested code runs later, once the cell has bound its names
        self.reads.setdefault(name, None)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.read(node.id)
        elif not self.local:
            self.bound.add(node.id)

    def _visit_all(self, nodes):
        for node in nodes:
            if node is not None:
                self.visit(node)

    def visit_Assign(self, node):
        self.visit(node.value)
        self._visit_all(node.targets)

    def visit_AnnAssign(self, node):
        self._visit_all([node.value, node.target])

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self.read(node.target.id)
        self._visit_all([node.value, node.target])

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        if self.local and not isinstance(self.local[-1], _ComprehensionScope):
            self.local[-1].add(node.target.id)
        else:  # a walrus in a comprehension binds in the enclosing scope
            self.bound.add(node.target.id)

    def visit_For(self, node):
        self._visit_all([node.iter, node.target] + node.body + node.orelse)

    visit_AsyncFor = visit_For

    def visit_Import(self, node):
        if not self.local:
            self.bound |= {(a.asname or a.name).split(".")[0] for a in node.names}

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node):
        self._visit_all([node.type])
        if node.name and not self.local:
            self.bound.add(node.name)
        self._visit_all(node.body)

    def _nested(self, node, body, scope: set[str]):
        self.local.append(scope)
        self._visit_all(body)
        self.local.pop()

    def visit_FunctionDef(self, node):
        a = node.args
        self._visit_all(node.decorator_list + a.defaults + a.kw_defaults)
        self._nested(node, node.body, _scope_locals(node))
        if not self.local:
            self.bound.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        a = node.args
        self._visit_all(a.defaults + a.kw_defaults)
        self._nested(node, [node.body], _scope_locals(node))

    def visit_ClassDef(self, node):
        self._visit_all(node.decorator_list + node.bases + [k.value for k in node.keywords])
        self._nested(node, node.body, _scope_locals(node))
        if not self.local:
            self.bound.add(node.name)

    def _comprehension(self, node, parts):
        first, *rest = node.generators
        self.visit(first.iter)  # evaluated in the enclosing scope
        scope = _ComprehensionScope(_scope_locals(node))
        self.local.append(scope)
        self._visit_all([first.target] + first.ifs)
        for gen in rest:
            self._visit_all([gen.iter, gen.target] + gen.ifs)
        self._visit_all(parts)
        self.local.pop()

    def visit_ListComp(self, node):
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, [node.key, node.value])


class _ComprehensionScope(set):
    pass


def _imports(tree: ast.Module) -> dict[str, str]:
    """Top-level names bound by imports, with the module each came from."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                found[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"
    return found




def names_of(tree: ast.Module) -> tuple[tuple[str, ...], frozenset[str], dict[str, str]]:
    """(the names the code reads, in first-read order; the names it binds at top level;
    {name: module} of those its top-level imports bind)."""
    reader = _Reader(_bound_in(tree.body))
    for stmt in tree.body:
        reader.visit(stmt)
    return tuple(reader.reads), frozenset(reader.bound), _imports(tree)
