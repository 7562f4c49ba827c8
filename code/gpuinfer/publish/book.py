"""The book's pages: its table of contents, its chapters, and where their recordings go.

A chapter is a file of the table of contents (`_toc.yml`) that is a MyST notebook (its YAML
front matter says so); a draft is such a notebook beside the chapters that the TOC does not
list. A chapter's recording is the executed notebook `_recorded/<stem>.ipynb` beside it,
with its artifacts (profiler traces) in `_recorded/<stem>/`. A book whose TOC or pages
cannot be read raises BookError, one line naming the file and the fix: the record command,
the tests and the build all stop with it.
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
    if not isinstance(data, dict) or not isinstance(data.get("root"), str):
        raise BookError(f"{_shown(toc)} is not a Jupyter Book table of contents: it needs "
                        "a 'root:' page (see jupyterbook.org, 'Table of Contents')")
    return toc_entries(data)


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
            raise BookError(f"{_shown(root / '_toc.yml')}: the entry {entry!r} lies "
                            f"outside the book ({inside}); list pages inside the book's "
                            "folder")
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
    """The chapter as an nbformat notebook (fmt given: else jupytext sees plain md)."""
    import jupytext

    return jupytext.reads(read_text(path, path.parent.parent), fmt="md:myst")

