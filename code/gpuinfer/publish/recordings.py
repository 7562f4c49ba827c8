"""Which chapters the book has, and whether each chapter's GPU recording is still valid.

A chapter is a file of the table of contents (`_toc.yml`) that is a MyST notebook. Its
recording is the executed notebook `_recorded/<stem>.ipynb` beside it, written by
`python -m gpuinfer.publish.record` on the GPU, with its provenance in `metadata["gpuinfer"]`
and three hashes of what produced it:

- chapter_hash: the chapter's code cells (editing the prose keeps a recording valid);
- package_hash: the gpuinfer modules the chapter imports, followed through the imports
  between them, plus the `__init__.py` of every package on the way (editing a module the
  chapter does not use keeps it valid too). A module is hashed as Python parses it, without
  its docstrings (comments never reach the parse), so editing a comment or a docstring keeps
  a recording valid; the chapter's own cells are hashed as written, since its page shows
  them from the recording;
- artifacts: each file of `_recorded/<stem>/` (profiler traces), so that a missing, altered
  or extra file makes the recording stale. Recordings made before this was kept have none,
  and their artifacts go unchecked.

A recording is also checked for what would break its page: a notebook that nbformat does
not validate, an image that is not base64, code cells that are not those it hashed. A book
whose TOC or pages cannot be read raises BookError, one line naming the file and the fix.

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
STATES = ("fresh", "stale", "missing", "cpu", "corrupt", "unfinished")


class BookError(ValueError):
    """The book's TOC, or a page it lists, cannot be read as it must be. The message is one
    line that names the file and the fix; the record command, the tests and the build all
    stop with it."""


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


def _shown(path: Path, root: Path | None = None) -> str:
    """A path as a message shows it: relative to the book's root when given and below it,
    else to the current folder when below it, else whole."""
    path = Path(path).resolve()
    for base in ([Path(root).resolve()] if root is not None else []) + [Path.cwd()]:
        if path.is_relative_to(base) and path != base:
            return path.relative_to(base).as_posix()
    return str(path)


def read_text(path: Path, root: Path | None = None) -> str:
    """A page of the book as text; BookError, naming the file and the byte, if it is not
    UTF-8 (Sphinx, jupytext and the record command all read pages as UTF-8)."""
    try:
        return Path(path).read_text(encoding="utf8")
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise BookError(f"{_shown(path, root)} is not UTF-8 text: byte "
                        f"0x{exc.object[exc.start]:02x} on line {line}; save the file as "
                        "UTF-8") from None
    except OSError as exc:
        raise BookError(f"cannot read {_shown(path, root)}: {exc.strerror or exc}") from None


def _yaml_problem(exc) -> str:
    """' (line 5): expected <block end>, ...' from a YAMLError, for a one-line message."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    return f"{where}: {getattr(exc, 'problem', None) or 'invalid YAML'}"


def front_matter(path: Path, root: Path | None = None) -> dict | None:
    """The YAML front matter of a markdown page, None if it has none; BookError if it has
    one that is not a YAML mapping (which would silently turn a chapter into a plain page)."""
    text = read_text(path, root)
    if not text.startswith("---"):
        return None
    import yaml  # here, not at the top: the record command checks first that it is installed

    head, closed, _ = text[3:].partition("\n---")
    if not closed:
        raise BookError(f"{_shown(path, root)}: its front matter, opened by '---' on line 1, "
                        "has no closing '---' line; close it")
    try:
        meta = yaml.safe_load(head)
    except yaml.YAMLError as exc:
        raise BookError(f"{_shown(path, root)}: its front matter is not valid YAML"
                        f"{_yaml_problem(exc)}; fix it") from None
    if not isinstance(meta, dict):
        raise BookError(f"{_shown(path, root)}: its front matter is not a YAML mapping "
                        "(key: value lines); fix it")
    return meta


def is_myst_notebook(path: Path, root: Path | None = None) -> bool:
    """True for a markdown file whose front matter says it is a MyST (jupytext) notebook."""
    meta = front_matter(path, root)
    if meta is None:
        return False
    jupytext = meta.get("jupytext") if isinstance(meta.get("jupytext"), dict) else {}
    representation = jupytext.get("text_representation")
    fmt = representation.get("format_name") if isinstance(representation, dict) else None
    return fmt == "myst" or meta.get("file_format") == "mystnb"


