"""The results at a glance: a Sphinx extension (listed in _config.yml).

The directive `{decode-results}` renders one table of every decode variant the chapters
measure (with `:fastest:`, only the fastest of each chapter, for the intro), read at build
time from the values each chapter's page glued under `gpuinfer.report.results.GLUE_NAME`
(its recording, and its presentation cells run from it): no number on that page is typed.
A chapter whose recording is not fresh (missing, stale, a CPU run) is left out, so that the
table never shows a number the chapter does not.

Every row is decode only (ms per generated token, the prefill in its own column where the
chapter timed it); a median is followed by its spread over the chapter's rounds, as the
chapter's own table shows it: the fastest and slowest round, for a speed-up the lowest and
highest per round. Each chapter's rows are headed by its page's title ('4. Decode at
scale: ...' reads 'Chapter 4: Decode at scale: ...'). The fraction of the floor is shown
twice: against the copy rate the chapter measured (the book's MBU) and against the
datasheet bandwidth of the GPU the recording ran on (what published MBU figures usually
divide by). The fastest row of a
chapter, for the intro, is the fastest of the book's own loops, never a stock baseline.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from gpuinfer.roofline import lookup_spec
from gpuinfer.publish import book, recordings
from gpuinfer.publish.compare import glued_in
from gpuinfer.publish.sphinx_provenance import note_dependencies
from gpuinfer.publish.tables import table
from gpuinfer.publish.titles import chapter_title
from gpuinfer.report import results
from gpuinfer.report.labels import is_naive_loop

logger = logging.getLogger(__name__)
HEADER = ["variant", "decode ms / token", "tokens / s", "prefill ms", "GB/s",
          "MBU, copy rate", "MBU, datasheet", "× V0", "× generate (static)"]


def chapter_results(page) -> list[results.Result]:
    """The rows a chapter's page glued (none if it glued none): `page` is the notebook the
    build made of its recording (gpuinfer.publish.sphinx_recordings.page_notebook)."""
    text = glued_in(page).get(results.GLUE_NAME)
    return results.loads(ast.literal_eval(text)) if text else []  # glued as a str's repr


def _quotes(text: str) -> str:
    """Straight double quotes as a typographic pair: Sphinx's smart quotes would turn the
    first of `cache_implementation="static"` into a closing one, after the `=`."""
    return re.sub(r'"([^"]*)"', "\u201c\\1\u201d", text)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def heading(title: str) -> str:
    """A chapter's heading from its page's title: 'Chapter 4: Decode at scale' for '4.
    Decode at scale'; a title without a number as it is."""
    numbered = re.fullmatch(r"(\d+)\.\s+(.+)", title.strip())
    return f"Chapter {numbered[1]}: {numbered[2]}" if numbered else title.strip()


def cells(r: results.Result, datasheet_bandwidth: float | None) -> list[str]:
    """A row's cells after its variant's name, medians with their spread over the rounds;
    "–" where a figure does not apply."""
    return [results.with_spread(r.ms_per_token, r.ms_range), f"{r.tokens_per_s:,.0f}",
            "–" if r.prefill_ms is None else f"{r.prefill_ms:.3g}",
            "–" if r.gb_per_s is None else f"{r.gb_per_s:,.0f}",
            _pct(r.floor_fraction),
            _pct(r.datasheet_fraction(datasheet_bandwidth) if datasheet_bandwidth else None),
            results.with_spread(r.x_v0, r.x_v0_range, "×"),
            results.with_spread(r.x_generate_static, r.x_generate_static_range, "×")]


def fastest(rows: list[results.Result]) -> list[results.Result]:
    """The fastest of the book's own loops (stock baselines are not the chapter's result)."""
    ours = [r for r in rows if not r.stock]
    return [min(ours, key=lambda r: r.ms_per_token)] if ours else []


class _FromRecordings(SphinxDirective):
    """A directive that reads the rows the chapters' recordings glued."""

    def chapter_rows(self, root: Path, chapter: str, path: Path):
        """(the chapter's recording status, the rows its page glued): no rows unless the
        recording is fresh, and a glued value damaged inside a valid notebook is a warning
        naming the fix, not a failed build. The chapter's recording and the TOC become
        dependencies of this page: rows come only from the chapters the TOC lists, even in
        an incremental build."""
        status = recordings.status(
            root, chapter, accept_cpu=self.config.gpuinfer_accept_cpu_recordings)
        note_dependencies(self.env, status, path)
        page = getattr(self.env.app, "gpuinfer_pages", {}).get(chapter)
        try:
            return status, chapter_results(page) if status.fresh and page else []
        except Exception as exc:  # a glued value damaged inside a valid notebook
            logger.warning(f"{status.recording.relative_to(root).as_posix()}: its "
                           f"glued {results.GLUE_NAME} is unreadable "
                           f"({type(exc).__name__}: {exc}); re-record {chapter}",
                           location=self.get_location(), type="gpuinfer",
                           subtype="recording")
            return status, []

    def link(self, text: str, row: results.Result, docname: str):
        """`text`, linking to the section that measures `row` (else its chapter)."""
        kind, target = ("ref", row.section) if row.section else ("doc", "/" + docname)
        return addnodes.pending_xref("", nodes.inline(text=text), refdomain="std",
                                     reftype=kind, reftarget=target, refexplicit=True,
                                     refdoc=self.env.docname)


