"""What a reader's host and GPU need, from the recordings' provenance: the host in each
chapter's box (gpuinfer.publish.sphinx_provenance.box) and the reproduce page's tables of
hosts and of the card each chapter fits (gpuinfer.publish.sphinx_reproduce). The tables in
a built page: tests/test_build.py."""

from pathlib import Path

import pytest

pytest.importorskip("sphinx.addnodes")  # the GPU machine runs the GPU tests without Sphinx

from gpuinfer.publish import recordings  # noqa: E402
from gpuinfer.publish.sphinx_provenance import box  # noqa: E402
from gpuinfer.publish.titles import chapter_title  # noqa: E402
from gpuinfer.publish.sphinx_reproduce import (clock_text, host_row, memory_row,  # noqa: E402
                                               smallest_card)

OLD = {"gpu": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0+cu130",
       "transformers": "5.17.0", "python": "3.12.3", "cpu": "x86_64",
       "date": "2026-12-04 07:12 UTC", "seconds": 198.0, "smoke": False,
       "peak_gpu_memory_gib": 18.31}  # a recording made before the host was recorded
NEW = {**OLD, "triton": "3.6.0", "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
       "cpu_count": 16, "cpu_clock_ghz": 3.8,
       "cpu_clock_source": "maximum (cpufreq scaling_max_freq)"}


def a_box(tmp_path: Path, meta: dict) -> str:
    rec = tmp_path / "_recorded" / "ch.ipynb"
    rec.parent.mkdir(exist_ok=True)
    rec.write_text("{}")
    return box(recordings.Status("ch", "fresh", "", rec, meta), tmp_path)


def test_the_box_names_the_host_and_triton(tmp_path):
    said = a_box(tmp_path, NEW)
    assert ("- **Host:** Intel(R) Xeon(R) Platinum 8480+, 16 logical CPUs, 3.8 GHz maximum "
            "(cpufreq scaling_max_freq)\n") in said
    assert "torch 2.11.0+cu130, Triton 3.6.0, transformers 5.17.0" in said


def test_the_box_of_an_older_recording_says_not_recorded(tmp_path):
    said = a_box(tmp_path, OLD)
    assert "- **Host:** not recorded\n" in said and "Triton not recorded" in said
    assert "Triton none" in a_box(tmp_path, {**NEW, "triton": None})  # recorded: absent


def test_the_host_row_of_a_recording_and_of_an_older_one():
    assert host_row(NEW) == [
        "NVIDIA H200", "Intel(R) Xeon(R) Platinum 8480+, 16 logical CPUs, 3.8 GHz (maximum)",
        "driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, Triton 3.6.0, Python 3.12.3",
        "2026-12-04 07:12 UTC"]
    row = host_row(OLD)
    assert row[1] == "not recorded, not recorded logical CPUs, not recorded"
    assert "Triton not recorded" in row[2]
    assert row[0] == "NVIDIA H200" and row[-1] == OLD["date"]
    smoke = host_row({**NEW, "gpu": None, "driver": None, "cuda": None, "smoke": True})
    assert smoke[0] == "none (CPU smoke run)" and "driver –, CUDA –," in smoke[2]
    assert clock_text({**NEW, "cpu_clock_ghz": None}) == "–"  # recorded: unreadable
    assert clock_text({**NEW, "cpu_clock_ghz": 2.6,
                       "cpu_clock_source": "current (/proc/cpuinfo cpu MHz)"}) == \
        "2.6 GHz (current)"


def test_the_smallest_card_compares_bytes_with_bytes():
    # a card of N GB holds N * 10**9 bytes: 22.35 GiB on a 24 GB card
    assert smallest_card(22.0) == 24  # 23.6 GB: the book's budget fits a 24 GB card
    assert smallest_card(22.4) == 40  # 24.05 GB: more than 24 GB, though under 24 GiB
    assert smallest_card(14.9) == 16 and smallest_card(0.0) == 16
    assert smallest_card(18.31) == 24 and smallest_card(74.5) == 80
    assert smallest_card(131.3) == 141 and smallest_card(131.4) is None  # 141e9 B: 131.32
    assert smallest_card(None) is None and smallest_card(True) is None


def test_the_memory_row():
    assert memory_row(NEW) == ["18.3", "19.7", "24 GB"]
    assert memory_row({**NEW, "peak_gpu_memory_gib": 200.0})[2] == "none of 141 GB or less"
    assert memory_row({}) == ["–", "–", "–"]  # not a GPU run, or no nvidia-smi


def test_a_chapter_title_is_its_first_heading(tmp_path):
    page = tmp_path / "02_decode.md"
    page.write_text("---\nkernelspec:\n  name: python3\n---\n\n(ch-decode)=\n"
                    "# 2. Profile and optimize a greedy decode loop\n\n```{code-cell}\n"
                    "# a comment, not a heading\n```\n")
    assert chapter_title(page) == "2. Profile and optimize a greedy decode loop"
    page.write_text("```python\n# not this\n```\nno heading at all\n")
    assert chapter_title(page) == "02_decode"


def test_the_box_goes_after_the_title_or_the_front_matter():
    from gpuinfer.publish.titles import insert_after_title

    front = "---\nkernelspec:\n  name: python3\n---\n"
    assert insert_after_title(front + "# T\ntext\n", "BOX") == front + "# T\n\nBOX\ntext\n"
    assert insert_after_title(front + "text\n", "BOX") == front + "\nBOX\ntext\n"
