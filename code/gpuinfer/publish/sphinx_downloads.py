"""The theme's download menu (top right of a page): a Sphinx extension (listed in
_config.yml). A chapter page gets the files it links for download from its recording (the
executed notebook, profiler traces), next to the source, and every page the whole book as
one PDF (book.pdf, gpuinfer.publish.pdf) when the site will have it."""

from __future__ import annotations

import os
from pathlib import Path


def recording_downloads(app, pagename: str) -> list[tuple[str, str]]:
    """(file name, path under _downloads/) of the recording files that `pagename` links to
    for download: the sphinx_provenance box links them with {download} roles."""
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


def setup(app):
    app.connect("html-page-context", add_download_buttons, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
