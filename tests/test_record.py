"""The record command (`python -m gpuinfer.publish.record`) and the recording status, on a
fixture book.

tests/fixtures/book has two tiny chapters: ch_a (a measurement cell with a JSON artifact
and a displayed table, and presentation cells: a figure and glued numbers from the values it
kept) and ch_b (one cell). On this CPU machine they are recorded with --allow-cpu, as smoke
recordings, into a copy of the fixture under tmp_path; the real book is never touched.
"""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from conftest import recorded_files
from gpuinfer.publish import hashes, parsed, preflight, record, recordings
from gpuinfer.publish.validation import read_provenance

FIXTURE = Path(__file__).parent / "fixtures" / "book"
REPO = Path(__file__).resolve().parent.parent
FAILING_CELL = "\n```{code-cell} ipython3\nratio = 1 / 0\n```\n"


def copy_book(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("_build", "_recorded"))
    return dest


def chapter_file(root: Path, chapter: str) -> Path:
    return root / "book" / f"{chapter}.md"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The fixture book with both chapters recorded on the CPU (--allow-cpu), with the
    repository's recorder script and requirements (gpuinfer.publish.recorder hashes them)."""
    root = copy_book(tmp_path_factory.mktemp("recorded") / "book")
    (root / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "gpu_record.sh", root / "scripts" / "gpu_record.sh")
    shutil.copy(REPO / "requirements.txt", root / "requirements.txt")
    assert record.main(["--root", str(root), "--allow-cpu"]) == 0
    return root


@pytest.fixture
def book(recorded, tmp_path):
    """A private copy of the recorded fixture book, for a test to change."""
    return Path(shutil.copytree(recorded, tmp_path / "book"))


# --- bad input: exit code 2 and a message that names the fix (no kernel is started) -------

def test_unknown_chapter_lists_the_valid_ones(capsys):
    assert record.main(["--root", str(FIXTURE), "--allow-cpu", "no_such_chapter"]) == 2
    err = capsys.readouterr().err
    assert "unknown chapter 'no_such_chapter'" in err and "ch_a, ch_b" in err


