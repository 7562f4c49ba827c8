"""scripts/gpu_record.sh, run on this CPU machine against a copy of the fixture book (the
script is copied beside it, as it sits in the repository): OUT is checked before anything
else and taken from the caller's folder; what it brings back is whole.

The recording itself needs --allow-cpu here (ALLOW_CPU=1); the GPU tests are skipped
(GPU_TESTS=0).
"""

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpuinfer.publish import recordings

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "book"
SCRIPT = ROOT / "scripts" / "gpu_record.sh"


@pytest.fixture
def repo(tmp_path) -> Path:
    """The fixture book laid out as the repository: scripts/gpu_record.sh at its root."""
    root = Path(shutil.copytree(FIXTURE, tmp_path / "repo",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    (root / "scripts").mkdir()
    shutil.copy(SCRIPT, root / "scripts" / "gpu_record.sh")
    return root


def run(repo: Path, cwd: Path, out: str | None, *chapters: str, **env):
    environ = {k: v for k, v in os.environ.items() if k != "OUT"}
    environ.update({"GPU_TESTS": "0", "ALLOW_CPU": "1", **env})
    if out is not None:
        environ["OUT"] = out
    return subprocess.run(["bash", str(repo / "scripts" / "gpu_record.sh"), *chapters],
                          cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("out, said", [
    (None, "set OUT to the folder whose files come back"),
    ("{file}/sub", "is not a folder that can be made here"),
    ("{repo}/book/_recorded", "is inside the book"),
])
def test_a_bad_out_stops_it_before_anything_runs(repo, tmp_path, out, said):
    (tmp_path / "a_file").write_text("not a folder")
    out = None if out is None else out.format(file=tmp_path / "a_file", repo=repo)
    proc = run(repo, tmp_path, out, "ch_b")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
    assert proc.stdout == ""  # nothing installed, nothing recorded
    assert not (repo / "book" / "_recorded").exists()


def test_no_gpu_is_said_first_in_one_line(repo, tmp_path):
    """Without ALLOW_CPU, on a machine where no CUDA GPU is visible (made so on any
    machine: CUDA_VISIBLE_DEVICES empty): one line saying so and what to do, exit 2,
    before OUT is made, anything is installed or a chapter is read."""
    out = tmp_path / "out"
    proc = run(repo, tmp_path, str(out), "ch_b", ALLOW_CPU="0", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA GPU is visible"), lines
    assert "run this on the GPU machine" in lines[0] and "ALLOW_CPU=1" in lines[0]
    assert proc.stdout == ""  # nothing installed, nothing recorded
    assert not out.exists() and not (repo / "book" / "_recorded").exists()


def test_an_unknown_chapter_is_one_line(repo, tmp_path):
    proc = run(repo, tmp_path, str(tmp_path / "out"), "nope")
    assert proc.returncode == 2
    assert "error: unknown chapter 'nope'. The chapters are: ch_a, ch_b" in proc.stderr
    assert not (repo / "book" / "_recorded").exists()


@pytest.mark.slow
def test_a_relative_out_is_the_callers_and_brings_back_the_whole_recording(repo, tmp_path):
    caller = tmp_path / "caller"
    caller.mkdir()
    proc = run(repo, caller, "results", "ch_a")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = caller / "results"
    assert sorted(p.name for p in out.iterdir()) == ["ch_a.tgz", "record.log"]
    assert not (repo / "results").exists()
    assert "[ch_a] recorded in" in (out / "record.log").read_text()
    with tarfile.open(out / "ch_a.tgz") as tgz:
        names = sorted(tgz.getnames())
    assert names == ["book/_recorded/ch_a", "book/_recorded/ch_a.ipynb",
                     "book/_recorded/ch_a/data.json", "book/_recorded/ch_a/trace.json.gz"]
    # unpacked where the README says, into a clone whose folder holds an older artifact
    clone = Path(shutil.copytree(FIXTURE, tmp_path / "clone",
                                 ignore=shutil.ignore_patterns("_build", "_recorded")))
    (clone / "scripts").mkdir()  # the clone's recorder is the one that recorded it
    shutil.copy(SCRIPT, clone / "scripts" / "gpu_record.sh")
    (clone / "book" / "_recorded" / "ch_a").mkdir(parents=True)
    (clone / "book" / "_recorded" / "ch_a" / "old.json.gz").write_bytes(b"older")
    subprocess.run(f"rm -rf book/_recorded/ch_a && tar xzf {out / 'ch_a.tgz'}", shell=True,
                   cwd=clone, check=True)
    assert recordings.status(clone, "ch_a", accept_cpu=True).fresh
