"""The site as a reader meets it: a Sphinx extension (listed in _config.yml).

- `{gpu-spec-table}`: the datasheet table of gpuinfer.roofline, rendered at build
  time, so that the appendix cannot drift from the numbers the chapters use.
- The theme's download menu (top right of a page) gets the files a chapter page links for
  download from its recording (the executed notebook, profiler traces), next to the source,
  and on every page the whole book as one PDF (book.pdf, gpuinfer.publish.pdf).
- Figures get alt text: gpuinfer.report.plots stores a description of every figure in its
  PNG, and it becomes the <img alt> here (instead of the file's name).
- The repository: its address (`repository_url`) comes from the publishing workflow
  (GPUINFER_REPOSITORY, from the runner's GITHUB_SERVER_URL and GITHUB_REPOSITORY), or from
  the checkout's `origin` remote; with one, every page gets the theme's repository button,
  `{{ repository }}` in the text is the address, and `{repository-commands}` shows a
  reader the commands that get the package and run one chapter on their GPU.
- Tables: a smaller font and tighter cells (static/gpuinfer.css), so that the wide ones fit
  the text column; the theme's container still scrolls a table sideways on a narrow screen.
  Code: 12 px, so that an 88-character line of a code cell fits the column at 1280 px;
  outputs and literalinclude blocks wrap. Print styles for the PDF (no sidebars).
- Two fixes of the theme's page head, found by the browser test (tests/test_browser.py):
  the colour mode starts in "auto" (without it a first visit logs "Got invalid theme mode"),
  and sphinx-thebe's inline script, emitted twice, is emitted once (the second copy is a
  JavaScript error).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from gpuinfer import roofline
from gpuinfer.publish import book
from gpuinfer.publish.validation import read_provenance


# --- tables ------------------------------------------------------------------------------

def table(header: list[str], rows: list[list],
          classes: tuple[str, ...] = ()) -> nodes.table:
    """A docutils table; a cell is a string or a node."""
    tgroup = nodes.tgroup(cols=len(header))
    tgroup += [nodes.colspec(colwidth=1) for _ in header]

    def row(cells):
        tr = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", cell if isinstance(cell, nodes.Node)
                                     else nodes.Text(str(cell)))
            tr += entry
        return tr

    tgroup += nodes.thead("", row(header))
    tgroup += nodes.tbody("", *[row(r) for r in rows])
    return nodes.table("", tgroup, classes=list(classes))


def recorded_gpus(root: Path) -> dict[str, dict]:
    """{chapter: provenance} of every chapter whose recording is readable (and not read
    through a link: gpuinfer.publish.recordings does not trust one)."""
    found = {}
    for chapter, path in book.chapters(root).items():
        if book.recording_path(path).parent.is_symlink():
            continue
        try:
            found[chapter] = read_provenance(book.recording_path(path))
        except (OSError, ValueError):
            pass
    return found


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


class GPUSpecTable(SphinxDirective):
    """The datasheet ceilings of gpuinfer.roofline.GPU_SPECS, with the BF16 ridge
    point."""

    def run(self):
        root = Path(self.env.srcdir)
        for path in book.chapters(root).values():
            self.env.note_dependency(str(book.recording_path(path)))
        self.env.note_dependency(str(root / "_toc.yml"))  # the chapters whose GPUs count
        self.env.note_dependency(roofline.__file__)
        book_gpus = {spec.name for meta in recorded_gpus(root).values()
                     if not meta.get("smoke")
                     for spec in [roofline.lookup_spec(meta.get("gpu"))] if spec}
        header = ["GPU", "memory", "memory TB/s", "FP32 TFLOP/s", "TF32 TFLOP/s",
                  "BF16 TFLOP/s", "BF16 ridge FLOP/B"]
        rows, sources = [], {}
        for s in roofline.GPU_SPECS:
            ridge = (roofline.ridge_point(s.bf16_tflops * 1e12, s.hbm_tbs * 1e12)
                     if s.bf16_tflops else None)
            name = nodes.strong(text=s.name + " (the book's GPU)") if s.name in book_gpus \
                else s.name
            rows.append([name, s.memory, _fmt(s.hbm_tbs), _fmt(s.fp32_tflops),
                         _fmt(s.tf32_tflops), _fmt(s.bf16_tflops),
                         "–" if ridge is None else f"{ridge:.0f}"])
            sources.setdefault(s.source, []).append(s.name)
        # The sources under the table, not in a column: the table must fit the page width.
        note = nodes.paragraph("", "", nodes.emphasis(text="Sources:"))
        listed = nodes.bullet_list()
        for source, names in sources.items():
            listed += nodes.list_item("", nodes.paragraph(
                text=f"{', '.join(names)}: {source}."))
        return [table(header, rows, classes=("gpu-spec-table",)), note, listed]


# --- the repository ----------------------------------------------------------------------

STATIC = Path(__file__).parent / "static"  # gpuinfer.css
NO_REPOSITORY = "the book's repository"


def _https(remote: str) -> str:
    """git@github.com:owner/name.git or https://github.com/owner/name.git -> https://..."""
    remote = re.sub(r"^git@([^:]+):", r"https://\1/", remote.strip())
    return remote.removesuffix(".git").removesuffix("/")


