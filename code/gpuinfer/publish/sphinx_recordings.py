"""Build the book from its GPU recordings: a Sphinx extension (listed in _config.yml).

myst-nb runs in `cache` mode: it looks each chapter up in its jupyter-cache (in _build/)
by a hash of the chapter's code cells, and executes the chapter only when it is not there.
At the start of a build, this extension puts every chapter whose recording is fresh (see
gpuinfer.publish.recordings) into that cache, as myst-nb would have stored it after
executing it: the chapter read by myst-nb's own reader, with the recorded outputs of its
measurement cells and the outputs of its presentation cells, which it runs then, on this
machine's CPU, from the values the recording kept (gpuinfer.publish.present). So a build
with fresh recordings measures nothing; it redraws figures, tables and glued values from
recorded data, and a presentation cell that touches the GPU or fails stops it with one
line naming the cell. A chapter without a valid recording (stale, missing, corrupt, a CPU
smoke run) is left to myst-nb, which executes it on this machine's CPU as a preview (and
caches that execution); the build warns, naming the command that re-records it.

Under the title of each chapter page goes the recording's provenance, with download links
(or, for a preview, a banner saying that its outputs are not GPU results). The recording
and the package modules whose definitions a chapter reaches are Sphinx dependencies of
its page, so an incremental build picks up a re-recording or a change of the package.

Every page glues `peak_gpu_gib` (gpuinfer.publish.present.PEAK_NAME): a page made from its
recording glues the recording's peak GPU memory; a preview glues NaN, from a hidden code
cell (PREVIEW_CELL) put after its title with the banner, so that the chapter's text can
cite it either way. That cell is a code cell of the preview, so it is in the key myst-nb
caches the preview's execution under: `preview_notebook` reads the chapter with it.

A build reads the recordings and never writes into them: it refuses a GPUINFER_ARTIFACTS
(where a preview's traces go) that is relative, lies in or holds this book, another (a
folder with a _toc.yml or a _recorded) or the package's sources
(gpuinfer.publish.book.check_artifacts_env). A book whose TOC or pages cannot be read
stops the build with one line naming the file and the fix (`jupyter-book build` reads the
TOC itself first: gpuinfer.publish.build checks it before); a damaged recording only turns
its chapter into a preview.
"""

from __future__ import annotations

import hashlib
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from sphinx.util import logging

from gpuinfer.env import host_text
from gpuinfer.publish import book, recordings
from gpuinfer.publish.sources import PACKAGE_DIR
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.present import PEAK_NAME, PresentationError, page

logger = logging.getLogger(__name__)
SEED_KEY = "gpuinfer_recording"  # cache record data: sha256 of the recording it came from
# What a preview runs after its title: no GPU ran it, so its peak GPU memory is NaN.
PREVIEW_CELL = ("```{code-cell} ipython3\n:tags: [remove-cell]\n\n"
                f"__import__('myst_nb').glue({PEAK_NAME!r}, float('nan'), display=False)\n"
                "```\n")


def stop(message: str):
    """Stop the build with one line. Not a SphinxError: jupyter-book would print its own
    traceback under it. SystemExit passes through Sphinx and jupyter-book untouched."""
    raise SystemExit(f"error: {message}")


def myst_nb_notebook(app, path: Path, text: str | None = None):
    """The chapter as myst-nb reads it when it parses the page (myst_nb.sphinx_.Parser):
    same reader, same configuration, same kernel alias, hence the same cache key. `text`:
    the page's source, if not the file's (a preview's, `preview_notebook`)."""
    from myst_nb.core.read import create_nb_reader

    text = path.read_text(encoding="utf8") if text is None else text
    reader = create_nb_reader(str(path), app.env.myst_config, app.env.mystnb_config, text)
    nb = reader.read(text)
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    for pattern, alias in app.env.mystnb_config.kernel_rgx_aliases.items():
        if kernel is not None and re.fullmatch(pattern, kernel):
            nb.metadata["kernelspec"]["name"] = alias
            break
    return nb


