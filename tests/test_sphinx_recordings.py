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


def test_a_chapter_edited_during_the_build_stops_it(tmp_path):
    """A chapter read as fresh when the build started, then edited before Sphinx reads it:
    myst-nb would miss the cache seeded from its recording and run it on the CPU, under
    the box of a GPU recording. The build stops with one line instead; unedited, it goes on."""
    import pytest

    from gpuinfer.publish.recordings import Status
    from gpuinfer.publish.sphinx_provenance import add_box

    chapter = tmp_path / "book" / "ch_a.md"
    chapter.parent.mkdir()
    chapter.write_text("# Chapter A\n")
    recording = tmp_path / "book" / "_recorded" / "ch_a.ipynb"
    status = Status("ch_a", "fresh", "recorded on a GPU", recording, {}, ())
    env = SimpleNamespace(srcdir=str(tmp_path), note_dependency=lambda path: None,
                          doc2path=lambda docname: str(tmp_path / f"{docname}.md"))
    app = SimpleNamespace(env=env, srcdir=str(tmp_path),
                          gpuinfer_status={"book/ch_a": status},
                          gpuinfer_seeded={"book/ch_a": "# Chapter A\n"})
    source = ["# Chapter A\n"]
    add_box(app, "book/ch_a", source)  # as read: the box goes in
    assert source[0].startswith("# Chapter A\n") and len(source[0]) > len("# Chapter A\n")
    chapter.write_text("# Chapter A, edited\n")
    with pytest.raises(SystemExit) as stopped:
        add_box(app, "book/ch_a", ["# Chapter A, edited\n"])
    said = str(stopped.value)
    assert said.startswith("error: ") and "ch_a.md changed while the site was being built" \
        in said and "build again" in said and "\n" not in said
