import gzip

import pytest

from gpuinfer.measure.timing import Timing
from gpuinfer.report import shared

WORKLOAD = {"config": "small", "dtype": "float32", "prompt_len": 8, "new_tokens": 4,
            "gpu": "NVIDIA H200"}


def _book(tmp_path):
    folder = tmp_path / "book" / "_recorded" / "02_decode"
    folder.mkdir(parents=True)
    return folder


def test_a_kept_timing_is_borrowed_for_the_same_workload(tmp_path):
    folder = _book(tmp_path)
    lean = Timing((5.0, 5.2, 5.1), "cuda-event")
    shared.keep(folder, "loops", WORKLOAD, {"lean": lean})
    got = shared.borrow("02_decode", "loops", WORKLOAD, start=tmp_path)
    assert got.get("lean") == lean
    assert "02_decode" in got.source and "H200" in got.source


def test_the_recorders_gzipped_copy_is_read(tmp_path):
    folder = _book(tmp_path)
    path = shared.keep(folder, "loops", WORKLOAD, {"lean": Timing((1.0,), "host")})
    (folder / "loops.json.gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    got = shared.borrow("02_decode", "loops", WORKLOAD, start=tmp_path)
    assert got.get("lean").median == 1.0


def test_another_workload_or_no_recording_gives_none_and_says_why(tmp_path):
    folder = _book(tmp_path)
    shared.keep(folder, "loops", WORKLOAD, {"lean": Timing((1.0,), "host")})
    other = shared.borrow("02_decode", "loops", {**WORKLOAD, "gpu": None}, start=tmp_path)
    assert other.timings is None and other.get("lean") is None
    assert "'NVIDIA H200' there, None here" in other.source
    missing = shared.borrow("03_x", "loops", WORKLOAD, start=tmp_path)
    assert missing.timings is None and "record 03_x first" in missing.source


def test_a_damaged_file_names_itself_and_the_fix(tmp_path):
    folder = _book(tmp_path)
    (folder / "loops.json").write_text("{}")
    with pytest.raises(ValueError, match="loops.json is not a kept timing file.*record"):
        shared.borrow("02_decode", "loops", WORKLOAD, start=tmp_path)
