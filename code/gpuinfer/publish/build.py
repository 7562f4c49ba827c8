"""Build the site, and with --pdf its PDF:
`python -m gpuinfer.publish.build [ROOT] [--pdf] [-W] [--path-output DIR]`.

`jupyter-book build` reads `_toc.yml` with its own reader before any extension of the book
runs, and stops with a traceback on a TOC it cannot read. This command reads the book first
with the check the record command makes (gpuinfer.publish.book: the TOC, its pages, the
chapters' names, and GPUINFER_ARTIFACTS), so a book either cannot read stops both with
the same one line naming the file and the fix. Then it runs `jupyter-book build` and prints
how many seconds it took; with --pdf, it then prints the book's PDF into the built site
(gpuinfer.publish.pdf) with the Chromium that CHROMIUM names, else Debian's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuinfer.publish import book, pdf, sphinx_downloads


def check(root: Path) -> None:
    """BookError, its one line, if the build would stop on the book at `root`."""
    if not (root / "_toc.yml").is_file():
        raise book.BookError(f"{root.resolve()} has no _toc.yml: name the book's root "
                             "folder")
    book.chapters(root)
    book.check_artifacts_env(root, os.environ.get("GPUINFER_ARTIFACTS"))


def chromium(given: Path | None) -> Path:
    """The Chromium to print with: --chromium, else CHROMIUM, else Debian's;
    FileNotFoundError, one line saying how to get one, if it is not there."""
    found = given or Path(os.environ.get("CHROMIUM") or pdf.CHROMIUM)
    if not found.is_file():
        raise FileNotFoundError(f"no Chromium at {found} to print the PDF with: install "
                                "Debian's (as root: apt-get install chromium), or name one "
                                "with --chromium or CHROMIUM=<path>")
    return found


def build_site(root: Path, out: Path | None, strict: bool) -> int:
    """`jupyter-book build`'s exit code; prints the seconds it took when it succeeds."""
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build",
           str(root)] + (["--path-output", str(out)] if out else []) + (["-W"] if strict
                                                                         else [])
    start = time.perf_counter()
    code = subprocess.run(cmd).returncode
    if code == 0:
        html = (out or root) / "_build" / "html"
        print(f"built the site in {time.perf_counter() - start:.1f} s: "
              f"{html / 'index.html'}", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuinfer.publish.build",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path("."),
                        help="the book's folder, with _toc.yml (default: here)")
    parser.add_argument("--pdf", action="store_true",
                        help="then print the book's PDF, _build/html/book.pdf")
    parser.add_argument("--chromium", type=Path, default=None,
                        help=f"the Chromium to print with (default: CHROMIUM, else "
                             f"{pdf.CHROMIUM})")
    parser.add_argument("-W", dest="strict", action="store_true",
                        help="fail on any Sphinx warning")
    parser.add_argument("--path-output", type=Path, default=None,
                        help="build into DIR/_build rather than the book's folder")
    args = parser.parse_args(argv)
    try:
        check(args.root)
    except book.BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.pdf:  # the pages link the PDF only where the site will have it
        os.environ[sphinx_downloads.PDF_ENV] = "1"
    code = build_site(args.root, args.path_output, args.strict)
    if code or not args.pdf:
        return code
    html = (args.path_output or args.root) / "_build" / "html"
    start = time.perf_counter()
    try:  # the site stands without its PDF: built first, whatever Chromium there is
        written = pdf.build_pdf(args.root, chromium(args.chromium), html)
    except (book.BookError, FileNotFoundError, ModuleNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"printed the PDF in {time.perf_counter() - start:.1f} s: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
