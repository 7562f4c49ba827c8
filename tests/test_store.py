"""publish.store: a recording is replaced whole or not at all."""

import gzip
import json

import pytest

from gpuinfer.publish import store


def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "ch.ipynb"
    path.write_text("old")
    store.atomic_write(path, b"new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ch.ipynb"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_stage_artifacts_gzips_json_and_lifts_the_chapters_folder(tmp_path):
    scratch, staged = tmp_path / "scratch", tmp_path / "staged"
    (scratch / "ch" / "traces").mkdir(parents=True)
    (scratch / "ch" / "traces" / "t.json").write_text(json.dumps({"traceEvents": []}))
    (scratch / "other.txt").write_text("x")
    assert store.stage_artifacts("ch", scratch, staged)
    with gzip.open(staged / "traces" / "t.json.gz") as f:
        assert json.load(f) == {"traceEvents": []}
    assert (staged / "other.txt").read_text() == "x"
    assert not store.stage_artifacts("ch", tmp_path / "empty", tmp_path / "staged2")


def test_replace_dir_swaps_or_removes(tmp_path):
    dest, new = tmp_path / "dest", tmp_path / "new"
    dest.mkdir()
    (dest / "old").write_text("1")
    new.mkdir()
    (new / "fresh").write_text("2")
    store.replace_dir(new, dest)
    assert [p.name for p in dest.iterdir()] == ["fresh"] and not new.exists()
    store.replace_dir(None, dest)
    assert not dest.exists() and list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "ch.ipynb"
    path.write_text("old")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        store.atomic_write(path, b"new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["ch.ipynb"]
