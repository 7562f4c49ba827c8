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


# --- the story in one table (the intro) ---------------------------------------------------

def test_the_story_lines_are_parts_and_rows():
    from gpuinfer.publish.sphinx_results import story_lines

    assert story_lines(["A small model", "", "02_decode | V0 naive | The naive loop"]) == [
        ("part", "A small model"), ("row", "02_decode", "V0 naive", "The naive loop")]
    with pytest.raises(ValueError, match="'02_decode | V0' is neither"):
        story_lines(["02_decode | V0"])


def test_a_row_is_found_by_name_or_by_the_start_of_it():
    from gpuinfer.publish.sphinx_results import find_row

    rows = {r.variant: r for r in [Result("V0 naive", "m", 60.0, 1e9, 4e12),
                                   Result("speculative, k = 3", "m", 0.2, None, 4e12)]}
    assert find_row(rows, "V0 naive").ms_per_token == 60.0
    assert find_row(rows, "speculative*").variant == "speculative, k = 3"  # k: the run's
    assert find_row(rows, "V9") is None and find_row(rows, "spec") is None


def test_a_speed_up_is_the_chapters_own_over_the_same_rounds():
    """Over a naive loop or a stock baseline: the chapter's per-round figure, with its
    spread (a later chapter's row over its own naive loop); else the ratio of medians."""
    from gpuinfer.publish.sphinx_results import speed_up

    v0 = Result("V0 naive", "m", 60.0, 1e9, 4e12, x_v0=1.0, x_v0_range=(1.0, 1.0))
    v9 = Result("V9", "m", 0.5, 1e9, 4e12, x_v0=118.0, x_v0_range=(110.0, 121.0),
                x_generate_static=3.0, x_generate_static_range=(2.9, 3.1))
    stock = Result("generate()", "m", 1.5, 1e9, 4e12, stock=True)
    alone = Result("target alone", "m", 0.3, 1e9, 4e12)
    spec = Result("speculative", "m", 0.2, None, 4e12)
    assert speed_up(v0, v0) == "1×"
    assert speed_up(v9, v0) == "118× (110–121)"
    assert speed_up(v9, stock) == "3× (2.9–3.1)"
    assert speed_up(spec, alone) == "1.5× (medians)"


@pytest.mark.slow
def test_the_story_is_read_from_the_recordings_and_links_its_sections(tmp_path):
    """The fixture's chapter A glues two rows; the intro's story shows them with their
    speed-up over the first, and a row that no recording has is a warning naming it."""
    import re
    import shutil
    from pathlib import Path

    from conftest import jupyter_book_build
    from gpuinfer.publish import record

    fixture = Path(__file__).parent / "fixtures" / "book"
    root = Path(shutil.copytree(fixture, tmp_path / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    intro = root / "book" / "intro.md"
    intro.write_text(intro.read_text() + "\n```{decode-story}\nA fixture model\n"
                     "ch_a | V0 fixture | The naive loop\nch_a | V9* | The fast one\n"
                     "ch_a | V7 fixture | Not measured\n```\n")
    log = jupyter_book_build(root).log
    warnings = [line for line in log.splitlines()
                if "WARNING:" in line and "ch_b" not in line]  # ch_b: not recorded
    assert len(warnings) == 1 and "'V7 fixture' of ch_a is not in its recording" in \
        warnings[0]
    page = (root / "_build" / "html" / "book" / "intro.html").read_text()
    [story] = re.findall(r'<table class="[^"]*decode-story.*?</table>', page, re.S)
    rows = [" ".join(re.sub(r"<[^>]+>", " ", r).split())
            for r in re.findall(r"<tr.*?</tr>", story, re.S)[1:]]
    assert rows == ["The naive loop 2 500 1×", "The fast one 0.5 2,000 4×"]  # its own x_v0
    assert 'href="ch_a.html' in story  # each row links to the chapter that measures it


def test_a_variants_quotes_open_and_close():
    """Sphinx's smart quotes would close both quotes of `="static"`: the table writes them."""
    from gpuinfer.publish.sphinx_results import _quotes

    assert _quotes('generate(), cache_implementation="static"') == \
        "generate(), cache_implementation=\u201cstatic\u201d"
    assert _quotes("V9: compiled") == "V9: compiled"