def toc_files(root: Path | str) -> list[str]:
    """Every page of the TOC, as written there ('book/intro', 'book/01_roofline', ...);
    BookError when _toc.yml is missing or is not a Jupyter Book TOC."""
    import yaml

    toc = Path(root) / "_toc.yml"
    if not toc.is_file():
        raise BookError(f"{Path(root).resolve()} has no _toc.yml: name the book's root folder")
    try:
        data = yaml.safe_load(read_text(toc, root))
    except yaml.YAMLError as exc:
        raise BookError(f"{_shown(toc)} is not valid YAML{_yaml_problem(exc)}; fix it") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("root"), str):
        raise BookError(f"{_shown(toc)} is not a Jupyter Book table of contents: it needs a "
                        "'root:' page (see jupyterbook.org, 'Table of Contents')")
    return _toc_files(data)


def chapters(root: Path | str) -> dict[str, Path]:
    """The book's chapters in TOC order: {stem: path of the .md}. BookError for a TOC entry
    outside the book (its recording would be written there), for two chapters with one
    name (a chapter is named by its file's stem), and for a page that cannot be read."""
    root = Path(root)
    inside = root.resolve()
    found = {}
    for entry in toc_files(root):
        path = root / (entry if entry.endswith(".md") else entry + ".md")
        if not path.resolve().is_relative_to(inside):
            raise BookError(f"{_shown(root / '_toc.yml')}: the entry {entry!r} lies outside "
                            f"the book ({inside}); list pages inside the book's folder")
        if path.is_file() and is_myst_notebook(path, root):
            if path.stem in found:
                raise BookError(
                    f"{_shown(root / '_toc.yml')} lists two chapters named {path.stem} "
                    f"({_shown(found[path.stem], root)}, {_shown(path, root)}); chapters "
                    "are named by their file names: rename one")
            found[path.stem] = path
    return found


def drafts(root: Path | str) -> dict[str, Path]:
    """Chapters written but not yet in the TOC: the MyST notebooks beside the chapters that
    the TOC does not list, {stem: path}. The build leaves them out (only_build_toc_files);
    the tests still run them in smoke mode."""
    listed = chapters(root)
    folders = sorted({path.parent for path in listed.values()})
    return {path.stem: path for folder in folders for path in sorted(folder.glob("*.md"))
            if path.stem not in listed and is_myst_notebook(path, root)}


def recording_path(chapter_path: Path) -> Path:
    """`book/01_roofline.md` -> `book/_recorded/01_roofline.ipynb`."""
    return chapter_path.parent / "_recorded" / (chapter_path.stem + ".ipynb")


def artifacts_path(chapter_path: Path) -> Path:
    """`book/01_roofline.md` -> `book/_recorded/01_roofline/` (gzipped traces and such)."""
    return chapter_path.parent / "_recorded" / chapter_path.stem


def journal_path(chapter_path: Path) -> Path:
    """`book/_recorded/.01_roofline.commit`: there while a recording is being written (see
    gpuinfer.publish.store); left behind only by a write cut short by a kill."""
    return chapter_path.parent / "_recorded" / f".{chapter_path.stem}.commit"


def read_chapter(path: Path):
    """The chapter as an nbformat notebook (the explicit fmt: else jupytext sees plain md)."""
    import jupytext

    return jupytext.reads(read_text(path, path.parent.parent), fmt="md:myst")


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
        fix = ("" if self.state == "unfinished"  # the reason says how to finish it
               else f" Re-record it with {record_command(self.chapter)}.")
        return f"chapter {self.chapter} has no valid GPU recording: {self.reason}.{fix}"


def recorded_on(meta: dict) -> str:
    """Where and when a recording ran, as every page says it: 'recorded on an NVIDIA H200,
    2026-12-01 09:33 UTC', or, for a CPU smoke run, a warning in place of the GPU."""
    where = ("a CPU smoke run, not GPU results" if meta.get("smoke")
             else f"recorded on an {meta.get('gpu')}")
    return f"{where}, {meta.get('date', '?')}"