class DecodeResults(_FromRecordings):
    """Every variant of every chapter; with `:fastest:`, the fastest variant of each."""

    option_spec = {"fastest": directives.flag}

    def run(self):
        root = Path(self.env.srcdir)
        out = []
        for chapter, path in book.chapters(root).items():
            status, rows = self.chapter_rows(root, chapter, path)
            if not rows:
                continue
            if "fastest" in self.options:
                rows = fastest(rows)
                if not rows:
                    continue
            docname = self.env.path2doc(str(path))
            meta = status.provenance
            spec = lookup_spec(meta.get("gpu"))
            datasheet = spec.hbm_tbs * 1e12 if spec else None
            title = nodes.paragraph()
            title += nodes.strong("", "", addnodes.pending_xref(
                "", nodes.inline(text=heading(chapter_title(path))), refdomain="std",
                reftype="doc", reftarget="/" + docname, refexplicit=True,
                refdoc=self.env.docname))
            title += nodes.Text(f": {rows[0].model}, {recordings.recorded_on(meta)}")
            body = [[self.link(_quotes(r.variant), r, docname), *cells(r, datasheet)]
                    for r in rows]
            out += [title, table(HEADER, body, classes=("decode-results",))]
        if not out:
            out.append(nodes.paragraph(
                text="No chapter has a GPU recording with results yet."))
        return out


# --- the story in one table ---------------------------------------------------------------

STORY_HEADER = ["what changed", "decode ms / token", "tokens / s", "× the baseline"]


def story_lines(content: list[str]) -> list[tuple[str, ...]]:
    """The directive's lines as ('part', title) and ('row', chapter, variant, what changed);
    ValueError, naming the line, for one that is neither."""
    lines = []
    for line in content:
        fields = tuple(f.strip() for f in line.split("|"))
        if not line.strip():
            continue
        if len(fields) == 1:
            lines.append(("part", fields[0]))
        elif len(fields) == 3 and all(fields):
            lines.append(("row", *fields))
        else:
            raise ValueError(f"{line.strip()!r} is neither a part's title nor "
                             "'chapter | variant | what changed'")
    return lines


def speed_up(row: results.Result, first: results.Result) -> str:
    """`row` over the part's first row: the chapter's own per-round figure and spread where
    the first row is its naive loop or its stock baseline, else the ratio of medians."""
    if row is first:
        return "1×"
    if is_naive_loop(first.variant) and row.x_v0 is not None:
        return results.with_spread(row.x_v0, row.x_v0_range, "×")
    if first.stock and row.x_generate_static is not None:
        return results.with_spread(row.x_generate_static, row.x_generate_static_range, "×")
    return f"{first.ms_per_token / row.ms_per_token:.3g}× (medians)"


def find_row(rows: dict[str, results.Result], variant: str) -> results.Result | None:
    """The row named `variant`; with a trailing `*`, the first whose name starts with the
    rest (a name that carries a figure of the run, such as its best k)."""
    if variant.endswith("*"):
        return next((r for name, r in rows.items() if name.startswith(variant[:-1])), None)
    return rows.get(variant)


class DecodeStory(_FromRecordings):
    """The book's story in one table, gpt-fast style: each part a workload, its rows the
    steps from its first row (a naive loop, a stock baseline) to the fastest, read from the
    chapters' recordings; each row links to the section that measures it. Content lines:
    a part's title alone, then `chapter | variant | what changed`, one a row (find_row)."""

    has_content = True

    def run(self):
        root = Path(self.env.srcdir)
        chapters = book.chapters(root)
        rows_of: dict[str, dict[str, results.Result]] = {}
        out, body, first = [], [], None

        def close_part():
            if body:
                out.append(table(STORY_HEADER, list(body), classes=("decode-story",)))
                body.clear()

        try:
            lines = story_lines(list(self.content))
        except ValueError as exc:
            raise self.error(str(exc)) from None
        for kind, *fields in lines:
            if kind == "part":
                close_part()
                out.append(nodes.paragraph("", "", nodes.strong(text=fields[0])))
                first = None
                continue
            chapter, variant, what = fields
            if chapter not in chapters:
                raise self.error(f"{chapter!r} is not a chapter of the TOC")
            if chapter not in rows_of:
                _, rows = self.chapter_rows(root, chapter, chapters[chapter])
                rows_of[chapter] = {r.variant: r for r in rows}
            row = find_row(rows_of[chapter], variant)
            if row is None:  # a chapter without a fresh recording, or a renamed variant
                logger.warning(f"the story's row {variant!r} of {chapter} is not in its "
                               "recording's results", location=self.get_location(),
                               type="gpuinfer", subtype="recording")
                continue
            first = first or row
            link = self.link(what, row, self.env.path2doc(str(chapters[chapter])))
            body.append([link, results.with_spread(row.ms_per_token, row.ms_range),
                         f"{row.tokens_per_s:,.0f}", speed_up(row, first)])
        close_part()
        return out


def setup(app):
    app.add_directive("decode-results", DecodeResults)
    app.add_directive("decode-story", DecodeStory)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
