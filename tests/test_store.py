"""publish.store: a recording's notebook and its artifacts are replaced together, whatever
fails or kills the commit: the previous pair byte for byte, or the new pair, never a mix;
and nothing is left behind.

Faults are injected at every rename and write of a commit (an OSError as a full disk gives
it), the file size is capped with RLIMIT_FSIZE (a full disk while staging), and a commit in
a child process is killed, or sent Ctrl-C and SIGTERM, at every rename.
"""

import errno
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from conftest import recorded_files
from gpuinfer.publish import store
from gpuinfer.publish.book import artifacts_path, journal_path, recording_path
from gpuinfer.publish.validation import METADATA_KEY

ROOT = Path(__file__).resolve().parent.parent
OLD_TRACE = b'{"old": true}'


def make_book(root: Path) -> Path:
    """A chapter file with an old recording: the notebook and two artifacts. Returns the
    chapter's path."""
    chapter = root / "book" / "ch.md"
    chapter.parent.mkdir(parents=True)
    chapter.write_text("# ch\n")
    rec = recording_path(chapter)
    rec.parent.mkdir()
    rec.write_text('{"old notebook": 1}')
    art = artifacts_path(chapter)
    (art / "traces").mkdir(parents=True)
    (art / "traces" / "a.json.gz").write_bytes(gzip.compress(OLD_TRACE))
    (art / "old_only.txt").write_text("from the old run")
    return chapter


def new_run(tmp: Path, size: int = 1000) -> tuple[nbformat.NotebookNode, Path]:
    """A new run's notebook and its scratch folder (a JSON trace, a text file)."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("x = 1"))
    nb.metadata[METADATA_KEY] = {"run": "new"}
    scratch = tmp / "scratch"
    (scratch / "ch" / "traces").mkdir(parents=True)
    (scratch / "ch" / "traces" / "a.json").write_text(json.dumps({"new": "x" * size}))
    (scratch / "ch" / "new_only.txt").write_text("from the new run")
    return nb, scratch


def snapshot(chapter: Path) -> dict[str, bytes]:
    """Every file of the recordings folder, by path, with its bytes."""
    return recorded_files(chapter.parent.parent)


def is_old(files: dict[str, bytes], old: dict[str, bytes]) -> bool:
    return files == old


def pair(files: dict[str, bytes]) -> dict[str, bytes]:
    """The recording itself: without the staged and temporary files beside it."""
    return {k: v for k, v in files.items() if not k.startswith(".")}


def is_new(files: dict[str, bytes]) -> bool:
    """The new pair, and nothing else: the notebook names exactly the artifacts there."""
    if set(files) - {"ch.ipynb"} != {"ch/traces/a.json.gz", "ch/new_only.txt"}:
        return False
    nb = json.loads(files["ch.ipynb"])
    hashes = nb["metadata"][METADATA_KEY]["artifacts"]
    return hashes == {k[len("ch/"):]: hashlib.sha256(v).hexdigest()
                      for k, v in files.items() if k.startswith("ch/")}


def test_commit_writes_the_pair_with_the_artifacts_hashes(tmp_path):
    chapter = make_book(tmp_path)
    nb, scratch = new_run(tmp_path)
    store.commit(chapter, nb, scratch)
    files = snapshot(chapter)
    assert is_new(files), sorted(files)
    with gzip.open(artifacts_path(chapter) / "traces" / "a.json.gz") as f:
        assert json.load(f)["new"].startswith("x")
    rec = recording_path(chapter)
    assert oct(rec.stat().st_mode & 0o777) == "0o644"
    assert not list(rec.parent.glob(".*")), "a temporary file was left"


def test_a_run_without_artifacts_removes_the_old_folder(tmp_path):
    chapter = make_book(tmp_path)
    nb, _ = new_run(tmp_path)
    (tmp_path / "empty").mkdir()
    store.commit(chapter, nb, tmp_path / "empty")
    assert set(snapshot(chapter)) == {"ch.ipynb"}
    assert nb.metadata[METADATA_KEY]["artifacts"] == {}


def count_calls(monkeypatch, name: str, tmp_path: Path) -> int:
    """How many times a successful commit calls os.<name>, on a copy of the book."""
    calls = []
    real = getattr(os, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    copy = make_book(tmp_path / "count")
    nb, scratch = new_run(tmp_path / "count")
    with monkeypatch.context() as m:
        m.setattr(store.os, name, counting)
        store.commit(copy, nb, scratch)
    return len(calls)


@pytest.mark.parametrize("name", ["replace", "fsync"])
def test_a_fault_at_any_rename_or_sync_keeps_one_pair(tmp_path, monkeypatch, name):
    """A full disk (ENOSPC) raised by the k-th rename or sync of the commit, for every k:
    the commit fails with the old notebook and artifacts byte for byte, or (a sync after
    the last rename) completes with the new pair; no temporary file either way."""
    total = count_calls(monkeypatch, name, tmp_path)
    assert total >= (3 if name == "replace" else 4)
    real = getattr(os, name)
    for k in range(total):
        book = tmp_path / f"k{k}"
        chapter = make_book(book)
        old = snapshot(chapter)
        nb, scratch = new_run(book)
        calls = []

        def failing(*args, **kwargs):
            calls.append(args)
            if len(calls) == k + 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(store.os, name, failing)
            try:
                store.commit(chapter, nb, scratch)
                failed = False
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                failed = True
        files = snapshot(chapter)
        assert is_old(files, old) if failed else is_new(files), (name, k + 1, sorted(files))
        if name == "replace":
            assert failed, "every rename comes before the commit is complete"
        assert not list(recording_path(chapter).parent.glob(".*")), k


def test_a_full_disk_while_staging_keeps_the_old_pair(tmp_path):
    """RLIMIT_FSIZE in a child process: the big trace cannot be written (EFBIG, as a full
    disk gives ENOSPC); the commit fails before touching the old pair."""
    chapter = make_book(tmp_path)
    old = snapshot(chapter)
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_store import new_run
        from gpuinfer.publish import store
        nb, scratch = new_run(Path({str(tmp_path)!r}), size=2_000_000)
        import random
        trace = scratch / "ch" / "traces" / "a.json"  # random: it does not gzip small
        trace.write_text('"' + ''.join(random.choice('0123456789abcdef')
                                       for _ in range(400_000)) + '"')
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG rather than a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            store.commit(Path({str(chapter)!r}), nb, scratch)
        except OSError as exc:
            print("failed:", exc.strerror)
            sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "File too large" in proc.stdout
    assert is_old(snapshot(chapter), old)
    assert not list(recording_path(chapter).parent.glob(".*"))


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_store import new_run
    from gpuinfer.publish import record, store
    signal.signal(signal.SIGTERM, record._raise_interrupt)  # as the record command does
    nb, scratch = new_run(Path({tmp!r}))
    calls, real = [], os.replace

    def replace(*args):
        calls.append(args)
        if len(calls) == {k} + 1:
            os.kill(os.getpid(), signal.{sig})  # arrives at this rename
        return real(*args)

    store.os.replace = replace
    try:
        store.commit(Path({chapter!r}), nb, scratch)
    except store.InterruptedAfterCommit:
        print("interrupted after the commit")
        sys.exit(130)
    except KeyboardInterrupt:
        print("interrupted before the commit")
        sys.exit(131)
    print("committed")
""")