# What the theme's repository button can link: https://host/owner/name and no more
HOSTED = re.compile(r"https?://[^/\s]+/[^/\s]+/[^/\s]+")


def repository_url(root: Path) -> str | None:
    """The book's repository, from the publishing workflow's environment, else from the
    checkout's `origin` remote; None when neither knows a hosted one (a clone of a local
    folder has a path for its origin, which no page can link to)."""
    if os.environ.get("GPUINFER_REPOSITORY"):
        url = _https(os.environ["GPUINFER_REPOSITORY"])
        if not HOSTED.fullmatch(url):
            raise ValueError(f"GPUINFER_REPOSITORY={os.environ['GPUINFER_REPOSITORY']!r} "
                             "is not a hosted repository's address: set it to "
                             "https://host/owner/name (or git@host:owner/name.git), or "
                             "unset it to build without a repository button")
        return url
    if os.environ.get("GITHUB_REPOSITORY"):  # any GitHub Actions run knows its repository
        server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
        return f"{server}/{os.environ['GITHUB_REPOSITORY']}"
    try:
        out = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    url = _https(out.stdout) if out.returncode == 0 else ""
    return url if HOSTED.fullmatch(url) else None


def set_repository(app, config) -> None:
    """config-inited: the repository button on every page, and `{{ repository }}`."""
    url = repository_url(Path(app.srcdir))
    options = config.html_theme_options
    if url:
        options.update(repository_url=url, use_repository_button=True)
    else:  # not jupyter-book's own address, which its defaults put there
        options.pop("repository_url", None)
        options["use_repository_button"] = False
    config.myst_substitutions = {**config.myst_substitutions,
                                 "repository": url or NO_REPOSITORY}


def add_stylesheet(app, config) -> None:
    """config-inited: static/gpuinfer.css on every page."""
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    app.add_css_file("gpuinfer.css")


class RepositoryCommands(SphinxDirective):
    """The commands that get the book's package and run one chapter on a reader's GPU."""

    def run(self):
        # set_repository found it (or not) when the build started: no second git call
        # (the theme's own default for it is "")
        url = self.config.html_theme_options.get("repository_url")
        # without a known address the reader is in a clone already (a local build)
        clone = f"git clone {url} gpu-book && cd gpu-book\n" if url else ""
        text = (f"{clone}"
                "pip install -r requirements.txt      # gpuinfer, Jupyter, jupytext; "
                "a CUDA build of torch\n"
                "python -m gpuinfer.publish.record 05_triton_decode   # one chapter, "
                "recorded\n"
                "# or as a notebook, to run cell by cell in your own Jupyter:\n"
                "jupytext --to ipynb book/05_triton_decode.md")
        block = nodes.literal_block(text, text)
        block["language"] = "bash"
        return [block]


# --- the download menu -------------------------------------------------------------------

def recording_downloads(app, pagename: str) -> list[tuple[str, str]]:
    """(file name, path under _downloads/) of the recording files that `pagename` links to
    for download: the sphinx_recordings box links them with {download} roles."""
    found = []
    for filename, (docnames, dest) in app.env.dlfiles.items():
        if pagename in docnames and "_recorded" in Path(filename).parts:
            found.append((Path(filename).name, dest))
    return sorted(found, key=lambda f: (not f[0].endswith(".ipynb"), f[0]))


