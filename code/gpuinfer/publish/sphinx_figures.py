"""Figures get alt text: a Sphinx extension (listed in _config.yml).
gpuinfer.report.plots and gpuinfer.report.diagrams store a description of every figure in
its PNG, and it becomes the <img alt> here (instead of the file's name)."""

from __future__ import annotations

from pathlib import Path

from docutils import nodes


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


def setup(app):
    app.connect("doctree-read", add_alt_text)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
