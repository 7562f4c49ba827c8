import gzip

import pytest

from gpuinfer.measure.rounds import apart
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


def test_a_timing_here_against_a_borrowed_one_pairs_fastest_with_slowest(tmp_path):
    folder = _book(tmp_path)
    shared.keep(folder, "loops", WORKLOAD, {"V0": Timing((3.0, 3.6), "cuda-event")})
    got = shared.borrow("02_decode", "loops", WORKLOAD, start=tmp_path)
    ours = Timing((1.0, 1.2), "cuda-event")
    c = got.against("ours", ours, "V0")
    assert c == apart("ours", ours, "V0", got.get("V0"))
    assert (c.a, c.b) == ("ours", "V0") and c.faster and c.rounds == 2
    assert c.ratio == pytest.approx(3.3 / 1.1)
    assert (c.low, c.high) == (pytest.approx(3.0 / 1.2), pytest.approx(3.6 / 1.0))
    none = shared.borrow("02_decode", "loops", {**WORKLOAD, "gpu": None}, start=tmp_path)
    with pytest.raises(ValueError, match="no timing of V0 to compare with: 02_decode's"):
        none.against("ours", ours, "V0")


def test_borrowed_rows_come_first_and_every_speed_up_is_over_their_naive_loop():
    from gpuinfer.report import results

    mine = results.Result("V9", "m", 0.5, 100.0, 1e12, ms_range=(0.4, 0.6))
    v0, lean = Timing((10.0, 12.0), "cuda-event"), Timing((5.0, 6.0), "cuda-event")
    rows = results.with_borrowed(
        [mine], {"V9": Timing((0.4, 0.5, 0.6), "cuda-event")}, {"V0": v0, "V2L": lean},
        v0="V0", model="m", bytes_per_token=100.0, bandwidth=1e12, section="s",
        prefill_ms={"V0": 3.0})
    assert [r.variant for r in rows] == ["V0", "V2L", "V9"]
    assert rows[0].x_v0 == pytest.approx(1.0) and rows[0].prefill_ms == 3.0
    assert rows[1].x_v0 == pytest.approx(11.0 / 5.5)
    assert rows[2].x_v0 == pytest.approx(11.0 / 0.5)
    assert rows[2].x_v0_range == (pytest.approx(10.0 / 0.6), pytest.approx(12.0 / 0.4))