BOOK_PDF = "book.pdf"  # gpuinfer.publish.pdf.PDF_NAME, at the top of the site
PDF_ENV = "GPUINFER_PDF"  # set to 1 by a build that prints the PDF after it


def pdf_expected(outdir: Path) -> bool:
    """Whether the site will have book.pdf: the build was told that the PDF is printed
    after it (GPUINFER_PDF=1), or one is there from an earlier print. A plain build links
    no PDF, rather than a missing file."""
    return os.environ.get(PDF_ENV, "") not in ("", "0") or (outdir / BOOK_PDF).is_file()


def add_download_buttons(app, pagename, templatename, context, doctree):
    """html-page-context, after the theme built its header buttons (priority 501): the
    recording's files, and the whole book as a PDF (which `python -m gpuinfer.publish.pdf`
    prints from the built site, after the build: the publishing workflow does)."""
    group = next((b for b in context.get("header_buttons", [])
                  if b.get("label") == "download-buttons"), None)
    if group is None:
        return
    extra = []
    for name, dest in recording_downloads(app, pagename):
        notebook = name.endswith(".ipynb")
        extra.append({
            "type": "link",
            "url": context["pathto"]("_downloads/" + dest, 1),
            "text": ".ipynb (recorded)" if notebook else name,
            "tooltip": ("The executed notebook of the recording, with its outputs"
                        if notebook else "A file the recorded run wrote (open a .json.gz "
                        "profiler trace in ui.perfetto.dev)"),
            "icon": "fas fa-microchip" if notebook else "fas fa-file-zipper",
            "label": "download-recording-button",
        })
    group["buttons"][1:1] = extra  # after the page's source, before "print to PDF"
    if not pdf_expected(Path(app.outdir)):
        return
    group["buttons"].append({  # written after the build by gpuinfer.publish.pdf
        "type": "link",
        "url": context["pathto"](BOOK_PDF, 1),
        "text": "book.pdf (whole book)",
        "tooltip": "Every page of the book in one PDF, with its figures",
        "icon": "fas fa-book",
        "label": "download-book-pdf-button",
    })


# --- figures -----------------------------------------------------------------------------

def png_description(path: Path) -> str | None:
    """The 'Description' text chunk of a PNG (gpuinfer.report.plots writes one), or None."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.text.get("Description") if hasattr(im, "text") else None
    except OSError:
        return None


def add_alt_text(app, doctree) -> None:
    """doctree-read: an image without alt text gets the description stored in its PNG."""
    for node in doctree.findall(nodes.image):
        if node.get("alt") or not node["uri"].endswith(".png"):
            continue
        # Sphinx's image collector (also on doctree-read, earlier) has made the path
        # relative to the source folder; before it, the uri is relative to the page.
        rel = node.get("candidates", {}).get("*")
        path = Path(app.srcdir, rel) if rel else Path(app.env.relfn2path(
            node["uri"], app.env.docname)[1])
        alt = png_description(path)
        if alt:
            node["alt"] = alt


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    """html-page-context: sphinx-thebe's inline configuration (`const THEBE_JS_URL = ...`)
    reaches the page twice (once with filename None, once with ""), and the second copy is
    a JavaScript error in the browser ("Identifier 'THEBE_JS_URL' has already been
    declared"). Keep the first of each script."""
    scripts = context.get("script_files")
    if scripts:
        seen, kept = set(), []
        for js in scripts:
            key = (str(getattr(js, "filename", js) or ""),  # an inline script: None or ""
                   tuple(sorted(getattr(js, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                kept.append(js)
        context["script_files"] = kept


def default_color_mode(app, config) -> None:
    """The pydata theme reads `default_mode` from the template context, where jupyter-book
    sets nothing: a first visit then logs 'Got invalid theme mode' in the console."""
    config.html_context.setdefault("default_mode", "auto")


def setup(app):
    app.add_directive("gpu-spec-table", GPUSpecTable)
    app.add_directive("repository-commands", RepositoryCommands)
    app.connect("config-inited", set_repository)
    app.connect("config-inited", add_stylesheet)
    app.connect("config-inited", default_color_mode)
    app.connect("doctree-read", add_alt_text)
    app.connect("html-page-context", add_download_buttons, priority=600)
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