def load_notebook(path: Path) -> dict:
    """A notebook file as the dict its JSON holds, once nbformat validates it; ValueError,
    saying what is wrong and where, when it is not one (not UTF-8, not JSON, nested past
    the parser's depth, not a valid nbformat 4 notebook), OSError when it cannot be read."""
    data = Path(path).read_bytes()
    try:
        raw = json.loads(data.decode("utf8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 (byte {exc.start})") from None
    except RecursionError:  # the parser nests one call per bracket
        raise ValueError("its JSON nests too deeply to be a notebook") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    _validate(raw)
    return raw


def read_recording(recording: Path):
    """The recording as an nbformat notebook, once checked (`load_notebook`, then
    `check_recording`); ValueError, saying what is wrong and where, when it is unreadable or
    damaged, OSError when it cannot be read at all."""
    import nbformat.v4

    raw = load_notebook(recording)  # before nbformat's reader, which trips over bad structure
    try:  # the parsed dict as nbformat's v4 reader turns it into a notebook (lines joined)
        nb = nbformat.v4.to_notebook_json(raw)
    except Exception as exc:  # valid, yet unreadable: say so rather than crash a build
        raise ValueError(f"not a readable notebook: {str(exc).splitlines()[0][:200]}") \
            from None
    check_recording(nb)
    return nb


def read_provenance(recording: Path) -> dict:
    """metadata["gpuinfer"] of a recording, once it is checked; ValueError/OSError when it
    is unreadable or damaged."""
    return read_recording(recording).metadata[METADATA_KEY]


def _where(path) -> str:
    """['cells', 3, 'outputs', 0, 'data'] -> 'cell 4, output 1, data'."""
    parts, names = list(path), {"cells": "cell", "outputs": "output"}
    shown = []
    while parts:
        key = parts.pop(0)
        if key in names and parts and isinstance(parts[0], int):
            shown.append(f"{names[key]} {parts.pop(0) + 1}")
        else:
            shown.append(str(key))
    return ", ".join(shown) or "the notebook"


def _validate(nb: dict) -> None:
    """ValueError, saying where, unless `nb` is a valid nbformat 4 notebook (outputs with
    their data, data of the right types, ...)."""
    import warnings

    import nbformat

    if not isinstance(nb, dict) or nb.get("nbformat") != 4:
        raise ValueError("not an nbformat 4 notebook")
    with warnings.catch_warnings():  # an old notebook's missing cell ids are not damage
        warnings.simplefilter("ignore")
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            where = _where(getattr(exc, "absolute_path", []))
            message = str(getattr(exc, "message", exc)).splitlines()[0][:200]
            raise ValueError(f"{where}: {message}") from None


def check_recording(nb) -> None:
    """Raise ValueError, saying where, if the recording (read, and valid as a notebook) is
    not one that renders and matches its own provenance: an image that is not base64,
    provenance missing, or code cells other than those it recorded the hash of (edited by
    hand). Valid JSON can still be damaged inside; myst-nb would stop the build on it."""
    meta = nb.metadata.get(METADATA_KEY)
    if not isinstance(meta, dict):
        raise ValueError(f"no metadata['{METADATA_KEY}']")
    missing = [k for k in REQUIRED_METADATA if k not in meta]
    if missing:
        raise ValueError(f"metadata['{METADATA_KEY}'] lacks {', '.join(missing)}")
    for i, cell in enumerate(nb.cells, start=1):
        for j, out in enumerate(cell.get("outputs", []), start=1):
            for mime, value in out.get("data", {}).items():
                if mime.startswith("image/") and mime != "image/svg+xml":
                    try:
                        base64.b64decode("".join(value.split()), validate=True)
                    except (AttributeError, TypeError, ValueError):
                        raise ValueError(f"cell {i}, output {j}: its {mime} is not base64") \
                            from None
    if chapter_hash(nb) != meta["chapter_hash"]:
        raise ValueError("its code cells are not the ones it was recorded with (the hash in "
                         "its metadata differs): it was edited after recording")


def artifact_hashes(folder: Path) -> dict[str, str]:
    """{path under folder: sha256} of every file in an artifacts folder ({} when there is
    none). A link counts as a file named `-> target`, so that it never matches a recording."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return {"": "-> " + str(folder.readlink())} if folder.is_symlink() else {}
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            found[rel] = _sha256(path.read_bytes())
    return found


def artifacts_differ(recorded: dict[str, str], now: dict[str, str]) -> str | None:
    """None when the artifacts on disk are those recorded; else what differs, in words."""
    if recorded == now:
        return None
    missing = sorted(set(recorded) - set(now))
    extra = sorted(set(now) - set(recorded))
    changed = sorted(k for k in set(recorded) & set(now) if recorded[k] != now[k])
    parts = [f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
             for label, names in (("missing:", missing), ("altered:", changed),
                                  ("not from the recording:", extra)) if names]
    return "; ".join(parts)


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

    if journal_path(path).exists():
        return result("unfinished", "a recording of it was cut short while being written "
                      f"({journal_path(path).relative_to(Path(root)).as_posix()} is there); "
                      "`python -m gpuinfer.publish.record --recover` finishes writing it")
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
    # Recordings made before artifacts were hashed carry no "artifacts": nothing to check.
    if isinstance(meta.get("artifacts"), dict):
        folder = artifacts_path(path)
        differ = artifacts_differ(meta["artifacts"], artifact_hashes(folder))
        if differ:
            shown_folder = folder.relative_to(Path(root)).as_posix()
            return result("stale", f"its artifacts in {shown_folder}/ are not the ones it "
                          f"recorded ({differ})", meta)
    if meta["smoke"] and not accept_cpu:
        return result("cpu", f"{shown} is a CPU smoke recording (made with --allow-cpu), "
                      "not GPU results", meta)
    return result("fresh", recorded_on(meta), meta)
