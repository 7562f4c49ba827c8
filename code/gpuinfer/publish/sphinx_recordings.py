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
(or, for a preview, a banner saying that its outputs are not GPU results): that is the
extension gpuinfer.publish.sphinx_provenance, from the statuses this one finds.

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

from gpuinfer.publish import book, recordings
from gpuinfer.publish.sources import PACKAGE_DIR
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.present import PEAK_NAME, PresentationError, page
from gpuinfer.publish.titles import insert_after_title

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


def setup(app):
    app.add_config_value("gpuinfer_accept_cpu_recordings", False, "env")  # tests only
    app.connect("builder-inited", seed_cache, priority=600)  # after myst-nb's (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
