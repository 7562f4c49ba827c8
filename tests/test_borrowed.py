"""A stock baseline read from the chapter that measured it (gpuinfer.report.borrowed): used
only for the same workload on a GPU of the same name, and otherwise none, with the reason."""

import pytest

from gpuinfer.measure.stock import StockBaselines, StockRun
from gpuinfer.report.borrowed import recordings_folder, stock_from

WORKLOAD = dict(config="small", dtype="float32", prompt_len=4096, new_tokens=256,
                gpu="NVIDIA H200")


@pytest.fixture
def book(tmp_path):
    """A book whose Chapter 2 recording saved its stock baselines."""
    folder = tmp_path / "book" / "_recorded" / "02_decode"
    folder.mkdir(parents=True)
    run = StockRun("static", decode_ms=(1.6, 1.5, 1.7), prefill_ms=(60.0,) * 3,
                   whole_ms=(470.0,) * 3, first_call_s=17.0, clock="cuda-event")
    StockBaselines({"static": run}, "small", 4096, 256, 3, dtype="float32",
                   gpu="NVIDIA H200").save(folder)
    return tmp_path


def test_the_same_workload_reads_the_owners_figure(book):
    for start in (book, book / "book", book / "book" / "_recorded" / "02_decode"):
        borrowed = stock_from("02_decode", **WORKLOAD, start=start)
        assert borrowed.stock is not None, borrowed.source
        assert borrowed.stock["static"].median == 1.6
        assert "02_decode" in borrowed.source and "NVIDIA H200" in borrowed.source


@pytest.mark.parametrize("change, named", [
    ({"config": "toy"}, "holds stock-toy-float32.json"),  # a smoke run's toy model
    ({"gpu": None}, "gpu 'NVIDIA H200' there, None here"),  # a smoke run on a CPU
    ({"gpu": "NVIDIA GeForce RTX 4090"}, "gpu"),  # a reader's GPU, Chapter 2 not re-recorded
    ({"new_tokens": 128}, "new_tokens 256 there, 128 here"),
])
def test_another_workload_gets_no_figure_and_says_why(book, change, named):
    borrowed = stock_from("02_decode", **{**WORKLOAD, **change}, start=book)
    assert borrowed.stock is None and named in borrowed.source


def test_no_recording_gets_no_figure(tmp_path, book):
    assert recordings_folder(book / "book") == book / "book" / "_recorded"
    borrowed = stock_from("04_decode_at_scale", **WORKLOAD, start=book)
    assert borrowed.stock is None
    assert "record 04_decode_at_scale first" in borrowed.source


def test_a_recording_keeps_the_file_gzipped_and_it_reads_the_same(book):
    """The record command gzips a chapter's files (book/_recorded/<chapter>/*.json.gz)."""
    import gzip

    folder = book / "book" / "_recorded" / "02_decode"
    plain = folder / "stock-small-float32.json"
    (folder / (plain.name + ".gz")).write_bytes(gzip.compress(plain.read_bytes()))
    expected = stock_from("02_decode", **WORKLOAD, start=book).stock
    plain.unlink()
    borrowed = stock_from("02_decode", **WORKLOAD, start=book)
    assert borrowed.stock == expected
    (folder / (plain.name + ".gz")).write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="stock-small-float32.json.gz is not a saved"):
        stock_from("02_decode", **WORKLOAD, start=book)


def test_the_same_glue_names_with_a_baseline_and_without(book):
    import math

    found = stock_from("02_decode", **WORKLOAD, start=book)
    none = stock_from("02_decode", **{**WORKLOAD, "gpu": None}, start=book)
    assert list(found.glue_values()) == list(none.glue_values()) == [
        f"stock_static_fresh_{p}" for p in ("ms", "low", "high", "prefill_ms",
                                             "first_call_s")]
    assert found.glue_values() == found.stock.glue_values()  # its one variant: static
    assert found.glue_values()["stock_static_fresh_ms"] == 1.6
    assert all(math.isnan(v) for v in none.glue_values().values())


def test_one_lookup_serves_every_kind_of_kept_value(book):
    """`kept` reads any file a chapter keeps, through the reader it is given: the stock
    baselines above and the timings of gpuinfer.report.shared alike."""
    from gpuinfer.report.borrowed import kept

    folder = book / "book" / "_recorded" / "02_decode"
    (folder / "probe.json").write_text('{"gpu": "NVIDIA H200"}')
    read = lambda path: ({"gpu": "NVIDIA H200"}, path.read_text())  # noqa: E731
    value, source = kept("02_decode", "probe.json", {"gpu": "NVIDIA H200"}, read, "probed",
                         start=book)
    assert value == '{"gpu": "NVIDIA H200"}'
    assert source == "probed in 02_decode's recording on NVIDIA H200"
    value, source = kept("02_decode", "probe.json", {"gpu": None}, read, "probed",
                         start=book)
    assert value is None
    assert source == ("02_decode's recording probed another workload (gpu 'NVIDIA H200' "
                      "there, None here)")