def commit_in_child(tmp_path: Path, chapter: Path, k: int, sig: str):
    code = KILLER.format(tests=str(Path(__file__).parent), tmp=str(chapter.parent.parent),
                         chapter=str(chapter), k=k, sig=sig)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env)


def test_a_kill_at_any_rename_leaves_the_old_pair_or_a_journal_that_finishes_it(tmp_path):
    """SIGKILL at the k-th rename of the commit (the journal's own rename first), for every
    k: before the journal, the old pair; after it, the chapter reads as unfinished (never as
    a fresh mix) and `recover` puts the new pair in place; nothing is left over."""
    for k in range(4):  # the journal, the old folder aside, the new folder in, the notebook
        chapter = make_book(tmp_path / f"k{k}")
        old = snapshot(chapter)
        proc = commit_in_child(tmp_path, chapter, k, "SIGKILL")
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
        folder = recording_path(chapter).parent
        journal = journal_path(chapter)
        if k == 0:  # killed at the journal's rename: not decided yet
            assert not journal.exists()
            assert is_old(pair(snapshot(chapter)), old)
        else:
            assert journal.exists(), k
        done = store.recover(folder)
        files = snapshot(chapter)
        assert is_old(files, old) if k == 0 else is_new(files), (k, sorted(files), done)
        assert not list(folder.glob(".*")), (k, list(folder.glob(".*")))


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_at_the_commit_waits_for_it(tmp_path, sig):
    """Held off during the renames: the commit completes, then the interrupt is reported as
    one that came after the recording was written."""
    for k in range(1, 4):
        chapter = make_book(tmp_path / f"k{k}")
        proc = commit_in_child(tmp_path, chapter, k, sig)
        assert proc.returncode == 130, proc.stdout + proc.stderr
        assert "interrupted after the commit" in proc.stdout
        assert is_new(snapshot(chapter))
        assert not list(recording_path(chapter).parent.glob(".*"))


