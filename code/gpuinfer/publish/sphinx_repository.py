"""The book's repository on the site: a Sphinx extension (listed in _config.yml).

Its address (`repository_url`) comes from the publishing workflow (GPUINFER_REPOSITORY, from
the runner's GITHUB_SERVER_URL and GITHUB_REPOSITORY), or from the checkout's `origin`
remote; with one, every page gets the theme's repository button, `{{ repository }}` in the
text is the address, and `{repository-commands}` shows a reader the commands that get the
package and run one chapter on their GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

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


def setup(app):
    app.add_directive("repository-commands", RepositoryCommands)
    app.connect("config-inited", set_repository)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
