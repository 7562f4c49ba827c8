"""The package definitions a chapter's measurement cells reach (gpuinfer.publish.reach):
on a small package written for the test, then on the book's own package and chapters, read
through Sources that change one file in memory (nothing on disk changes)."""

import ast
import time
from pathlib import Path

import pytest

from gpuinfer.publish import book, cells, hashes, reach

ROOT = Path(__file__).resolve().parent.parent

PACKAGE = {
    "__init__.py": '"""The test package."""\n',
    "a.py": '''"""Calls b."""
from gpuinfer.b import middle


def top(x):
    return middle(x) + 1
''',
    "b.py": '''from gpuinfer import c


def middle(x):
    return c.bottom(x) * 2
''',
    "c.py": '''def bottom(x):
    return x - 1


def other():
    return 0


class Thing:
    def method(self):
        return 1
''',
    "sub/__init__.py": "",
    "sub/d.py": "def f():\n    return 4\n",
}
CELL = "from gpuinfer.a import top\nprint(top(1))"


class Edited:
    """Sources with some files' text replaced (None: the file is gone)."""

    def __init__(self, base: reach.Sources, texts: dict[str, str | None]):
        self.base, self.texts = base, texts

    def read(self, relpath):
        return self.texts[relpath] if relpath in self.texts else self.base.read(relpath)

    def files(self):
        return sorted({*self.base.files(), *(k for k, v in self.texts.items() if v)}
                      - {k for k, v in self.texts.items() if v is None})


@pytest.fixture
def package(tmp_path):
    """A TreeSources over PACKAGE written to tmp_path."""
    for rel, text in PACKAGE.items():
        path = tmp_path / "gpuinfer" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return reach.TreeSources(tmp_path / "gpuinfer")


def defs(sources, *cell_sources, shown=()):
    return reach.definitions(list(cell_sources), list(shown), sources)


def test_a_chain_of_calls_and_the_modules_imported_on_the_way(package):
    assert set(defs(package, CELL)) == {
        "__init__.py", "a.py", "a.py::top", "b.py", "b.py::middle", "c.py", "c.py::bottom"}


def test_an_unreached_function_added_or_changed_keeps_the_hash(package):
    before = defs(package, CELL)
    added = PACKAGE["a.py"] + "\n\ndef spare():\n    return top(2)\n"
    other = PACKAGE["c.py"].replace("return 0", "return 7")
    assert defs(Edited(package, {"a.py": added, "c.py": other}), CELL) == before


def test_a_change_three_calls_away_changes_the_hash(package):
    before = defs(package, CELL)
    after = defs(Edited(package, {"c.py": PACKAGE["c.py"].replace("x - 1", "x - 2")}), CELL)
    assert reach.changed(before, after) == ["c.py::bottom changed"]


def test_a_method_of_a_reached_class_changes_the_hash(package):
    cell = "from gpuinfer.c import Thing\nThing()"
    before = defs(package, cell)
    edited = PACKAGE["c.py"].replace("return 1", "return 2")
    assert reach.changed(before, defs(Edited(package, {"c.py": edited}), cell)) == [
        "c.py::Thing changed"]


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("return x - 1", "return x - 1  # off by one"),
    lambda s: s.replace("def bottom(x):", 'def bottom(x):\n    """The bottom."""\n'),
    lambda s: "# a comment\n\n\n" + s + "\n\n",
    lambda s: s.replace("return x - 1", "return (x -\n            1)"),
])
def test_comments_docstrings_and_layout_keep_the_hash(package, edit):
    assert defs(Edited(package, {"c.py": edit(PACKAGE["c.py"])}), CELL) == \
        defs(package, CELL)


def test_a_new_module_level_statement_on_the_way_changes_the_hash(package):
    edited = PACKAGE["b.py"] + "\nLIMIT = 3\n"
    after = defs(Edited(package, {"b.py": edited}), CELL)
    assert reach.changed(defs(package, CELL), after) == ["b.py changed"]


