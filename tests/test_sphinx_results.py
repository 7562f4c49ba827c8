"""The results page's rows and headings (gpuinfer.publish.sphinx_results): each median with
its spread over the chapter's rounds, as the chapter's own table shows it, and each
chapter headed by its page's title, never its file's slug. The page as built:
tests/test_build.py."""

import pytest

pytest.importorskip("sphinx.addnodes")  # the GPU machine runs the GPU tests without Sphinx

from gpuinfer.publish.sphinx_results import cells, heading  # noqa: E402
from gpuinfer.report import results  # noqa: E402
from gpuinfer.report.results import Result  # noqa: E402


def test_a_row_shows_the_spread_over_the_rounds():
    row = Result("V9", "m", 1.62, 3.0e9, 4.0e12, x_v0=10.4, x_generate_static=2.5,
                 ms_range=(1.52, 1.71), x_v0_range=(9.8, 11.0),
                 x_generate_static_range=(2.31, 2.6))
    said = cells(row, 5.0e12)
    assert said[0] == "1.62 (1.52–1.71)"
    assert said[-2:] == ["10.4× (9.8–11)", "2.5× (2.31–2.6)"]
    # the same text as the chapter's own table (results.markdown)
    assert f"| V9 | {said[0]} |" in results.markdown([row])
    assert f"| {said[-2]} | {said[-1]} |" in results.markdown([row])


def test_a_row_without_spreads_or_baselines():
    row = Result("speculative", "m", 0.4, None, 4.0e12)  # an older recording: no ranges
    said = cells(row, None)
    assert said[0] == "0.4" and said[-2:] == ["–", "–"]


def test_a_chapter_is_headed_by_its_title():
    assert heading("2. Profile and optimize a greedy decode loop") == \
        "Chapter 2: Profile and optimize a greedy decode loop"
    assert heading("Chapter A") == "Chapter A"  # a title without a number: as it is