def preview_notebook(app, path: Path):
    """The chapter as myst-nb executes it as a preview: with PREVIEW_CELL after its title
    (add_box puts it there; the banner beside it is markdown, which no cache key holds)."""
    return myst_nb_notebook(
        app, path, insert_after_title(path.read_text(encoding="utf8"), PREVIEW_CELL))


def package_digest() -> str:
    """One hash of every module of the package as written: a presentation cell's output
    depends on the package code it calls (the plots), which no recording hash covers."""
    digest = hashlib.sha256()
    for module in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(module.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(module.read_bytes())
    return digest.hexdigest()


def page_notebook(app, status: recordings.Status, path: Path):
    """The chapter as its page shows it (gpuinfer.publish.present.page), read by myst-nb's
    own reader; PresentationError if a presentation cell fails."""
    import nbformat

    recorded = nbformat.reads(status.recording.read_text(encoding="utf8"), as_version=4)
    return page(myst_nb_notebook(app, path), recorded, book.artifacts_path(path) / DATA_FILE,
                path.parent, status.chapter)


def seed_digest(status: recordings.Status, path: Path, digest_of_package: str) -> str:
    """What a seeded page was made from: the recording, its files, the chapter as written
    (its presentation cells), the package's code, and the stock measurements that other
    chapters' recordings saved (a page may show them: gpuinfer.report.borrowed)."""
    digest = hashlib.sha256(status.recording.read_bytes())
    for name, sha in sorted((status.provenance.get("artifacts") or {}).items()):
        digest.update(f"{name}:{sha}".encode())
    for shared in sorted(status.recording.parent.glob("*/stock-*.json*")):
        digest.update(shared.relative_to(status.recording.parent).as_posix().encode())
        digest.update(shared.read_bytes())
    digest.update(path.read_bytes())
    digest.update(digest_of_package.encode())
    return digest.hexdigest()


def seeded(app, cache, path: Path, digest: str):
    """The page notebook an earlier build seeded from the same digest, or None."""
    try:
        record = cache.match_cache_notebook(myst_nb_notebook(app, path))
    except KeyError:
        return None
    if (record.data or {}).get(SEED_KEY) != digest:
        return None
    return cache.get_cache_bundle(record.pk).nb


def seed(app, cache, status: recordings.Status, path: Path, digest: str, nb) -> None:
    """Cache the page notebook `nb` (`page_notebook`), as myst-nb would have cached it."""
    from jupyter_cache.base import CacheBundleIn

    runtime = status.provenance.get("seconds")
    cache.cache_notebook_bundle(
        CacheBundleIn(nb, str(path), data={SEED_KEY: digest, "execution_seconds": runtime}),
        check_validity=False, overwrite=True)


def make_pages(app, todo: dict[str, tuple]) -> dict[str, object]:
    """{chapter: its page notebook, or the exception making it raised}, the presentation
    cells of the chapters in `todo` ({chapter: (status, path, digest)}) run side by side:
    each in a kernel of its own, mostly waiting on imports and drawing."""
    from concurrent.futures import ThreadPoolExecutor

    def made(item):
        status, path, _ = item
        try:
            return page_notebook(app, status, path)
        except Exception as exc:  # reported by the caller, chapter by chapter
            return exc

    workers = max(1, min(len(todo), os.cpu_count() or 1, 4))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(todo, pool.map(made, todo.values())))


def uncache(app, cache, status: recordings.Status, path: Path) -> None:
    """Drop the chapter's cache entry unless it is a CPU execution of the current code, so
    that myst-nb executes it (a CPU preview, which it caches for the next builds). Dropped:
    a seed from a recording, and an execution older than a module the chapter imports."""
    try:
        record = cache.match_cache_notebook(preview_notebook(app, path))
    except KeyError:
        return
    newest = max(((PACKAGE_DIR / m).stat().st_mtime for m in status.modules),
                 default=0.0)
    created = record.created  # UTC; SQLite may hand it back without the time zone
    created = created if created.tzinfo else created.replace(tzinfo=timezone.utc)
    older = created < datetime.fromtimestamp(newest, timezone.utc)
    if SEED_KEY in (record.data or {}) or older:
        cache.remove_cache(record.pk)


