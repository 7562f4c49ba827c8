"""The frozen standard-library corpus (gpuinfer.model.stdlib_corpus): its SHA-256 is checked
on every read, the same files give the same bytes, what goes in comes back out, and the
files it leaves out (not UTF-8, duplicates, near-duplicates) are left out, each with why."""

import hashlib
import lzma
import tarfile
from pathlib import Path

import pytest

from gpuinfer.model import corpus
from gpuinfer.model import stdlib_corpus as S

CODE = ("import os\n\n\ndef {name}(path):\n    '''Read {name}.'''\n"
        "    with open(path) as f:\n        return [line.split(',') for line in f "
        "if line.strip() and not line.startswith('#')]\n")


def make_tree(root: Path) -> dict[str, bytes]:
    """A small standard-library folder: what `select` should keep, by path under it."""
    kept = {f"pkg{i}/mod{j}.py": CODE.format(name=f"f{i}_{j}_{'x' * i}").encode()
            for i in range(3) for j in range(2)}
    # different words, so that no shingle repeats from file to file
    kept = {name: f"# {name}\nvalue_{k} = {k} * {k + 1}\n".encode() + data.replace(
        b"line", f"row{k}".encode()).replace(b"path", f"where{k}".encode())
        for k, (name, data) in enumerate(sorted(kept.items()))}
    kept["a.py"] = "s = 'café ☕'\n".encode()  # UTF-8 beyond ASCII
    kept["pkg0/__init__.py"] = b""
    for name, data in kept.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "latin1.py").write_bytes("s = 'café'\n".encode("latin-1"))
    (root / "pkg1" / "__init__.py").write_bytes(b"")  # the same bytes as pkg0's
    (root / "pkg2" / "mod9.py").write_bytes(kept["pkg2/mod1.py"] + b"x = 1\n")  # near
    (root / "_sysconfigdata__linux.py").write_bytes(b"build_time_vars = {}\n")
    (root / "site-packages" / "other").mkdir(parents=True)
    (root / "site-packages" / "other" / "m.py").write_bytes(b"x = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (root / "notes.txt").write_text("not a source\n")
    (root / S.LICENSE).write_text("A licence.\n")
    return kept


@pytest.fixture
def tree(tmp_path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "lib"
    root.mkdir()
    return root, make_tree(root)


def test_select_keeps_the_sources_and_says_why_it_leaves_the_others(tree):
    root, kept = tree
    selection = S.select(root)
    assert [name for name, _ in selection.kept] == sorted(kept)
    assert dict(selection.kept) == kept
    why = dict(selection.skipped)
    assert why.keys() == {"latin1.py", "pkg1/__init__.py", "pkg2/mod9.py",
                          "_sysconfigdata__linux.py"}
    assert why["latin1.py"] == "not UTF-8"
    assert why["pkg1/__init__.py"] == "the same bytes as pkg0/__init__.py"
    assert why["pkg2/mod9.py"].startswith("near-duplicate")
    assert "generated" in why["_sysconfigdata__linux.py"]


def test_a_snapshot_is_byte_for_byte_the_same_for_the_same_files(tree, tmp_path):
    root, _ = tree
    one, two = tmp_path / "one.tar.xz", tmp_path / "two.tar.xz"
    sha = S.freeze(root, one, version="3.11.7")
    assert S.freeze(root, two, version="3.11.7") == sha
    assert one.read_bytes() == two.read_bytes()
    assert hashlib.sha256(one.read_bytes()).hexdigest() == sha
    # the same files copied elsewhere, with other times and modes: the same bytes
    copy = tmp_path / "copy"
    for path in sorted(root.rglob("*")):
        if path.is_file():
            (copy / path.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(root)).write_bytes(path.read_bytes())
            (copy / path.relative_to(root)).chmod(0o600)
    assert S.freeze(copy, tmp_path / "three.tar.xz", version="3.11.7") == sha
    # no time, owner or mode of the machine in it
    with tarfile.open(fileobj=lzma.open(one)) as tar:
        members = tar.getmembers()
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == \
        {(0, 0, 0, "", "", 0o644)}
    assert [m.name for m in members][:2] == [S.MANIFEST, S.LICENSE]


def test_the_files_read_back_are_the_files_that_went_in(tree, tmp_path):
    root, kept = tree
    packed = tmp_path / "snap.tar.xz"
    sha = S.freeze(root, packed, version="3.11.7")
    files = S.unpack(tmp_path / "out", packed, sha)
    base = tmp_path / "out" / S.SOURCES
    assert [f.relative_to(base).as_posix() for f in files] == sorted(kept)
    assert {f.relative_to(base).as_posix(): f.read_bytes() for f in files} == kept
    assert (tmp_path / "out" / S.LICENSE).read_text() == "A licence.\n"
    manifest = (tmp_path / "out" / S.MANIFEST).read_text()
    assert manifest.startswith("CPython 3.11.7:")
    assert "latin1.py\tnot UTF-8" in manifest
    train, heldout = corpus.held_out(files, every=4)  # as corpus.build splits them
    assert len(train) + len(heldout) == len(kept) and heldout


@pytest.mark.parametrize("damage", ["changed", "truncated", "missing"])
def test_a_changed_truncated_or_missing_snapshot_is_refused(damage, tree, tmp_path):
    root, _ = tree
    packed = tmp_path / "stdlib_snapshot.tar.xz"
    sha = S.freeze(root, packed, version="3.11.7")
    data = packed.read_bytes()
    if damage == "changed":
        packed.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncated":
        packed.write_bytes(data[: len(data) // 2])
    else:
        packed.unlink()
    error = FileNotFoundError if damage == "missing" else ValueError
    with pytest.raises(error, match=r"stdlib_snapshot\.tar\.xz.*(restore it from git|"
                                    r"Restore it from git)"):
        S.unpack(tmp_path / "out", packed, sha)
    assert not (tmp_path / "out" / S.SOURCES).exists()  # nothing unpacked


def test_freeze_refuses_another_python_without_a_root(monkeypatch, tmp_path):
    monkeypatch.setattr(S, "CPYTHON", "3.0.0")
    with pytest.raises(ValueError, match="not CPython 3.0.0"):
        S.freeze(path=tmp_path / "x.tar.xz")
    assert not (tmp_path / "x.tar.xz").exists()


def test_the_pinned_snapshot_is_the_named_one_and_builds_a_corpus():
    files = S.stdlib_files()
    assert files == S.stdlib_files()  # unpacked once per process
    base = next(p for p in files[0].parents if p.name == S.SOURCES)
    names = [f.relative_to(base).as_posix() for f in files]
    assert names == sorted(names)
    assert {"json/__init__.py", "test/test_json/test_dump.py"} <= set(names)
    manifest = S.manifest()
    assert manifest.startswith(f"CPython {S.CPYTHON}:")
    assert f"kept {len(files)} files, left out {len(S.left_out())}" in manifest
    assert ("test/test_source_encoding.py", "not UTF-8") in S.left_out()
    assert "Python Software Foundation" in (base.parent / S.LICENSE).read_text()
    # a smoke slice through corpus.build, unchanged: every 20th file held out
    small = files[:200:5]
    data = corpus.build(small, vocab_size=300, tokenizer_every=4)
    assert (data.train_files, data.heldout_files) == (38, 2)
    assert corpus.decode(data.tokenizer, data.heldout).split(corpus.EOT)[0] == \
        small[19].read_text(encoding="utf-8")
