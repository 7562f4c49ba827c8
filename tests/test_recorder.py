"""How the cells run is part of every recording (gpuinfer.publish.recorder): a change to the
recorder's set-up (the code that starts the kernel, gpu_record.sh, a start-up hook, a
requirement pin) stales every chapter of the book, named as the recorder's; a comment
does not. On a copy of the repository's files, for the book's six chapters."""

import shutil
from pathlib import Path

import pytest

from gpuinfer.publish import book, hashes, recorder, recordings

ROOT = Path(__file__).resolve().parent.parent
BLOCKING = 'os.environ["CUDA_LAUNCH_BLOCKING"] = "1"\n'


@pytest.fixture
def repo(tmp_path):
    """(root, package) copies of what the recorder's hashes read."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "requirements.txt", root / "requirements.txt")
    shutil.copy(ROOT / "scripts" / "gpu_record.sh", root / "scripts" / "gpu_record.sh")
    package = Path(shutil.copytree(hashes.PACKAGE_DIR, root / "code" / "gpuinfer",
                                   ignore=shutil.ignore_patterns("__pycache__", "*.tar.gz")))
    return root, package


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf8") + text, encoding="utf8")


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf8")


EDITS = {
    "publish/measuring.py": lambda root, pkg: _append(
        pkg / "publish" / "measuring.py", "\n" + BLOCKING),
    "publish/kept.py": lambda root, pkg: _append(pkg / "publish" / "kept.py",
                                                 "\nimport os\n" + BLOCKING),
    "scripts/gpu_record.sh": lambda root, pkg: _replace(
        root / "scripts" / "gpu_record.sh", "export PYTHONUNBUFFERED=1\n",
        "export PYTHONUNBUFFERED=1\nexport CUDA_LAUNCH_BLOCKING=1\n"),
    "code/sitecustomize.py": lambda root, pkg: (root / "code" / "sitecustomize.py")
    .write_text("import os\n" + BLOCKING),
    "usercustomize.py": lambda root, pkg: (root / "usercustomize.py")
    .write_text("import os\n" + BLOCKING),
    "requirements.txt": lambda root, pkg: _replace(
        root / "requirements.txt", "triton>=3.6,<3.7", "triton>=3.6,<3.8"),
}


def _chapters():
    return {stem: book.read_chapter(path) for stem, path in book.chapters(ROOT).items()}


@pytest.mark.parametrize("named", EDITS)
def test_a_change_to_the_recorders_set_up_stales_every_chapter(repo, named):
    root, package = repo
    chapters = _chapters()
    assert len(chapters) == 6
    before = {stem: hashes.current_hashes(nb, root, package) for stem, nb in chapters.items()}
    EDITS[named](root, package)
    for stem, nb in chapters.items():
        now = hashes.current_hashes(nb, root, package)
        assert now["definitions"] == before[stem]["definitions"]  # only the recorder moved
        why = recordings.changed(nb, nb, before[stem], now)
        assert why == f"the recorder's set-up changed ({named})", (stem, why)


@pytest.mark.parametrize("edit", [
    lambda root, pkg: _replace(root / "requirements.txt", "triton>=3.6,<3.7",
                               "triton>=3.6,<3.7   # a comment"),
    lambda root, pkg: _append(root / "requirements.txt", "\n# a comment\n\n"),
    lambda root, pkg: _append(pkg / "publish" / "measuring.py", "\n# a comment\n"),
])
def test_comments_in_the_recorders_set_up_stale_nothing(repo, edit):
    root, package = repo
    nb = _chapters()["01_roofline"]
    before = hashes.current_hashes(nb, root, package)
    edit(root, package)
    assert hashes.current_hashes(nb, root, package) == before


def test_a_recording_without_the_recorders_hashes_is_stale():
    why = recorder.recorder_changed(None, recorder.recorder_hashes(ROOT))
    assert why.startswith("the recorder's set-up") and "was not hashed" in why


def test_the_pins_are_the_requirement_lines():
    text = "# head\ntorch>=2.11,<2.14\n\ntriton>=3.6,<3.7  # Chapter 5\n-e .\n"
    assert recorder.pins(text) == "torch>=2.11,<2.14\ntriton>=3.6,<3.7\n-e ."
