"""The book's pages: its table of contents, its chapters, and where their recordings go.

A chapter is a file of the table of contents (`_toc.yml`) that is a MyST notebook (its YAML
front matter says so); a draft is such a notebook beside the chapters that the TOC does not
list. A chapter's recording is the executed notebook `_recorded/<stem>.ipynb` beside it,
with its artifacts (profiler traces) in `_recorded/<stem>/`. A book whose TOC or pages
cannot be read (a TOC that is not YAML, or not of the shape Jupyter Book's own reader
takes, an entry naming no file of the book) raises BookError, one line naming the file and
the fix: the record command, the tests, the status and the build all stop with it.
`check_artifacts_env` says where a build's previews may write their artifacts: apart from
every book and the package.
"""

from __future__ import annotations

from pathlib import Path


class BookError(ValueError):
    """The book's TOC, or a page it lists, cannot be read as it must be. The message is one
    line that names the file and the fix; the record command, the tests and the build all
    stop with it."""


# --- the chapters -------------------------------------------------------------------------

def toc_entries(entry) -> list[str]:
    """The `file:` and `root:` entries of a _toc.yml (sub)tree, in reading order."""
    if isinstance(entry, list):
        return [f for item in entry for f in toc_entries(item)]
    if not isinstance(entry, dict):
        return []
    found = [entry[key] for key in ("root", "file") if isinstance(entry.get(key), str)]
    for key in ("parts", "chapters", "sections"):
        found += toc_entries(entry.get(key, []))
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
        raise BookError(f"cannot read {_shown(path, root)}: {exc.strerror or exc}") \
            from None