def test_a_linked_artifacts_folder_is_replaced_not_written_through(tmp_path):
    chapter = make_book(tmp_path)
    art = artifacts_path(chapter)
    elsewhere = tmp_path / "elsewhere"
    art.rename(elsewhere)
    art.symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.rglob("*") if p.is_file()}
    nb, scratch = new_run(tmp_path)
    store.commit(chapter, nb, scratch)
    assert is_new(snapshot(chapter)) and not art.is_symlink()
    assert {p.name: p.read_bytes() for p in elsewhere.rglob("*") if p.is_file()} == before


def test_recover_removes_leftovers_and_finishes_journals(tmp_path):
    chapter = make_book(tmp_path)
    folder = recording_path(chapter).parent
    (folder / ".ch.ipynb.abc123.tmp").write_text("half a notebook")
    (folder / ".ch.new.tmp").mkdir()
    (folder / ".other.old.tmp").mkdir()
    (folder / ".write-check.x.tmp").write_text("")
    old = snapshot(chapter)
    done = store.recover(folder)
    assert len(done) == 4 and all("left by an earlier run" in line for line in done)
    assert snapshot(chapter) == {k: v for k, v in old.items() if not k.startswith(".")}
    assert store.recover(folder) == []


def test_one_recorder_at_a_time(tmp_path):
    with store.lock(tmp_path):
        with pytest.raises(store.Busy):
            with store.lock(tmp_path):
                pass
        child = subprocess.run(
            [sys.executable, "-c", "import sys; from gpuinfer.publish import store\n"
             f"try:\n  store.lock({str(tmp_path)!r}).__enter__()\n"
             "except store.Busy:\n  sys.exit(7)"], capture_output=True, text=True)
        assert child.returncode == 7, child.stderr
    with store.lock(tmp_path):  # released
        pass
    assert list(tmp_path.iterdir()) == []  # the lock is the folder's own: no file


def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "ch.ipynb"
    path.write_text("old")
    store.atomic_write(path, b"new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ch.ipynb"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_stage_artifacts_gzips_json_and_lifts_the_chapters_folder(tmp_path):
    scratch, staged = tmp_path / "scratch", tmp_path / "staged"
    staged.mkdir()
    (scratch / "ch" / "traces").mkdir(parents=True)
    (scratch / "ch" / "traces" / "t.json").write_text(json.dumps({"traceEvents": []}))
    (scratch / "other.txt").write_text("x")
    assert store.stage_artifacts("ch", scratch, staged)
    with gzip.open(staged / "traces" / "t.json.gz") as f:
        assert json.load(f) == {"traceEvents": []}
    assert (staged / "other.txt").read_text() == "x"
    assert not store.stage_artifacts("ch", tmp_path / "empty", tmp_path / "staged2")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_ignores_what_a_commit_writes_besides_the_recording(tmp_path, monkeypatch):
    """Every path a commit makes in the recordings folder, seen at each of its renames (the
    journal and its temp file, the staged pair, the set-aside folder), and the preflight's
    write check: ignored by the repository's .gitignore, so that what a killed run leaves
    is never committed; the recording itself (the notebook, its artifacts) is not."""
    chapter = make_book(tmp_path / "repo")
    repo = tmp_path / "repo"
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    folder = recording_path(chapter).parent
    old = {p.relative_to(repo).as_posix() for p in folder.rglob("*")}  # the old recording
    seen, real = set(), os.replace

    def replace(src, dst):
        for path in (Path(src), Path(dst), *folder.rglob("*")):
            seen.add(Path(path).relative_to(repo).as_posix())
        return real(src, dst)

    monkeypatch.setattr(store.os, "replace", replace)
    store.commit(chapter, *new_run(tmp_path))
    recording = {p.relative_to(repo).as_posix() for p in folder.rglob("*")}
    written = sorted(seen - recording - old) + ["book/_recorded/.write-check.k2j4x9.tmp"]
    assert any(path.endswith(".commit") for path in written), written
    assert any(".new.tmp" in path for path in written), written

    def ignored(paths):
        proc = subprocess.run(["git", "-C", str(repo), "check-ignore", "--no-index",
                               "--stdin"], input="\n".join(paths), capture_output=True,
                              text=True)
        return set(proc.stdout.split())

    assert ignored(written) == set(written)
    assert ignored(sorted(recording | old)) == set()
