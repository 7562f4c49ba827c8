"""The corpora (gpuinfer.model.corpus): the book's own repository, the same text whatever is
installed, and the installed Python sources; holding files out, a byte-level tokenizer that
gives back the exact text and is the same in every process, EOT between files."""

from pathlib import Path

import pytest
import torch

from gpuinfer.model.corpus import (EOT, REPOSITORY, build, decode, digest, encode,
                                   held_out, python_files, read_text, repository_files,
                                   train_tokenizer, version)


@pytest.fixture(scope="module")
def stdlib_files() -> list[Path]:
    return python_files((), stdlib=True)


@pytest.fixture(scope="module")
def small_files(stdlib_files) -> list[Path]:
    """The 40 smallest non-empty, readable stdlib files (ties broken by path): a corpus
    that builds in well under a second, the same one on every run."""
    readable = [f for f in stdlib_files if f.stat().st_size > 200 and read_text(f)]
    return sorted(readable, key=lambda f: (f.stat().st_size, str(f)))[:40]


@pytest.fixture(scope="module")
def corpus(small_files):
    return build(small_files, vocab_size=300)


def test_python_files_finds_the_stdlib_and_packages(stdlib_files):
    assert any(str(f).endswith("json/__init__.py") for f in stdlib_files)
    assert not any("site-packages" in f.parts or "dist-packages" in f.parts
                   for f in stdlib_files)
    assert stdlib_files == sorted(set(stdlib_files))  # sorted, no duplicates
    assert all(f.suffix == ".py" and f.is_absolute() for f in stdlib_files)
    numpy_files = python_files(("numpy",), stdlib=False)
    assert any(str(f).endswith("numpy/__init__.py") for f in numpy_files)
    assert not set(numpy_files) & set(stdlib_files)
    both = python_files(("numpy",), stdlib=True)
    assert both == sorted(set(numpy_files) | set(stdlib_files))


def test_a_package_that_is_not_installed_is_named():
    with pytest.raises(ValueError, match="'no_such_package_xyz'.*pip install"):
        python_files(("no_such_package_xyz",))


def test_version_names_the_installed_release():
    import numpy

    assert version("numpy") == numpy.__version__
    with pytest.raises(ValueError, match="'no_such_package_xyz'.*pip install"):
        version("no_such_package_xyz")


def test_held_out_sets_every_20th_file_aside_and_loses_none():
    files = [Path(f"f{i:03d}.py") for i in range(105)]
    train, heldout = held_out(files)
    assert heldout == [files[i] for i in (19, 39, 59, 79, 99)]
    assert len(train) == 100 and sorted(train + heldout) == files
    assert held_out(files, every=1) == ([], files)


def test_read_text_skips_files_that_are_not_utf8(tmp_path):
    (tmp_path / "latin1.py").write_bytes("s = 'café'\n".encode("latin-1"))
    (tmp_path / "ok.py").write_text("s = 'café'\n", encoding="utf-8")
    assert read_text(tmp_path / "latin1.py") is None
    assert read_text(tmp_path / "missing.py") is None
    assert read_text(tmp_path / "ok.py") == "s = 'café'\n"


def test_build_holds_out_files_and_counts_them(corpus, small_files):
    assert (corpus.train_files, corpus.heldout_files) == (38, 2)
    assert corpus.vocab_size <= 300
    size = sum(f.stat().st_size for f in small_files) / 1e6
    assert corpus.megabytes == pytest.approx(size)
    assert corpus.train.dtype == corpus.heldout.dtype == torch.int64
    assert corpus.train.dim() == 1 and corpus.seconds > 0
    assert "40 files" in str(corpus)


def test_eot_separates_the_files(corpus):
    eot = corpus.tokenizer.token_to_id(EOT)
    assert int((corpus.train == eot).sum()) == corpus.train_files
    assert int((corpus.heldout == eot).sum()) == corpus.heldout_files
    assert corpus.train[-1] == eot and corpus.heldout[-1] == eot


def test_the_tokenizer_gives_back_the_exact_text(corpus, small_files):
    _, heldout = held_out(small_files)
    text = read_text(heldout[0])  # a file the tokenizer was not trained on
    ids = corpus.tokenizer.encode(text).ids
    assert decode(corpus.tokenizer, ids) == text
    assert len(ids) < len(text.encode())  # the merges compress
    odd = "naïve\tτ = '→'\r\n    \x00 😀\n"  # any bytes survive, not only ASCII source
    assert decode(corpus.tokenizer, corpus.tokenizer.encode(odd).ids) == odd
    # The stream of held-out files decodes to their texts, joined by EOT.
    assert decode(corpus.tokenizer, corpus.heldout) == "".join(
        read_text(f) + EOT for f in heldout)


def test_eot_written_in_a_source_is_text_not_a_boundary(corpus, tmp_path):
    source = tmp_path / "gpt2.py"
    source.write_text(f'eos = "{EOT}"\n', encoding="utf-8")
    ids = encode(corpus.tokenizer, [source])
    eot = corpus.tokenizer.token_to_id(EOT)
    assert int((ids == eot).sum()) == 1 and ids[-1] == eot
    assert decode(corpus.tokenizer, ids) == f'eos = "{EOT}"\n{EOT}'