def test_a_module_imports_the_packages_above_it_and_what_their_statements_import(package):
    sources = Edited(package, {"sub/__init__.py": "from gpuinfer import c\nSIZE = 2\n"})
    found = defs(sources, "from gpuinfer.sub.d import f\nf()")
    assert set(found) == {"__init__.py", "sub/__init__.py", "sub/d.py", "sub/d.py::f",
                          "c.py"}  # c imported, none of its definitions used


def test_an_import_never_used_reaches_no_definition(package):
    assert set(defs(package, "from gpuinfer.c import other, Thing")) == {"__init__.py",
                                                                          "c.py"}


def test_names_are_followed_through_re_exports_attributes_and_statements(package):
    sources = Edited(package, {
        "e.py": "import gpuinfer.c\nfrom gpuinfer.a import middle as mid\n"
                "TABLE = {'x': mid}\n\ndef g():\n    return gpuinfer.c.Thing.method\n",
        "f.py": "from gpuinfer.c import Thing\n\n"
                "def h(t: Thing) -> Thing:\n    return t\n"})
    assert "b.py::middle" in defs(sources, "import gpuinfer.e")  # TABLE's value
    assert "c.py::Thing" in defs(sources, "from gpuinfer import e\ne.g()")
    annotated = defs(sources, "from gpuinfer.f import h\nh(1)")
    assert "c.py::Thing" not in annotated  # annotations do not run


def test_imports_in_a_function_body_count_when_it_is_reached(package):
    sources = Edited(package, {"g.py": "def lazy():\n    from gpuinfer.c import bottom\n"
                                       "    return bottom(1)\n\ndef idle():\n"
                                       "    from gpuinfer.sub import d\n"})
    found = defs(sources, "from gpuinfer.g import lazy\nlazy()")
    assert "c.py::bottom" in found and "sub/d.py" not in found


@pytest.mark.parametrize("body, looked_in_c", [
    ("import importlib\n\ndef load(name):\n    return importlib.import_module(name)\n",
     False),
    ("def load(name):\n    return globals()[name]\n", False),
    ("import sys\n\ndef load(name):\n    return sys.modules[name]\n", False),
    ("from gpuinfer import c\n\ndef load(name):\n    return getattr(c, name)\n", True),
    ("from gpuinfer import c\n\ndef load(name):\n    return vars(c)[name]\n", True),
    ("from gpuinfer.c import *\n\ndef load(name):\n    return bottom\n", True),
])
def test_a_name_looked_up_by_string_counts_the_whole_module(package, body, looked_in_c):
    sources = Edited(package, {"dyn.py": body + "\n\ndef spare():\n    return 1\n"})
    found = defs(sources, "from gpuinfer.dyn import load\nload('x')")
    assert "dyn.py::spare" in found
    assert ("c.py::other" in found) == looked_in_c  # the object's module too


def test_a_constant_attribute_name_in_getattr_is_an_attribute(package):
    sources = Edited(package, {"h.py": "from gpuinfer import c\n\ndef k():\n"
                                       "    return getattr(c, 'bottom')\n"})
    found = defs(sources, "from gpuinfer.h import k\nk()")
    assert "c.py::bottom" in found and "c.py::other" not in found


@pytest.mark.parametrize("how", [("-m", "gpuinfer.entry"),
                                 ("-c", "from gpuinfer.entry import main; main()")],
                         ids=["dash_m", "dash_c_code"])
def test_a_module_run_in_a_subprocess_counts_whole(package, how):
    flag, value = how
    sources = Edited(package, {
        "runner.py": "import subprocess, sys\n\ndef run():\n    subprocess.run([sys."
                     f"executable, '{flag}', '{value}'])\n",
        "entry.py": "def main():\n    return 1\n\ndef helper():\n    return 2\n"})
    found = defs(sources, "from gpuinfer.runner import run\nrun()")
    assert {"entry.py", "entry.py::main", "entry.py::helper"} <= set(found)


def test_shown_reads_the_literalincludes_of_package_sources():
    page = """Text.

```{literalinclude} ../code/gpuinfer/c.py
:pyobject: Thing.method
:emphasize-lines: 2
```

```{literalinclude} ../code/gpuinfer/sub/d.py
```

````{literalinclude} ../scripts/tool.py
:pyobject: main
````
"""
    assert reach.shown(page) == [("c.py", "Thing.method"), ("sub/d.py", None)]