def test_no_cuda_is_refused_without_the_flag(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert record.main(["--root", str(FIXTURE), "ch_b"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--allow-cpu" in err


@pytest.mark.parametrize("module, package", [("nbclient", "nbclient"), ("yaml", "pyyaml"),
                                             ("torch", "torch"), ("myst_nb", "myst-nb")])
def test_missing_dependency_says_how_to_install(capsys, monkeypatch, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` fail
    assert record.main(["--root", str(FIXTURE), "--allow-cpu", "ch_b"]) == 2
    err = capsys.readouterr().err
    assert f"missing Python packages: {package}." in err
    assert "pip install -r requirements.txt" in err


def test_root_without_a_toc_is_a_usage_error(capsys, tmp_path):
    assert record.main(["--root", str(tmp_path), "--allow-cpu"]) == 2
    err = capsys.readouterr().err
    assert f"--root {tmp_path}: no _toc.yml there" in err and "Traceback" not in err


def test_outside_a_book_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert record.main(["--allow-cpu"]) == 2
    assert f"{tmp_path} is not inside a book" in capsys.readouterr().err


def test_an_unwritable_recordings_folder_is_found_before_running(capsys, tmp_path):
    root = copy_book(tmp_path / "book")
    (root / "book" / "_recorded").write_text("a file where the folder should be")
    start = time.perf_counter()
    assert record.main(["--root", str(root), "--allow-cpu", "ch_b"]) == 2
    assert time.perf_counter() - start < 5, "the chapter must not have run first"
    captured = capsys.readouterr()
    assert f"cannot write recordings into {root / 'book' / '_recorded'}" in captured.err
    assert "cell 1/" not in captured.out and "Traceback" not in captured.err


def one_error_line(err: str) -> str:
    """The command's whole stderr: exactly one line, `error: ...`, and no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_another_books_chapter_is_not_taken_for_this_ones(capsys, tmp_path):
    other = copy_book(tmp_path / "elsewhere")
    before = sorted(p.name for p in (FIXTURE / "book").iterdir())
    path = str(other / "book" / "ch_b.md")
    assert record.main(["--root", str(FIXTURE), "--allow-cpu", path]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{path} is not a chapter of the book at {FIXTURE}" in line and "--root" in line
    assert record.main(["--root", str(FIXTURE), "--allow-cpu", "no/such/ch_b.md"]) == 2
    assert "no file no/such/ch_b.md" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in (FIXTURE / "book").iterdir()) == before


@pytest.mark.parametrize("case", ["not-utf8", "front-matter", "outside", "two-named-alike",
                                  "bad-toc", "toc-file-not-a-path", "toc-missing-page",
                                  "toc-nul-byte", "toc-entry-not-a-mapping"])
def test_an_unreadable_book_stops_the_command_with_one_line(case, capsys, tmp_path):
    """Before any kernel starts, and without writing anything, outside the book least."""
    from test_recordings import UNREADABLE

    damage, said = UNREADABLE[case]
    root = copy_book(tmp_path / "book")
    damage(root)
    assert record.main(["--root", str(root), "--allow-cpu"]) == 2
    assert said in one_error_line(capsys.readouterr().err)
    assert not list(tmp_path.rglob("_recorded")), "a recordings folder was made"


def test_a_missing_root_folder_is_a_usage_error(capsys, tmp_path):
    assert record.main(["--root", str(tmp_path / "nope"), "--allow-cpu"]) == 2
    assert "not a folder" in one_error_line(capsys.readouterr().err)


def test_a_linked_recording_is_refused_before_running(capsys, tmp_path):
    root = copy_book(tmp_path / "book")
    recorded_dir = root / "book" / "_recorded"
    recorded_dir.mkdir()
    (tmp_path / "traces").mkdir()
    (recorded_dir / "ch_b").symlink_to(tmp_path / "traces")
    assert record.main(["--root", str(root), "--allow-cpu", "ch_b"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{recorded_dir / 'ch_b'} is a link" in line and "Remove the link" in line


@pytest.mark.slow
def test_a_linked_recordings_folder_is_neither_written_nor_trusted(book, capsys, tmp_path):
    """book/_recorded a link to a folder elsewhere: the record command (and --recover)
    refuse it with one line naming it and the fix, and write nothing through it; the
    status reads no recording through it."""
    recorded_dir = book / "book" / "_recorded"
    elsewhere = tmp_path / "elsewhere"
    recorded_dir.rename(elsewhere)
    recorded_dir.symlink_to(elsewhere)
    before = {p.relative_to(elsewhere).as_posix(): p.read_bytes()
              for p in sorted(elsewhere.rglob("*")) if p.is_file()}
    for args in (["--allow-cpu", "ch_b"], ["--recover"]):
        assert record.main(["--root", str(book), *args]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"{recorded_dir} is a link (to {elsewhere})" in line, line
        assert "Replace the link with a folder" in line
    assert {p.relative_to(elsewhere).as_posix(): p.read_bytes()
            for p in sorted(elsewhere.rglob("*")) if p.is_file()} == before
    st = recordings.status(book, "ch_a", accept_cpu=True)
    assert st.state == "linked" and "\n" not in st.message
    assert "its recordings folder book/_recorded is a link" in st.message
    assert "replace the link with a folder" in st.message


def test_a_full_temporary_folder_is_found_before_running(capsys, tmp_path, monkeypatch):
    root = copy_book(tmp_path / "book")
    real = shutil.disk_usage

    def usage(path):
        full = Path(path).resolve() == Path(tempfile.gettempdir()).resolve()
        return real(path)._replace(free=3 * 2**20) if full else real(path)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    start = time.perf_counter()
    assert record.main(["--root", str(root), "--allow-cpu", "ch_b"]) == 2
    assert time.perf_counter() - start < 5, "the chapter must not have run first"
    line = one_error_line(capsys.readouterr().err)
    assert "the temporary folder" in line and "3 MB free" in line and "TMPDIR" in line


def test_chapter_names_resolve_by_stem_path_or_prefix():
    chosen = preflight.select_chapters(FIXTURE, ["book/ch_a.md", "ch_b"])
    assert list(chosen) == ["ch_a", "ch_b"]
    with pytest.raises(preflight.UsageError,
                       match="'ch' is ambiguous: it starts ch_a, ch_b"):
        preflight.select_chapters(FIXTURE, ["ch"])


# --- what a chapter's recording depends on -------------------------------------------------

def test_status_of_a_missing_and_a_corrupt_recording(tmp_path):
    root = copy_book(tmp_path / "book")
    st = recordings.status(root, "ch_b")
    assert st.state == "missing" and "book/_recorded/ch_b.ipynb" in st.message
    st.recording.parent.mkdir()
    st.recording.write_text("{ not json")
    st = recordings.status(root, "ch_b")
    assert st.state == "corrupt" and "book/_recorded/ch_b.ipynb is unreadable" in st.message
    st.recording.write_text(json.dumps({"cells": [], "metadata": {}}))
    assert recordings.status(root, "ch_b").state == "corrupt"


def rewrite(path: Path, change) -> None:
    nb = json.loads(path.read_text())
    change(nb)
    path.write_text(json.dumps(nb))


def figure(nb: dict) -> tuple[dict, str]:
    """The recorded displayed output (a table), and where a message says it is ('cell 4,
    output 2')."""
    for i, cell in enumerate(nb["cells"], start=1):
        for j, out in enumerate(cell.get("outputs", []), start=1):
            if "text/markdown" in out.get("data", {}):
                return out, f"cell {i}, output {j}"
    raise AssertionError("no displayed output")


@pytest.mark.parametrize("damage, reason", [
    (lambda out: out["data"].update({"image/png": "not base64 at all!"}),
     "{where}: its image/png is not base64"),
    (lambda out: out.pop("data"), "{where}: 'data' is a required property"),
    (lambda out: out.update(data=[]), "{where}, data: [] is not of type 'object'"),
    (lambda out: out.update(output_type="picture"), "{where}"),
])
def test_a_recording_damaged_inside_is_corrupt_not_a_crash(recorded, tmp_path, damage, reason):
    """Valid JSON, damaged inside: reported with the place, as the build reports it."""
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    where = []
    rewrite(root / "book" / "_recorded" / "ch_a.ipynb",
            lambda nb: (where.append(figure(nb)[1]), damage(figure(nb)[0])))
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "corrupt" and reason.format(where=where[0]) in st.reason, st.reason


def test_code_edited_inside_a_recording_makes_it_stale(recorded, tmp_path):
    """The tests and the build agree: a recording's own code cells must be those whose hash
    it stores."""
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    rewrite(root / "book" / "_recorded" / "ch_a.ipynb", lambda nb: next(
        c for c in nb["cells"] if c["cell_type"] == "code").update(source="print('edited')"))
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale"
    assert "its code cells are not the ones it was recorded with" in st.reason


def test_an_edited_number_in_the_recorded_outputs_makes_it_stale(recorded, tmp_path):
    """Tamper-evident: one line naming the chapter, the file and the cell."""
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    rec = root / "book" / "_recorded" / "ch_a.ipynb"
    rec.write_text(rec.read_text().replace("answer 45", "answer 44"))
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale" and "\n" not in st.message
    assert st.message.startswith("chapter ch_a has no valid GPU recording: its recorded "
                                 "outputs in book/_recorded/ch_a.ipynb (cell 3) are not")


def test_an_edited_number_in_the_kept_data_makes_it_stale(recorded, tmp_path):
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    data = root / "book" / "_recorded" / "ch_a" / "data.json"
    data.write_text(data.read_text().replace('"answer": 45', '"answer": 46'))
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale" and "\n" not in st.message
    assert "chapter ch_a" in st.message and "altered: data.json" in st.message


def test_a_deeply_nested_recording_is_corrupt(recorded, tmp_path):
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    (root / "book" / "_recorded" / "ch_a.ipynb").write_text("[" * 200_000)
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "corrupt" and "nests too deeply" in st.reason


@pytest.mark.parametrize("change, said", [
    (lambda art: shutil.rmtree(art), "missing: data.json, trace.json.gz"),
    (lambda art: (art / "trace.json.gz").write_bytes(b"from a CPU build"),
     "altered: trace.json.gz"),
    (lambda art: (art / "extra.json.gz").write_bytes(b"left by an older recording"),
     "not from the recording: extra.json.gz"),
])
def test_artifacts_that_are_not_the_recordings_make_it_stale(recorded, tmp_path, change, said):
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    change(root / "book" / "_recorded" / "ch_a")
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale" and "its files in book/_recorded/ch_a/" in st.reason
    assert said in st.reason and "python -m gpuinfer.publish.record ch_a" in st.message


@pytest.mark.parametrize("older", [
    lambda meta: meta.pop("format"), lambda meta: meta.update(format=1),
    lambda meta: meta.pop("outputs")])
def test_a_recording_of_an_older_format_is_stale_never_trusted(recorded, tmp_path, older):
    """Made before recordings hashed their outputs and data: one line, never fresh."""
    root = Path(shutil.copytree(recorded, tmp_path / "book"))
    rec = root / "book" / "_recorded" / "ch_a.ipynb"
    rewrite(rec, lambda nb: older(nb["metadata"]["gpuinfer"]))
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale" and "\n" not in st.message, st.message
    if "format" in json.loads(rec.read_text())["metadata"]["gpuinfer"] and \
            json.loads(rec.read_text())["metadata"]["gpuinfer"]["format"] == 2:
        assert "recorded outputs" in st.reason
    else:
        assert "an older format" in st.reason and "not trusted" in st.reason


# --- which book is recorded ---------------------------------------------------------------

@pytest.mark.slow
def test_records_into_the_book_of_the_current_directory(tmp_path, monkeypatch, capsys):
    """Not into the checkout the package was installed from: a second clone records into
    itself, and names the file it wrote."""
    other = copy_book(tmp_path / "clone_b")
    monkeypatch.chdir(other / "book")  # inside the book: its root is found above
    assert record.main(["--allow-cpu", "ch_b"]) == 0
    written = other / "book" / "_recorded" / "ch_b.ipynb"
    assert written.is_file()
    assert f"wrote {written.resolve()}" in capsys.readouterr().out
    assert not (FIXTURE / "book" / "_recorded").exists(), "the fixture itself was written"


# --- scratch folders ------------------------------------------------------------------------

@pytest.mark.slow
def test_no_scratch_folder_is_left_and_stale_ones_are_removed(tmp_path, monkeypatch):
    from gpuinfer import env

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process that has ended: its folder is stale
    stale = scratch / f"{env.SCRATCH_PREFIX}{dead.pid}-record-ch_b-x1"
    stale.mkdir()
    (stale / env.SCRATCH_MARKER).write_text(str(dead.pid))  # as the package marks its own
    live = scratch / f"{env.SCRATCH_PREFIX}{os.getppid()}-record-ch_b-x2"  # a live one
    live.mkdir()
    (live / env.SCRATCH_MARKER).write_text(str(os.getppid()))
    by_hand = scratch / f"{env.SCRATCH_PREFIX}{dead.pid}-record-ch_b-x3"  # no marker
    by_hand.mkdir()
    root = copy_book(tmp_path / "book")
    assert record.main(["--root", str(root), "--allow-cpu", "ch_b"]) == 0
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("gpuinfer")) == \
        sorted([live.name, by_hand.name])


# --- recording on the CPU: labelled smoke, rejected ----------------------------------------

@pytest.mark.slow
def test_cpu_recording_is_labelled_smoke_and_rejected(recorded):
    meta = read_provenance(recorded / "book" / "_recorded" / "ch_a.ipynb")
    assert meta["smoke"] is True and meta["gpu"] is None
    # what ch_a's measurement cells reach: artifact_dir and what it calls, and the
    # statements of the modules imported on the way; not the plots its presentation uses
    assert set(meta["definitions"]) == {
        "__init__.py", "env.py", "env.py::artifact_dir", "env.py::_artifact_scratch",
        "env.py::scratch_dir", "env.py::remove_stale_scratch", "env.py::_alive"}
    st = recordings.status(recorded, "ch_a")
    assert st.state == "cpu" and "CPU smoke recording" in st.message
    assert "python -m gpuinfer.publish.record ch_a" in st.message
    assert recordings.status(recorded, "ch_a", accept_cpu=True).fresh
    # the JSON trace the chapter wrote is kept beside the recording, gzipped, and hashed
    assert (recorded / "book" / "_recorded" / "ch_a" / "trace.json.gz").is_file()
    assert list(meta["artifacts"]) == ["data.json", "trace.json.gz"]
    assert set(meta["cell_seconds"]) == {"1", "3"}  # the measurement cells, timed
    nb = json.loads((recorded / "book" / "_recorded" / "ch_a.ipynb").read_text())
    assert not any("image/png" in out.get("data", {}) for c in nb["cells"]
                   for out in c.get("outputs", [])), "the figure is the build's to draw"


def test_recorded_on_names_the_gpu_or_warns_of_a_cpu_run():
    gpu = {"smoke": False, "gpu": "NVIDIA H200", "date": "2026-12-01 09:33 UTC"}
    assert recordings.recorded_on(gpu) == "recorded on an NVIDIA H200, 2026-12-01 09:33 UTC"
    cpu = {"smoke": True, "gpu": None, "date": "2026-12-01 09:33 UTC"}
    assert recordings.recorded_on(cpu) == (
        "a CPU smoke run, not GPU results, 2026-12-01 09:33 UTC")


@pytest.mark.slow
def test_prose_edits_keep_a_recording_and_code_or_package_edits_stale_it(book, tmp_path):
    path = chapter_file(book, "ch_b")
    path.write_text(path.read_text() + "\nMore prose.\n")
    assert recordings.status(book, "ch_b", accept_cpu=True).fresh
    path.write_text(path.read_text().replace('print("gpuinfer"', 'print("gpuinfer version"'))
    st = recordings.status(book, "ch_b", accept_cpu=True)
    assert st.state == "stale" and "its measurement cell 1 changed" in st.message

    pkg = Path(shutil.copytree(hashes.PACKAGE_DIR, tmp_path / "gpuinfer"))
    (pkg / "experiments" / "scale.py").write_text("# not imported by ch_a\n")
    plots = pkg / "report" / "plots.py"  # only ch_a's presentation cells use it
    plots.write_text(plots.read_text().replace("SMALL_TEXT = 8.5", "SMALL_TEXT = 9.5", 1))
    env = pkg / "env.py"
    source = env.read_text()
    env.write_text(source + "\n\ndef unreached():\n    return 1  # a new function\n")
    assert recordings.status(book, "ch_a", accept_cpu=True, package_dir=pkg).fresh
    env.write_text(source.replace('"""Folder where a chapter writes large artifacts',
                                  '"""A docstring edited. Folder where', 1))
    assert recordings.status(book, "ch_a", accept_cpu=True, package_dir=pkg).fresh
    env.write_text(source.replace("    path = os.path.join(root, chapter)\n",
                                  "    path = os.path.join(root, chapter, '')\n", 1))
    st = recordings.status(book, "ch_a", accept_cpu=True, package_dir=pkg)
    assert st.state == "stale" and "gpuinfer/env.py::artifact_dir changed" in st.message


@pytest.mark.slow
def test_the_recorders_set_up_stales_every_chapter(book, tmp_path):
    """CUDA_LAUNCH_BLOCKING set where the recorder starts the kernel, in gpu_record.sh or in
    a start-up hook, or a changed pin: every chapter stale, the recorder named."""
    pkg = Path(shutil.copytree(hashes.PACKAGE_DIR, tmp_path / "gpuinfer",
                               ignore=shutil.ignore_patterns("__pycache__", "*.tar.gz")))
    blocking = 'import os\nos.environ["CUDA_LAUNCH_BLOCKING"] = "1"\n'
    script, pins = book / "scripts" / "gpu_record.sh", book / "requirements.txt"
    edits = [
        ("publish/measuring.py", pkg / "publish" / "measuring.py", "\n" + blocking),
        ("scripts/gpu_record.sh", script, "export CUDA_LAUNCH_BLOCKING=1\n"),
        ("code/sitecustomize.py", book / "code" / "sitecustomize.py", blocking),
        ("requirements.txt", pins, None),
    ]
    for named, path, added in edits:
        for chapter in ("ch_a", "ch_b"):
            assert recordings.status(book, chapter, accept_cpu=True, package_dir=pkg).fresh
        kept = path.read_bytes() if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(kept.decode().replace("triton>=3.6,<3.7", "triton>=3.6,<3.8")
                        if added is None else (kept or b"").decode() + added)
        for chapter in ("ch_a", "ch_b"):
            st = recordings.status(book, chapter, accept_cpu=True, package_dir=pkg)
            assert st.state == "stale", (named, chapter)
            assert f"the recorder's set-up changed ({named})" in st.message
        if kept is None:
            path.unlink()
        else:
            path.write_bytes(kept)


def test_a_module_hashes_as_parsed_without_docstrings_or_comments():
    code = 'def f(x):\n    return x + 1\n'
    documented = ('"""A module."""\n# why\ndef f(x):\n    """Add one."""\n'
                  '    return x + 1  # one\n\n')
    assert parsed.source_hash(code) == parsed.source_hash(documented)
    assert parsed.source_hash(code) != parsed.source_hash(code.replace("1", "2"))
    assert parsed.source_hash(code) != parsed.source_hash(code.replace("x +", "-x +"))
    assert parsed.source_hash("x = (") != parsed.source_hash("x = [")  # no parse


# --- nothing is lost ---------------------------------------------------------------------

def no_scratch_files(root: Path) -> bool:
    return not list((root / "book" / "_recorded").glob(".*.tmp"))


@pytest.mark.slow
def test_failing_cell_keeps_the_previous_recording(book, capsys):
    rec = book / "book" / "_recorded" / "ch_b.ipynb"
    before = rec.read_bytes()
    path = chapter_file(book, "ch_b")
    path.write_text(path.read_text() + FAILING_CELL)
    assert record.main(["--root", str(book), "--allow-cpu", "ch_b"]) == 1
    out = capsys.readouterr().out
    assert "ratio = 1 / 0" in out and "ZeroDivisionError" in out  # the cell, its traceback
    assert "failed: ZeroDivisionError" in out  # the summary
    assert rec.read_bytes() == before
    assert no_scratch_files(book)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["interrupt", "terminate", "kill"])
def test_interrupt_or_kill_keeps_the_previous_recording(book, tmp_path, sig, capsys):
    """...and, while the first runs, a second recorder on the book is refused; a kill
    leaves no kernel connection file (it holds the kernel's key) outside the run's scratch
    folder, which the next run removes."""
    before = recorded_files(book)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    path = chapter_file(book, "ch_b")
    pid_file = tmp_path / "kernel.pid"
    path.write_text(path.read_text() + (
        "\n```{code-cell} ipython3\nimport os, pathlib, time\n"
        "pathlib.Path(os.environ['KERNEL_PID_FILE']).write_text(str(os.getpid()))\n"
        "time.sleep(120)\n```\n"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuinfer.publish.record", "--root", str(book), "--allow-cpu",
         "ch_b"],
        env={**os.environ, "KERNEL_PID_FILE": str(pid_file), "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.2)
        assert record.main(["--root", str(book), "--allow-cpu", "ch_a"]) == 2
        assert "another recorder is writing into" in one_error_line(capsys.readouterr().err)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid_file.exists() and pid_file.read_text():  # a killed command leaves its kernel
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    if sig in (signal.SIGINT, signal.SIGTERM):
        assert proc.returncode == 130 and "Interrupted after" in out
        for noise in ("Traceback", "ZMQError", "AssertionError"):
            assert noise not in out, out
        seconds = float(re.search(r"\| ch_b \| interrupted \| ([\d.]+) \|", out).group(1))
        assert seconds > 0
    assert recorded_files(book) == before
    assert no_scratch_files(book)
    outside = [p for p in tmp.rglob("*.json") if not p.relative_to(tmp).parts[0].startswith(
        "gpuinfer-")]
    assert not outside, f"left outside the run's scratch folder: {outside}"
    if sig == signal.SIGKILL:  # the next run removes the killed run's scratch folder
        assert list(tmp.glob("gpuinfer-*"))
        subprocess.run([sys.executable, "-m", "gpuinfer.publish.record", "--root", str(book),
                        "--recover"], env={**os.environ, "TMPDIR": str(tmp)}, check=True,
                       capture_output=True)
        from gpuinfer import env
        assert not [p for p in tmp.glob(f"{env.SCRATCH_PREFIX}*")], list(tmp.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("at", ["staging", "next-chapter"])
def test_sigterm_after_a_chapter_ran_cleans_up_as_ctrl_c_does(book, tmp_path, at):
    """SIGTERM once the kernel is done (nbclient then leaves SIGTERM's default action, a
    plain exit): while the new recording is staged beside the old one, or as the next
    chapter starts. It ends as Ctrl-C does: exit 130, the previous recording byte for
    byte, no staged file and no scratch folder left."""
    before = recorded_files(book)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    hook = {"staging": "store.stage_artifacts", "next-chapter": "record.book.read_chapter"}[at]
    code = (
        "import os, signal, sys\n"
        "from gpuinfer.publish import record, store\n"
        f"real, calls = {hook}, []\n"
        "def hooked(*args):\n"
        "    calls.append(args)\n"
        # the 4th read of a chapter: ch_b's, as it starts (the first two check the cells)
        f"    if len(calls) == {1 if at == 'staging' else 4}:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(*args)\n"
        f"{hook} = hooked\n"
        f"sys.exit(record.main(['--root', {str(book)!r}, '--allow-cpu', 'ch_a', 'ch_b']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp)},
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out
    assert "Interrupted after" in out and "Traceback" not in out, out
    if at == "staging":
        assert recorded_files(book) == before
    else:  # ch_a was recorded whole before it came; ch_b is as it was
        after = recorded_files(book)
        assert {k: v for k, v in after.items() if "ch_b" in k} == \
            {k: v for k, v in before.items() if "ch_b" in k}
        assert recordings.status(book, "ch_a", accept_cpu=True).fresh
    assert no_scratch_files(book)
    assert not list(tmp.glob("gpuinfer-*")), list(tmp.iterdir())


@pytest.mark.slow
def test_a_fault_between_the_two_renames_keeps_the_previous_pair(book, capsys, monkeypatch):
    """A full disk at the rename that puts the new artifacts in place, after the old folder
    went aside: the notebook and its artifacts are the previous run's, byte for byte."""
    from gpuinfer.publish import store

    before = recorded_files(book)
    assert "ch_a/trace.json.gz" in before
    calls, real = [], os.replace

    def replace(*args):
        calls.append(args)
        if len(calls) == 3:  # the journal, the old folder aside, the new folder in
            raise OSError(28, "No space left on device", str(args[1]))
        return real(*args)

    monkeypatch.setattr(store.os, "replace", replace)
    assert record.main(["--root", str(book), "--allow-cpu", "ch_a"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "No space left on device" in out
    assert "the previous recording is kept" in out
    assert recorded_files(book) == before
    assert recordings.status(book, "ch_a", accept_cpu=True).fresh


class FullDisk:
    """A file being written on a full disk: each write raises ENOSPC, without a file name,
    as the system gives it."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.slow
def test_a_full_disk_names_the_path_that_filled(book, capsys, monkeypatch):
    """The disk fills as the new recording is staged: the message names the file whose
    write filled it and the fix; the previous recording stays, byte for byte."""
    from gpuinfer.publish import store

    before = recorded_files(book)
    real = open

    def full_open(file, mode="r", *args, **kwargs):
        f = real(file, mode, *args, **kwargs)
        return f if "r" in mode else FullDisk(f)

    monkeypatch.setattr(store, "open", full_open, raising=False)
    assert record.main(["--root", str(book), "--allow-cpu", "ch_a"]) == 1
    out = capsys.readouterr().out
    staged = book / "book" / "_recorded" / ".ch_a.new.tmp"
    said = re.search(r"\(No space left on device: (\S+); free some space on the disk that "
                     r"holds it, then record again\); the previous recording is kept", out)
    assert said, out
    assert Path(said.group(1)).parent == staged
    assert recorded_files(book) == before and no_scratch_files(book)


@pytest.mark.slow
def test_the_summary_counts_only_the_recordings(book, capsys):
    """A file put beside the recordings (notes, a download) is not counted: the summary
    says what this run wrote and what all the recordings hold."""
    folder = book / "book" / "_recorded"
    (folder / "notes.bin").write_bytes(b"x" * 3_000_000)
    assert record.main(["--root", str(book), "--allow-cpu", "ch_b"]) == 0
    out = capsys.readouterr().out
    sizes = {name: len(data) for name, data in recorded_files(book).items()}
    ch_b = sum(size for name, size in sizes.items() if name.startswith("ch_b"))
    total = sum(size for name, size in sizes.items() if name != "notes.bin")
    assert f"| ch_b | recorded (CPU smoke recording), {ch_b / 1e6:.2f} MB |" in out
    assert (f"This run wrote {ch_b / 1e6:.2f} MB; all recordings together: "
            f"{total / 1e6:.2f} MB\n") in out


def test_an_unfinished_write_reads_as_such_and_recover_finishes_it(book, capsys):
    """As a kill after the journal leaves it: the new notebook staged, the journal written."""
    folder = book / "book" / "_recorded"
    new = json.loads((folder / "ch_b.ipynb").read_text())
    new["metadata"]["gpuinfer"]["date"] = "the new run"
    (folder / ".ch_b.ipynb.new.tmp").write_text(json.dumps(new))
    (folder / ".ch_b.new.tmp").mkdir()
    (folder / ".ch_b.commit").write_text("a recording of ch_b is being written")
    (folder / ".ch_a.ipynb.x1y2.tmp").write_text("a temporary file a kill left")
    st = recordings.status(book, "ch_b", accept_cpu=True)
    assert st.state == "unfinished" and "--recover" in st.message
    assert record.main(["--root", str(book), "--recover"]) == 0
    out = capsys.readouterr().out
    assert "finished writing the recording of ch_b" in out
    assert "removed .ch_a.ipynb.x1y2.tmp" in out
    assert sorted(p.name for p in folder.iterdir()) == ["ch_a", "ch_a.ipynb", "ch_b.ipynb"]
    st = recordings.status(book, "ch_b", accept_cpu=True)
    assert st.fresh and st.provenance["date"] == "the new run"


# --- on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
def test_recording_on_the_gpu_is_fresh_with_its_provenance(tmp_path):
    root = copy_book(tmp_path / "book")
    assert record.main(["--root", str(root)]) == 0  # no --allow-cpu
    st = recordings.status(root, "ch_a")
    assert st.fresh, st.message
    meta = st.provenance
    assert meta["smoke"] is False and meta["gpu"] == torch.cuda.get_device_name()
    assert meta["driver"] and meta["cuda"] == torch.version.cuda
    print(f"recorded the fixture on {meta['gpu']} (driver {meta['driver']}, CUDA "
          f"{meta['cuda']}, torch {meta['torch']}) in {meta['seconds']} s")


def test_a_dead_kernels_log_keeps_its_python_stack():
    from gpuinfer.publish.measuring import dying_words

    log = ("start-up warning\n" * 500 + "Fatal Python error: Aborted\n\nThread 0x1 "
           "(most recent call first):\n  File \"cell\", line 9 in <module>\n\n"
           "Extension modules: numpy, " + "scipy.x, " * 2000 + "(total: 181)\n")
    said = dying_words(log)
    assert said.startswith("Fatal Python error: Aborted") and 'line 9 in <module>' in said
    assert "Extension modules" not in said and "start-up" not in said
    assert dying_words("no fatal error\n" * 1000) == ("no fatal error\n" * 1000)[-4000:]


def test_a_presentation_cell_that_touches_the_gpu_is_refused_before_running(capsys,
                                                                            tmp_path):
    root = copy_book(tmp_path / "book")
    path = chapter_file(root, "ch_a")
    path.write_text(path.read_text().replace("fig, ax = plt.subplots(figsize=(4, 2.5))",
                                             "torch.cuda.synchronize()\nfig, ax = "
                                             "plt.subplots(figsize=(4, 2.5))"))
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: book/ch_a.md: presentation cell 4 uses "
                          "torch.cuda.synchronize") and "\n" not in err, err
    assert not (root / "book" / "_recorded").exists()