def test_train_tokenizer_uses_every_nth_file(small_files):
    tokenizer = train_tokenizer(small_files, vocab_size=280, every=4)
    assert tokenizer.get_vocab_size() <= 280 and tokenizer.token_to_id(EOT) is not None
    with pytest.raises(ValueError, match="vocab_size=256"):
        train_tokenizer(small_files, vocab_size=256)


def test_too_few_files_to_hold_one_out(small_files):
    with pytest.raises(ValueError, match="5 files given: at least every=20"):
        build(small_files[:5], vocab_size=300)


def fake_repository(root: Path) -> Path:
    """A checkout's shape: the package, a chapter, a test, and what must stay out."""
    for name, text in {"code/gpuinfer/b.py": "b = 2\n", "code/gpuinfer/sub/a.py": "a = 1\n",
                       "book/01_x.md": "# One\n", "tests/test_a.py": "def test(): pass\n",
                       "book/_recorded/01_x.ipynb": "{}", "code/gpuinfer/__pycache__/b.py":
                       "stale", "scripts/s.py": "s = 0\n"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_repository_files_are_the_books_own_text_in_path_order(tmp_path):
    root = fake_repository(tmp_path / "book_checkout")
    outside = tmp_path / "site-packages" / "installed.py"
    outside.parent.mkdir()
    outside.write_text("x = 1\n", encoding="utf-8")
    (root / "code/gpuinfer/linked.py").symlink_to(outside)  # leads out: left out
    files = repository_files(root)
    assert [f.relative_to(root).as_posix() for f in files] == [
        "book/01_x.md", "code/gpuinfer/b.py", "code/gpuinfer/sub/a.py", "tests/test_a.py"]
    # The same text wherever the checkout lies: the digest covers the bytes, in order.
    moved = fake_repository(tmp_path / "elsewhere")
    assert digest(repository_files(moved)) == digest(files)
    (moved / "book/01_x.md").write_text("# Two\n", encoding="utf-8")
    assert digest(repository_files(moved)) != digest(files)


def test_repository_files_refuse_a_folder_that_is_not_the_book(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not the book's repository"):
        repository_files(tmp_path)


def test_the_books_corpus_reads_only_the_repository():
    files = repository_files()
    assert files and all(f.resolve().is_relative_to(REPOSITORY) for f in files)
    names = [f.relative_to(REPOSITORY).as_posix() for f in files]
    assert names == sorted(names)
    assert "code/gpuinfer/model/corpus.py" in names and "book/06_speculative.md" in names
    assert not any("_recorded" in n or "site-packages" in n for n in names)


BUILD_TWICE = """
import sys
from gpuinfer.model import corpus
files = corpus.repository_files()[:{n}]
built = corpus.build(files, vocab_size=600, every=10, tokenizer_every=1)
print(corpus.digest(files))
sys.stdout.write(built.tokenizer.to_str())
"""


def test_the_tokenizer_is_the_same_in_every_process():
    """BPE's training, in two processes with different hash seeds: the same tokenizer."""
    import os
    import subprocess
    import sys

    outs = [subprocess.run([sys.executable, "-c", BUILD_TWICE.format(n=30)],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")]
    assert outs[0] == outs[1] and '"merges"' in outs[0]


def test_build_trains_the_tokenizer_on_every_nth_training_file(small_files):
    every = build(small_files, vocab_size=400, tokenizer_every=1)
    quarter = build(small_files, vocab_size=400)
    assert every.tokenizer.to_str() != quarter.tokenizer.to_str()
    with pytest.raises(ValueError, match="every=0"):
        build(small_files, vocab_size=400, tokenizer_every=0)


import gpuinfer.model.corpus as C  # noqa: E402 (`corpus` is a fixture here)


def test_the_snapshot_is_the_named_one_and_unpacks_to_the_books_text():
    import os

    files = C.snapshot_files()
    assert files == C.snapshot_files()  # unpacked once per process
    root = Path(os.path.commonpath(files))
    names = {f.relative_to(root).as_posix() for f in files}
    assert {"code/gpuinfer/model/corpus.py", "book/06_speculative.md"} <= names
    assert not root.is_relative_to(C.REPOSITORY)  # not the live checkout


def test_a_snapshot_is_byte_for_byte_the_same_for_the_same_files(tmp_path):
    root = Path(C.REPOSITORY)
    one, two = tmp_path / "one.tar.gz", tmp_path / "two.tar.gz"
    assert C.freeze(root, one) == C.freeze(root, two)
    assert one.read_bytes() == two.read_bytes()


def test_a_changed_snapshot_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "corpus_snapshot.tar.gz"
    fake.write_bytes(C.SNAPSHOT.read_bytes() + b"\0")
    monkeypatch.setattr(C, "SNAPSHOT", fake)
    C.snapshot_files.cache_clear()
    try:
        with pytest.raises(ValueError, match="is not the snapshot this module names"):
            C.snapshot_files()
    finally:
        C.snapshot_files.cache_clear()