def test_what_the_page_shows_counts(package):
    found = defs(package, shown=[("c.py", "Thing.method")])
    assert set(found) == {"__init__.py", "c.py", "c.py::Thing"}
    whole = defs(package, shown=[("sub/d.py", None)])
    assert {"sub/d.py::f", "sub/__init__.py"} <= set(whole)
    assert defs(package, shown=[("gone.py", None)]) == {}


def test_why_says_how_a_unit_is_reached(package):
    found = reach.reach([CELL], [], package)
    assert found.why("c.py::bottom") == \
        "measurement cell 1 -> a.py::top -> b.py::middle -> c.py::bottom"


def test_cells_are_compared_as_parsed():
    one, comment, code, magic = reach.cells_hashes(
        ["x = f(1)\n", "# set x\nx = f( 1 )\n\n", "x = f(2)\n", "%time x = 1\n"])
    assert one == comment != code
    assert reach.cells_hashes(["%time x = 1\n# two\n"])[0] == magic
    assert reach.cells_hashes(["x = (\n"]) != reach.cells_hashes(["x = ((\n"])  # as written


# --- the book's own package and chapters --------------------------------------------------

@pytest.fixture(scope="module")
def chapters():
    """{stem: (measurement cell sources, what the page shows)} of the book's chapters."""
    found = {}
    for stem, path in book.chapters(ROOT).items():
        nb = book.read_chapter(path)
        found[stem] = ([c.source for c in cells.code_cells(nb) if not c.presentation],
                       reach.shown(book.read_text(path)))
    return found


def all_definitions(chapters, sources):
    return {stem: reach.definitions(srcs, shown, sources)
            for stem, (srcs, shown) in chapters.items()}


def in_every_function(text: str, statement: str, only: str | None = None) -> str:
    """`text` with `statement` added at the end of each top-level function's body (or of
    the one named `only`)."""
    lines = text.splitlines(keepends=True)
    functions = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)
                 and (only is None or n.name == only)]
    for node in sorted(functions, key=lambda n: n.lineno, reverse=True):
        last = node.body[-1]
        indent = " " * node.body[0].col_offset
        lines.insert(last.end_lineno, f"{indent}{statement}\n")
    return "".join(lines)


def test_the_six_chapters_are_read(chapters):
    assert len(chapters) == 6 and all(srcs for srcs, _ in chapters.values())
    assert ("measure/timing.py", "benchmark") in chapters["01_roofline"][1]


def test_book_unreached_functions_change_no_chapter(chapters):
    tree = reach.TreeSources(hashes.PACKAGE_DIR)
    before = all_definitions(chapters, tree)
    spare = "\n\ndef spare_for_the_test(x):\n    return [x, 1]\n"
    texts = {rel: tree.read(rel) + spare for rel in ("measure/timing.py", "report/plots.py",
                                                      "env.py")}
    assert all_definitions(chapters, Edited(tree, texts)) == before


def test_book_a_statement_in_benchmark_stales_chapter_1(chapters):
    tree = reach.TreeSources(hashes.PACKAGE_DIR)
    srcs, shown = chapters["01_roofline"]
    edited = in_every_function(tree.read("measure/timing.py"), "_probe = 0", "benchmark")
    after = reach.definitions(srcs, shown, Edited(tree, {"measure/timing.py": edited}))
    assert reach.changed(reach.definitions(srcs, shown, tree), after) == [
        "measure/timing.py::benchmark changed"]


def test_book_a_statement_in_every_gemv_function_stales_chapter_5(chapters):
    tree = reach.TreeSources(hashes.PACKAGE_DIR)
    srcs, shown = chapters["05_triton_decode"]
    edited = in_every_function(tree.read("kernels/gemv.py"), "_probe = 0")
    after = reach.definitions(srcs, shown, Edited(tree, {"kernels/gemv.py": edited}))
    assert reach.definitions(srcs, shown, tree) != after


def test_book_definitions_are_quick(chapters):
    """The build and every status check compute them for each chapter."""
    start = time.perf_counter()
    all_definitions(chapters, reach.TreeSources(hashes.PACKAGE_DIR))
    assert time.perf_counter() - start < 5  # about 0.3 s cold, 0.03 s warm on 2 CPU cores


