"""Which chapters the book has, and whether each chapter's GPU recording is still valid.

A chapter is a file of the table of contents (`_toc.yml`) that is a MyST notebook. Its
recording is the executed notebook `_recorded/<stem>.ipynb` beside it, written by
`python -m gpuinfer.publish.record` on the GPU, with its provenance in `metadata["gpuinfer"]` and
two hashes of what produced it:

- chapter_hash: the chapter's code cells (editing the prose keeps a recording valid);
- package_hash: the gpuinfer modules the chapter imports, followed through the imports
  between them, plus the `__init__.py` of every package on the way (editing a module the
  chapter does not use keeps it valid too). A module is hashed as Python parses it, without
  its docstrings (comments never reach the parse), so editing a comment or a docstring keeps
  a recording valid; the chapter's own cells are hashed as written, since its page shows
  them from the recording.

Plain functions, no Sphinx: the record command, the Sphinx extension and the tests share them.
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the gpuinfer sources chapters import
METADATA_KEY = "gpuinfer"  # where a recording keeps its provenance
REQUIRED_METADATA = ("chapter_hash", "package_hash", "modules", "smoke")
STATES = ("fresh", "stale", "missing", "cpu", "corrupt")


def record_command(chapter: str) -> str:
    return (f"`python -m gpuinfer.publish.record {chapter}` on a CUDA machine "
            f"(on the book's H200: `bash scripts/gpu_record.sh {chapter}`)")


# --- the chapters -------------------------------------------------------------------------

def _toc_files(entry) -> list[str]:
    """The `file:` and `root:` entries of a _toc.yml (sub)tree, in reading order."""
    if isinstance(entry, list):
        return [f for item in entry for f in _toc_files(item)]
    if not isinstance(entry, dict):
        return []
    found = [entry[key] for key in ("root", "file") if isinstance(entry.get(key), str)]
    for key in ("parts", "chapters", "sections"):
        found += _toc_files(entry.get(key, []))
    return found


def is_myst_notebook(path: Path) -> bool:
    """True for a markdown file whose front matter says it is a MyST (jupytext) notebook."""
    text = path.read_text(encoding="utf8")
    if not text.startswith("---"):
        return False
    import yaml  # here, not at the top: the record command checks first that it is installed

    try:
        meta = yaml.safe_load(text.split("\n---", 1)[0][3:])
    except yaml.YAMLError:
        return False
    if not isinstance(meta, dict):
        return False
    fmt = (meta.get("jupytext") or {}).get("text_representation", {}).get("format_name")
    return fmt == "myst" or meta.get("file_format") == "mystnb"


def toc_files(root: Path | str) -> list[str]:
    """Every page of the TOC, as written there ('book/intro', 'book/01_roofline', ...)."""
    import yaml

    return _toc_files(yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf8")))


def chapters(root: Path | str) -> dict[str, Path]:
    """The book's chapters in TOC order: {stem: path of the .md}."""
    root = Path(root)
    found = {}
    for entry in toc_files(root):
        path = root / (entry if entry.endswith(".md") else entry + ".md")
        if path.is_file() and is_myst_notebook(path):
            if path.stem in found:
                raise ValueError(f"two chapters named {path.stem}: {found[path.stem]}, {path}")
            found[path.stem] = path
    return found


def drafts(root: Path | str) -> dict[str, Path]:
    """Chapters written but not yet in the TOC: the MyST notebooks beside the chapters that
    the TOC does not list, {stem: path}. The build leaves them out (only_build_toc_files);
    the tests still run them in smoke mode."""
    listed = chapters(root)
    folders = sorted({path.parent for path in listed.values()})
    return {path.stem: path for folder in folders for path in sorted(folder.glob("*.md"))
            if path.stem not in listed and is_myst_notebook(path)}


def recording_path(chapter_path: Path) -> Path:
    """`book/01_roofline.md` -> `book/_recorded/01_roofline.ipynb`."""
    return chapter_path.parent / "_recorded" / (chapter_path.stem + ".ipynb")


def artifacts_path(chapter_path: Path) -> Path:
    """`book/01_roofline.md` -> `book/_recorded/01_roofline/` (gzipped traces and such)."""
    return chapter_path.parent / "_recorded" / chapter_path.stem


def read_chapter(path: Path):
    """The chapter as an nbformat notebook (the explicit fmt: else jupytext sees plain md)."""
    import jupytext

    return jupytext.read(path, fmt="md:myst")


# --- the hashes ---------------------------------------------------------------------------

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def code_sources(nb) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def chapter_hash(nb) -> str:
    return _sha256(json.dumps(code_sources(nb)).encode())