def seed_cache(app) -> None:
    """builder-inited (after myst-nb's): seed the cache from every fresh recording."""
    from jupyter_cache import get_cache

    root = Path(app.srcdir)
    if not (root / "_toc.yml").is_file():  # a single page built on its own: no chapters
        return
    try:
        chapters = book.chapters(root)
        book.check_artifacts_env(root, os.environ.get("GPUINFER_ARTIFACTS"))
    except book.BookError as exc:
        stop(str(exc))
    cache = get_cache(app.env.mystnb_config.execution_cache_path)
    app.gpuinfer_status = {}  # docname -> Status, for the page boxes
    app.gpuinfer_seeded = {}  # docname -> the text of a chapter read as fresh
    app.gpuinfer_pages = {}  # chapter -> the page's notebook, for the results page
    digest_of_package = package_digest()
    found, todo = {}, {}
    for chapter, path in chapters.items():
        try:
            status = recordings.status(
                root, chapter, accept_cpu=app.config.gpuinfer_accept_cpu_recordings)
        except book.BookError as exc:
            stop(str(exc))
        found[chapter] = status
        if status.fresh:
            digest = seed_digest(status, path, digest_of_package)
            page = seeded(app, cache, path, digest)
            if page is None:
                todo[chapter] = (status, path, digest)
            else:
                app.gpuinfer_pages[chapter] = page
    for chapter, made in make_pages(app, todo).items():
        status, path, digest = todo[chapter]
        if isinstance(made, PresentationError):
            stop(str(made))
        if isinstance(made, Exception):  # anything unreadable in it: report, never crash
            shown = status.recording.relative_to(root).as_posix()
            found[chapter] = recordings.Status(
                chapter, "corrupt", f"the recording {shown} is unusable ({made})",
                status.recording, {}, status.modules)
            continue
        seed(app, cache, status, path, digest, made)
        app.gpuinfer_pages[chapter] = made
    for chapter, path in chapters.items():
        status = found[chapter]
        if not status.fresh:
            uncache(app, cache, status, path)
            # no location=docname: Sphinx does not know a new page's file name yet
            logger.warning(f"{path.relative_to(root).as_posix()}: {status.message} Its "
                           "page is executed on this machine's CPU as a preview.",
                           type="gpuinfer", subtype="recording")
        app.gpuinfer_status[app.env.path2doc(str(path))] = status
        if status.fresh:  # what myst-nb will find in its cache, unless edited meanwhile
            app.gpuinfer_seeded[app.env.path2doc(str(path))] = path.read_text("utf8")


def _link(label: str, target: Path, page_dir: Path) -> str:
    return f"{{download}}`{label} <{target.relative_to(page_dir).as_posix()}>`"


def box(status: recordings.Status, page_dir: Path) -> str:
    """The MyST block shown under the chapter title."""
    if not status.fresh:
        return ("```{admonition} CPU preview: these outputs are not GPU results\n"
                ":class: danger\n\n"
                f"This chapter has no valid GPU recording: {status.reason}. So this page "
                "was executed on the CPU of the machine that built it, and its numbers and "
                f"figures say nothing about a GPU. Re-record it with "
                f"{recordings.record_command(status.chapter)}.\n```\n")
    meta = status.provenance
    artifacts_dir = status.recording.with_suffix("")
    if isinstance(meta.get("artifacts"), dict):  # checked against the folder by status()
        artifacts = [artifacts_dir / name for name in sorted(meta["artifacts"])]
    else:  # a recording made before artifacts were hashed
        artifacts = sorted(f for f in artifacts_dir.rglob("*") if f.is_file()) \
            if artifacts_dir.is_dir() else []
    downloads = [_link("executed notebook", status.recording, page_dir)]
    downloads += [_link(f.relative_to(artifacts_dir).as_posix(), f, page_dir)
                  for f in artifacts]
    said = recordings.recorded_on(meta)
    title = said[0].upper() + said[1:]
    if meta.get("smoke"):
        kind, device = "warning", f"none, CPU only ({meta.get('cpu', '?')})"
    else:
        kind = "note"
        device = f"{meta.get('gpu')}, driver {meta.get('driver')}, CUDA {meta.get('cuda')}"
    triton = meta.get("triton") or ("not recorded" if "triton" not in meta else "none")
    return (f"```{{admonition}} {title}\n:class: {kind}\n\n"
            f"- **GPU:** {device}\n"
            f"- **Host:** {host_text(meta)}\n"
            f"- **Software:** torch {meta.get('torch')}, Triton {triton}, transformers "
            f"{meta.get('transformers')}, Python {meta.get('python')}\n"
            f"- **Recorded:** {meta.get('date')}, the chapter ran in "
            f"{meta.get('seconds')} s\n"
            f"- **Download:** {', '.join(downloads)}\n```\n")