def test_book_the_stock_process_run_with_dash_m_is_reached(chapters):
    """measure/stock.py runs measure/stock_process.py as `python -m`: a chapter that
    measures the stock baseline reaches all of it."""
    tree = reach.TreeSources(hashes.PACKAGE_DIR)
    found = reach.definitions(["from gpuinfer.measure.stock import stock_fresh\n"
                               "stock_fresh()"], [], tree)
    assert "measure/stock_process.py" in found
    assert {key for key in found if key.startswith("measure/stock_process.py::")}


# --- what the analysis cannot follow, refused ---------------------------------------------

# Places that import a name built at run time, or run code by a path, which the reach
# analysis cannot follow, and why each may: none of them runs in a chapter's measurement.
UNFOLLOWED_ALLOWED = {
    "publish/kept.py": "restores a kept value's class by name in the kernel: the recorder's "
                       "own code, hashed whole into every recording (publish.recorder)",
    "publish/preflight.py": "imports the third-party packages the record command needs, "
                            "before it runs: no chapter runs it",
}


def _is_python(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "executable"
            and isinstance(node.value, ast.Name) and node.value.id == "sys") or (
        isinstance(node, ast.Constant) and node.value in ("python", "python3"))


def unfollowed(text: str) -> list[tuple[int, str]]:
    """(line, what) of each place in a module's source that the reach analysis cannot
    follow: `import_module`/`__import__`/runpy of a name that is not a literal, and a
    Python started on a file's path or on code that is not a literal."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            func = node.func  # importlib.import_module, runpy.run_path, __import__, ...
            name = (func.attr if isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id in ("importlib", "runpy")
                    else getattr(func, "id", ""))
            first = node.args[0] if node.args else None
            if name in ("import_module", "__import__", "run_module", "run_path") and not (
                    isinstance(first, ast.Constant) and isinstance(first.value, str)):
                found.append((node.lineno, f"{name} of a name built at run time"))
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for i, item in enumerate(items[:-1]):
                if not _is_python(item):
                    continue
                flag, target = items[i + 1], items[i + 2] if i + 2 < len(items) else None
                literal = isinstance(target, ast.Constant) and isinstance(target.value, str)
                if isinstance(flag, ast.Constant) and flag.value in ("-m", "-c"):
                    if not literal:
                        found.append((node.lineno, f"python {flag.value} of a value built "
                                                   "at run time"))
                else:
                    found.append((node.lineno, "python run on a file's path"))
    return found


def test_the_package_runs_and_imports_only_what_the_analysis_follows():
    tree = reach.TreeSources(hashes.PACKAGE_DIR)
    places = [f"code/gpuinfer/{rel}:{line}: {what}" for rel in tree.files()
              if rel not in UNFOLLOWED_ALLOWED for line, what in unfollowed(tree.read(rel))]
    assert not places, ("the reach analysis cannot follow these (use `python -m` with the "
                        "module's literal name, or import it by a literal name): "
                        + "; ".join(places))
    for rel in UNFOLLOWED_ALLOWED:  # the list names only places that still need it
        assert unfollowed(tree.read(rel)), rel


@pytest.mark.parametrize("code", [
    "import importlib\nimportlib.import_module('gpuinfer.' + name)\n",
    "__import__(f'gpuinfer.{name}')\n",
    "import subprocess, sys\nsubprocess.run([sys.executable, 'gpuinfer/x.py'])\n",
    "import subprocess, sys\nsubprocess.run([sys.executable, str(HERE / 'x.py')])\n",
    "import subprocess\nsubprocess.run(['python3', '-c', source])\n",
    "import runpy\nrunpy.run_path(path)\n",
])
def test_the_scan_finds_what_cannot_be_followed(code):
    assert [line for line, _ in unfollowed(code)] == [len(code.splitlines())]


@pytest.mark.parametrize("code", [
    "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'gpuinfer.x', arg])\n",
    "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import gpuinfer.x'])\n",
    "import importlib\nimportlib.import_module('gpuinfer.x')\n",
])
def test_the_scan_passes_what_is_followed(code):
    assert unfollowed(code) == []