@functools.lru_cache(maxsize=None)
def _python_tree(source: str) -> ast.Module:
    """`ast.parse`, once per distinct source: a status check follows the imports of every
    module and hashes it, for every chapter, and the chapters share most modules. Callers
    only read the tree."""
    return ast.parse(source)


def _parse(source: str) -> ast.Module:
    """Parse a cell; IPython syntax (%magic, !shell) is translated to Python first."""
    try:
        return _python_tree(source)
    except SyntaxError:
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(source))
    except (ImportError, SyntaxError):
        return ast.Module(body=[], type_ignores=[])  # broken code fails when executed anyway


def _imported_names(tree: ast.Module, module: str | None) -> set[str]:
    """Dotted names under `gpuinfer` that `tree` imports; `module` is the importer's own
    dotted name (e.g. 'gpuinfer.env'), for relative imports; some names are attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    continue
                package = module.split(".")[: -node.level]  # a flat package: 'gpuinfer'
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return {n for n in names if n == "gpuinfer" or n.startswith("gpuinfer.")}


def _module_file(name: str, package_dir: Path) -> Path | None:
    """The source file of dotted module `name` under package_dir, or None (an attribute)."""
    parts = name.split(".")[1:]
    if not parts:
        return package_dir / "__init__.py"
    for candidate in (package_dir.joinpath(*parts[:-1], parts[-1] + ".py"),
                      package_dir.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _dotted(path: Path, package_dir: Path) -> str:
    """gpuinfer/env.py -> 'gpuinfer.env'; gpuinfer/__init__.py -> 'gpuinfer.__init__' (so
    that dropping the last part gives the package a relative import starts from)."""
    return ".".join(("gpuinfer",) + path.relative_to(package_dir).with_suffix("").parts)


def imported_modules(sources: list[str], package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The package modules that code imports, followed transitively, as sorted relative paths
    ('__init__.py', 'env.py', 'kernels/__init__.py', ...). Importing a module runs the
    `__init__.py` of every package above it, so those are in too (gpuinfer's always)."""
    todo = [name for src in sources for name in _imported_names(_parse(src), None)]
    todo.append("gpuinfer")
    seen: set[Path] = set()
    while todo:
        name = todo.pop()
        path = _module_file(name, package_dir)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above
        tree = _parse(path.read_text(encoding="utf8"))
        todo += _imported_names(tree, _dotted(path, package_dir))
    return sorted(str(p.relative_to(package_dir).as_posix()) for p in seen)


def _is_docstring(node: ast.AST) -> bool:
    """A statement that is a bare string: a docstring, or an attribute's docstring after it
    (either way it computes nothing)."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _canonical(node) -> str:
    """The parse tree as text, without positions, docstrings and empty fields. Not
    `ast.dump`: that prints fields newer Pythons added (`type_params=[]` from 3.12 on), and a
    recording made on the GPU's Python must read as fresh on the CI's older one."""
    if isinstance(node, list):
        return "[" + ",".join(_canonical(n) for n in node if not _is_docstring(n)) + "]"
    if not isinstance(node, ast.AST):
        return f"{type(node).__name__}:{node!r}"  # a constant, a name, an operator's id
    fields = [(name, getattr(node, name, None)) for name in node._fields]
    return type(node).__name__ + "(" + ",".join(
        f"{name}={_canonical(value)}" for name, value in fields
        if value is not None and value != []) + ")"


@functools.lru_cache(maxsize=None)  # the chapters share most modules
def source_hash(source: str) -> str:
    """sha256 of a module as Python parses it: comments, docstrings, blank lines and layout
    do not count; a changed name, constant or statement does. Source that does not parse
    is hashed as written (running it fails anyway)."""
    try:
        return _sha256(_canonical(_python_tree(source)).encode())
    except SyntaxError:
        return _sha256(source.replace("\r\n", "\n").encode())


def module_hashes(modules: list[str], package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """`source_hash` of each module."""
    return {m: source_hash((package_dir / m).read_text(encoding="utf8")) for m in modules}


def package_hash(hashes: dict[str, str]) -> str:
    return _sha256(json.dumps(sorted(hashes.items())).encode())


def current_hashes(nb, package_dir: Path = PACKAGE_DIR) -> dict:
    """What a recording of notebook `nb` made now would store: both hashes and the modules."""
    modules = module_hashes(imported_modules(code_sources(nb), package_dir), package_dir)
    return {"chapter_hash": chapter_hash(nb), "package_hash": package_hash(modules),
            "modules": modules}


# --- the status of a recording ------------------------------------------------------------

@dataclass(frozen=True)
class Status:
    chapter: str
    state: str  # one of STATES
    reason: str  # why, in words
    recording: Path
    provenance: dict = field(default_factory=dict)  # the recording's metadata["gpuinfer"]
    modules: tuple[str, ...] = ()  # package modules the chapter imports now

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"

    @property
    def message(self) -> str:
        if self.fresh:
            return f"chapter {self.chapter}: {self.reason}"
        return (f"chapter {self.chapter} has no valid GPU recording: {self.reason}. "
                f"Re-record it with {record_command(self.chapter)}.")


def recorded_on(meta: dict) -> str:
    """Where and when a recording ran, as every page says it: 'recorded on an NVIDIA H200,
    2026-12-01 09:33 UTC', or, for a CPU smoke run, a warning in place of the GPU."""
    where = ("a CPU smoke run, not GPU results" if meta.get("smoke")
             else f"recorded on an {meta.get('gpu')}")
    return f"{where}, {meta.get('date', '?')}"


