"""What a cached page was made from (gpuinfer.publish.sphinx_recordings.seed_digest): a page
that shows another chapter's stock measurement is made again when that one changes."""

from types import SimpleNamespace

from gpuinfer.publish.sphinx_recordings import seed_digest


def test_another_chapters_stock_measurement_is_part_of_the_digest(tmp_path):
    recorded = tmp_path / "_recorded"
    (recorded / "02_decode").mkdir(parents=True)
    notebook = recorded / "03_compile_cuda_graphs.ipynb"
    notebook.write_text("{}", encoding="utf8")
    page = tmp_path / "03_compile_cuda_graphs.md"
    page.write_text("# Chapter 3\n", encoding="utf8")
    status = SimpleNamespace(recording=notebook, provenance={})
    before = seed_digest(status, page, "package")
    stock = recorded / "02_decode" / "stock-small-float32.json.gz"
    stock.write_bytes(b"one")
    after = seed_digest(status, page, "package")
    stock.write_bytes(b"two")
    assert len({before, after, seed_digest(status, page, "package")}) == 3