def _yaml_problem(exc) -> str:
    """' (line 5): expected <block end>, ...' from a YAMLError, for a one-line message."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    return f"{where}: {getattr(exc, 'problem', None) or 'invalid YAML'}"


def front_matter(path: Path, root: Path | None = None) -> dict | None:
    """The YAML front matter of a markdown page, None if it has none; BookError if it has
    one that is not a YAML mapping (which would turn a chapter into a plain page)."""
    text = read_text(path, root)
    if not text.startswith("---"):
        return None
    import yaml  # not at the top: the record command checks first that it is installed

    head, closed, _ = text[3:].partition("\n---")
    if not closed:
        raise BookError(f"{_shown(path, root)}: its front matter, opened by '---' on line "
                        "1, has no closing '---' line; close it")
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


TOC_LISTS = ("parts", "chapters", "sections")  # the keys whose value is a list of entries
TOC_TARGETS = ("file", "glob", "url")  # what an entry of such a list points at


def _toc_problem(entry, where: str) -> str | None:
    """What is wrong with the TOC (sub)tree `entry` at `where` ('' for the top level,
    'parts[1].chapters[2]'), in words, or None: the shape Jupyter Book reads, checked
    before any of it is used."""
    said = f"the entry {where}" if where else "the top level"
    if not isinstance(entry, dict):
        return f"{said} is {entry!r}, not a mapping (key: value lines)"
    for key in ("root", "file", "glob", "url"):
        value = entry.get(key)
        if key in entry and (not isinstance(value, str) or not value.strip()):
            return f"{said} has {key}: {value!r}, which is not a page path"
    for key in [key for key in TOC_LISTS if key in entry]:
        if not isinstance(entry[key], list) or not entry[key]:
            return (f"{said} has {key}: {entry[key]!r}, which is not a list of entries "
                    "(- file: ... lines)")
        for i, item in enumerate(entry[key]):
            at = f"{where}.{key}[{i}]" if where else f"{key}[{i}]"
            needs = ("chapters",) if key == "parts" else TOC_TARGETS
            if isinstance(item, dict) and not any(k in item for k in needs):
                return f"the entry {at} ({item!r}) has no {needs[0]}: key"
            problem = _toc_problem(item, at)
            if problem:
                return problem
    return None


def _toc_top(data) -> str:
    """What a TOC without a 'root:' page holds, in words."""
    if data is None:
        return "it is empty"
    if not isinstance(data, dict):
        return f"it holds {data!r:.60}, not key: value lines"
    return f"its root: is {data['root']!r:.60}" if "root" in data else "it has no root: key"


def toc_files(root: Path | str) -> list[str]:
    """Every page of the TOC, as written there ('book/intro', 'book/01_roofline', ...);
    BookError when _toc.yml is missing or is not a Jupyter Book TOC."""
    import yaml

    toc = Path(root) / "_toc.yml"
    if not toc.is_file():
        raise BookError(f"{Path(root).resolve()} has no _toc.yml: name the book's root "
                        "folder")
    try:
        data = yaml.safe_load(read_text(toc, root))
    except yaml.YAMLError as exc:
        raise BookError(f"{_shown(toc)} is not valid YAML{_yaml_problem(exc)}; fix it") \
            from None
    except RecursionError:  # nesting a parser cannot follow
        raise BookError(f"{_shown(toc)} nests too deeply to be a table of contents; fix "
                        "it") from None
    if not isinstance(data, dict) or not isinstance(data.get("root"), str):
        raise BookError(f"{_shown(toc)} is not a Jupyter Book table of contents "
                        f"({_toc_top(data)}): it needs a 'root:' page (see jupyterbook.org, "
                        "'Table of Contents')")
    try:
        problem = _toc_problem(data, "")
    except RecursionError:
        problem = "it nests entries too deeply"
    if problem is None:
        problem = _external_toc_problem(toc)
    if problem:
        raise BookError(f"{_shown(toc)} is not a Jupyter Book table of contents: {problem}; "
                        "fix it (see jupyterbook.org, 'Table of Contents')")
    return toc_entries(data)


def _external_toc_problem(toc: Path) -> str | None:
    """What Jupyter Book's own TOC reader (sphinx-external-toc) refuses in `toc`, in one
    line, or None. `jupyter-book build` reads the TOC with it before any extension runs,
    and stops with a traceback on what it refuses (an unknown key, a page listed twice):
    checked here, the record command and the build refuse the same TOCs. Skipped where it
    is not installed (the recording GPU has no Jupyter Book): it never builds there."""
    try:
        from sphinx_external_toc.parsing import MalformedError, parse_toc_yaml
    except ImportError:
        return None
    try:
        parse_toc_yaml(toc)
    except MalformedError as exc:
        return " ".join(str(exc).split())
    return None


def _page_path(root: Path, entry: str) -> Path:
    """The file of a TOC entry: 'book/01_roofline' -> root/book/01_roofline.md (the file
    as written when the entry names its suffix)."""
    path = root / entry
    if path.suffix in (".md", ".ipynb", ".rst") or path.is_file():
        return path
    return root / (entry + ".md")


def chapters(root: Path | str) -> dict[str, Path]:
    """The book's chapters in TOC order: {stem: path of the .md}. BookError for a TOC entry
    outside the book (its recording would be written there) or naming no file, for two
    chapters with one name (a chapter is named by its file's stem), and for a page that
    cannot be read."""
    root = Path(root)
    inside = root.resolve()
    toc = _shown(root / "_toc.yml")
    found = {}
    for entry in toc_files(root):
        try:
            path = _page_path(root, entry)
            outside = not path.resolve().is_relative_to(inside)
            is_file = path.is_file()
        except (OSError, ValueError) as exc:  # a NUL byte, a name too long
            raise BookError(f"{toc}: the entry {entry[:60]!r} is not a usable file name "
                            f"({getattr(exc, 'strerror', None) or exc}); fix it") from None
        if outside:
            raise BookError(f"{toc}: the entry {entry!r} lies outside the book ({inside}); "
                            "list pages inside the book's folder")
        if not is_file:
            raise BookError(f"{toc}: the entry {entry!r} names no file of the book (no "
                            f"{_shown(path, root)}); fix the entry, or add the page")
        if path.suffix == ".md" and is_myst_notebook(path, root):
            if path.stem in found:
                raise BookError(
                    f"{toc} lists two chapters named {path.stem} "
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


BOOK_MARKS = ("_toc.yml", "_recorded")  # a folder holding either is (part of) a book
# How deep below GPUINFER_ARTIFACTS a book is looked for: a folder of checkouts holds their
# recordings three levels down (<checkout>/book/_recorded).
HOLDS_DEPTH = 3


def _marked(folder: Path) -> str | None:
    """The mark of a book `folder` holds ('_toc.yml' or '_recorded'), or None."""
    return next((mark for mark in BOOK_MARKS if (folder / mark).exists()), None)


def _book_below(folder: Path, depth: int = HOLDS_DEPTH) -> Path | None:
    """A folder at most `depth` levels below `folder` (itself excluded) holding a book's
    mark, or None. Links are not followed and unreadable folders are passed over."""
    try:
        below = [p for p in sorted(folder.iterdir()) if p.is_dir() and not p.is_symlink()]
    except OSError:
        return None
    for sub in below:
        found = sub if _marked(sub) else _book_below(sub, depth - 1) if depth > 1 else None
        if found:
            return found
    return None


def _artifacts_problem(folder: Path, root: Path) -> str | None:
    """How the folder a preview would write into meets a book or the package, in words
    ('lies in the book /x'), or None when it is apart from all of them. A book is this one
    (`root`) or any folder holding a _toc.yml or a _recorded: another checkout's
    recordings are as easily overwritten as this one's."""
    code = Path(__file__).resolve().parents[2]  # code/, above the gpuinfer package
    for place, what in ((root, "the book"), (code, "the package's sources")):
        if folder.is_relative_to(place):
            return f"{'is' if folder == place else 'lies in'} {what} {place}"
        if place.is_relative_to(folder):
            return f"holds {what} {place}"
    for place in (folder, *folder.parents):
        if _marked(place):
            return (f"{'is' if place == folder else 'lies in'} {place}, which holds "
                    f"{_marked(place)} (a book)")
    below = _book_below(folder)
    return f"holds {below}, which holds {_marked(below)} (a book)" if below else None


def check_artifacts_env(root: Path | str, value: str | None) -> None:
    """BookError unless `value`, the GPUINFER_ARTIFACTS a build's previews would write
    their artifacts under (a folder per chapter: gpuinfer.env.artifact_dir), is unset or an
    absolute folder apart from every book and the package: not relative (each chapter would
    take it from its own folder), not in this book's root or the package's sources, nor in
    any folder holding a _toc.yml or a _recorded (another book, its recordings), nor a
    folder holding any of them."""
    if not value:
        return
    fix = ("unset it (a build keeps a preview's artifacts in a temporary folder), or give "
           "an absolute folder outside every book and the package, such as a new folder "
           "under /tmp")
    if not Path(value).is_absolute():
        raise BookError(f"GPUINFER_ARTIFACTS={value} is a relative path, which each chapter "
                        f"would take from its own folder, inside the book: {fix}")
    problem = _artifacts_problem(Path(value).resolve(), Path(root).resolve())
    if problem:
        raise BookError(f"GPUINFER_ARTIFACTS={value} {problem}, where a preview would "
                        "write a folder per chapter (over recorded artifacts, or into the "
                        f"sources): {fix}")


def read_chapter(path: Path):
    """The chapter as an nbformat notebook (fmt given: else jupytext sees plain md)."""
    import jupytext

    return jupytext.reads(read_text(path, path.parent.parent), fmt="md:myst")