def read_provenance(recording: Path) -> dict:
    """metadata["gpuinfer"] of a recording, once its outputs are checked (`check_outputs`);
    ValueError/OSError when it is unreadable or damaged."""
    with open(recording, encoding="utf8") as f:
        nb = json.load(f)
    meta = nb.get("metadata", {}).get(METADATA_KEY) if isinstance(nb, dict) else None
    if not isinstance(meta, dict):
        raise ValueError(f"no metadata['{METADATA_KEY}']")
    missing = [k for k in REQUIRED_METADATA if k not in meta]
    if missing:
        raise ValueError(f"metadata['{METADATA_KEY}'] lacks {', '.join(missing)}")
    if not isinstance(nb.get("cells"), list):
        raise ValueError("no cells")
    check_outputs(nb)
    return meta


# What each kind of output must hold for myst-nb to render it.
OUTPUT_FIELDS = {"display_data": "data", "execute_result": "data", "stream": "text",
                 "error": "ename"}


def check_outputs(nb: dict) -> None:
    """Raise ValueError, naming the cell and the output, if an output of the notebook is one
    that would stop the page from rendering: of an unknown type, without its data, or with
    an image that is not base64. (Valid JSON can still be damaged inside.)"""
    for i, cell in enumerate(nb["cells"], start=1):
        for j, out in enumerate(cell.get("outputs", []) if isinstance(cell, dict) else [], 1):
            where = f"cell {i}, output {j}"
            kind = out.get("output_type") if isinstance(out, dict) else None
            if kind not in OUTPUT_FIELDS:
                raise ValueError(f"{where}: unknown output type {kind!r}")
            if OUTPUT_FIELDS[kind] not in out:
                raise ValueError(f"{where}: a {kind} output without '{OUTPUT_FIELDS[kind]}'")
            for mime, value in out.get("data", {}).items():
                if mime.startswith("image/") and mime != "image/svg+xml":
                    try:
                        text = "".join(value) if isinstance(value, list) else value
                        base64.b64decode("".join(text.split()), validate=True)  # lines ok
                    except (AttributeError, TypeError, ValueError):
                        raise ValueError(f"{where}: its {mime} is not base64") from None


def status(root: Path | str, chapter: str, *, accept_cpu: bool = False,
           package_dir: Path = PACKAGE_DIR) -> Status:
    """Is `chapter`'s recording fresh, stale, missing, a CPU smoke run, or corrupt?

    accept_cpu=True counts a CPU smoke recording as fresh (tests of the mechanism only).
    """
    all_chapters = chapters(root)
    if chapter not in all_chapters:
        raise KeyError(f"unknown chapter {chapter!r}; chapters: {', '.join(all_chapters)}")
    path = all_chapters[chapter]
    rec = recording_path(path)
    shown = rec.relative_to(Path(root)).as_posix()
    now = current_hashes(read_chapter(path), package_dir)
    modules = tuple(now["modules"])

    def result(state, reason, meta=None):
        return Status(chapter, state, reason, rec, meta or {}, modules)

    if not rec.exists():
        return result("missing", f"there is no recording {shown}")
    try:
        meta = read_provenance(rec)
    except (OSError, ValueError) as exc:
        return result("corrupt", f"the recording {shown} is unreadable ({exc})")
    if meta["chapter_hash"] != now["chapter_hash"]:
        return result("stale", "its code cells changed since it was recorded", meta)
    if meta["package_hash"] != now["package_hash"]:
        old = meta["modules"] if isinstance(meta["modules"], dict) else {}
        changed = sorted(m for m in set(old) | set(now["modules"])
                         if old.get(m) != now["modules"].get(m))
        return result("stale", "the gpuinfer sources it imports changed since it was "
                      f"recorded ({', '.join('gpuinfer/' + m for m in changed)})", meta)
    if meta["smoke"] and not accept_cpu:
        return result("cpu", f"{shown} is a CPU smoke recording (made with --allow-cpu), "
                      "not GPU results", meta)
    return result("fresh", recorded_on(meta), meta)
