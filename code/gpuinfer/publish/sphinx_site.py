"""The site's look, over the theme's: a Sphinx extension (listed in _config.yml).

- Tables: a smaller font and tighter cells (static/gpuinfer.css), so that the wide ones fit
  the text column; the theme's container still scrolls a table sideways on a narrow screen.
  Code: 12 px, so that an 88-character line of a code cell fits the column at 1280 px;
  outputs and literalinclude blocks wrap. Print styles for the PDF (no sidebars).
- Two fixes of the theme's page head, found by the browser test (tests/test_browser.py):
  the colour mode starts in "auto" (without it a first visit logs "Got invalid theme mode"),
  and sphinx-thebe's inline script, emitted twice, is emitted once (the second copy is a
  JavaScript error).

The site's other extensions: gpuinfer.publish.sphinx_datasheet (the spec table),
sphinx_repository (the repository's address and button), sphinx_downloads (the download
menu), sphinx_figures (figure alt text).
"""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).parent / "static"  # gpuinfer.css


def add_stylesheet(app, config) -> None:
    """config-inited: static/gpuinfer.css on every page."""
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    app.add_css_file("gpuinfer.css")


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
    app.connect("config-inited", add_stylesheet)
    app.connect("config-inited", default_color_mode)
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