def _front_matter_end(lines: list[str]) -> int:
    """The index of the first line after the front matter (0 without one)."""
    if lines and lines[0].startswith("---"):
        return next((i + 1 for i in range(1, len(lines)) if lines[i].startswith("---")), 0)
    return 0


def _title_line(lines: list[str]) -> int | None:
    """The index of the first `# ` heading after the front matter, outside code fences."""
    fence = None
    for i in range(_front_matter_end(lines), len(lines)):
        marker = lines[i].lstrip()[:3]
        if marker in ("```", "~~~"):
            fence = None if fence == marker else fence or marker
        elif fence is None and re.match(r"#\s", lines[i]):
            return i
    return None


def chapter_title(path: Path) -> str:
    """A page's title, its first `# ` heading as written (e.g. '4. Decode at scale: ...');
    the file's stem where it has none."""
    lines = path.read_text(encoding="utf8").splitlines()
    at = _title_line(lines)
    return lines[at][1:].strip() if at is not None else path.stem


def insert_after_title(text: str, block: str) -> str:
    """Insert a markdown block after the first `# ` heading (after the front matter)."""
    lines = text.splitlines(keepends=True)
    at = _title_line(lines)
    at = _front_matter_end(lines) if at is None else at + 1
    return "".join(lines[:at]) + "\n" + block + "\n" + "".join(lines[at:])


def note_dependencies(env, status: recordings.Status, path: Path) -> None:
    """Note what a page drawn from the chapter's recording depends on, so that an
    incremental build re-reads it when one changes: the TOC (the chapter may leave it),
    the chapter (its presentation cells), its recording and files (a missing file: re-read
    every build) and the package's code (the presentation cells may call any of it)."""
    folder = status.recording.with_suffix("")
    found = [Path(env.srcdir) / "_toc.yml", path, status.recording]
    found += [folder / name for name in (status.provenance.get("artifacts") or {})]
    for dependency in found + sorted(PACKAGE_DIR.rglob("*.py")):
        env.note_dependency(str(dependency))


def add_box(app, docname: str, source: list[str]) -> None:
    """source-read: note the page's dependencies and put the box under its title (stop
    if a chapter read as fresh was edited since: a CPU run would show as its recording)."""
    status = getattr(app, "gpuinfer_status", {}).get(docname)
    if status is None:
        return
    path = Path(app.env.doc2path(docname))
    if getattr(app, "gpuinfer_seeded", {}).get(docname) not in (None, path.read_text(
            "utf8")):  # myst-nb would miss its seeded cache and run it on the CPU
        stop(f"{path} changed while the site was being built, after its recording was "
             "read: build again")
    note_dependencies(app.env, status, path)
    page_dir = path.parent
    block = box(status, page_dir) + ("" if status.fresh else "\n" + PREVIEW_CELL)
    source[0] = insert_after_title(source[0], block)


def setup(app):
    app.add_config_value("gpuinfer_accept_cpu_recordings", False, "env")  # tests only
    app.connect("builder-inited", seed_cache, priority=600)  # after myst-nb's (500)
    app.connect("source-read", add_box)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
