"""Which chapters each past commit staled (scripts/blast.py), on a small history made
for the test: a two-chapter book over a three-module package, one change per commit."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import blast  # noqa: E402  (scripts/blast.py: a history tool, not part of the package)

FRONT = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# {title}

```{{code-cell}} ipython3
{code}
```
"""
PRESENTATION = ("\n```{code-cell} ipython3\n:tags: [presentation]\n\n"
                "print(len(str(y)))\n```\n")
TOC = "format: jb-book\nroot: book/intro\nchapters:\n- file: book/one\n- file: book/two\n"
ONE = "from gpuinfer.a import f\n\ny = f(1)  # one more"
TWO = "from gpuinfer.b import g\n\nprint(g())"
A = "def f(x):\n    return x + 1\n"
B = "from gpuinfer import a\n\n\ndef g():\n    return 2\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """The repository, and its commits by name; the replay starts after 'start'."""
    repo = tmp_path_factory.mktemp("history")
    git(repo, "init", "-q")
    git(repo, "config", "user.name", "test")
    git(repo, "config", "user.email", "test@example.com")
    made = {"start": commit(repo, {
        "_toc.yml": TOC, "book/intro.md": "# The book\n",
        "book/one.md": FRONT.format(title="One", code=ONE),
        "book/two.md": FRONT.format(title="Two", code=TWO),
        "code/gpuinfer/__init__.py": '"""The package."""\n',
        "code/gpuinfer/a.py": A, "code/gpuinfer/b.py": B}, "start")}
    one, two = (FRONT.format(title=t, code=c) for t, c in (("One", ONE), ("Two", TWO)))
    steps = [
        ("unreached", {"code/gpuinfer/a.py": A + "\n\ndef spare():\n    return 0\n"}),
        ("reached", {"code/gpuinfer/a.py": A.replace("x + 1", "x + 2")}),
        ("comment", {"book/one.md": one.replace("one more", "plus one")}),
        ("cell", {"book/two.md": two.replace("g()", "g() + 1")}),
        ("presentation", {"book/one.md": one.replace("one more", "plus one")
                          + PRESENTATION}),
        ("new chapter", {"_toc.yml": TOC + "- file: book/three\n",
                         "book/three.md": FRONT.format(title="Three", code=TWO)}),
    ]
    for name, files in steps:
        made[name] = commit(repo, files, f"{name}: a change")
    return repo, made


def test_each_commit_under_both_rules(history):
    repo, made = history
    found = blast.blast(repo, made["start"], "HEAD")
    by_name = {c.subject.split(":")[0]: c for c in found.commits}
    assert list(by_name) == ["unreached", "reached", "comment", "cell", "presentation",
                             "new chapter"]
    expected = {  # name: (today's rule, the per-module rule)
        "unreached": ({}, {"one": ("modules",), "two": ("modules",)}),
        "reached": ({"one": ("definitions",)}, {"one": ("modules",), "two": ("modules",)}),
        "comment": ({}, {"one": ("cells",)}),
        "cell": ({"two": ("cells",)}, {"two": ("cells",)}),
        "presentation": ({}, {"one": ("cells",)}),
        "new chapter": ({}, {}),  # three is new: recorded, not staled
    }
    assert {name: (c.new, c.old) for name, c in by_name.items()} == expected
    assert by_name["reached"].units == {"one": ["a.py::f changed"]}
    assert found.totals == (2, 7, 1, 4)


def test_main_prints_a_line_per_commit_and_the_totals(history, capsys):
    repo, made = history
    assert blast.main([made["start"], made["cell"], "--repo", str(repo), "--units"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(made["unreached"][:7] + " unreached: a change")
    assert lines[0].endswith("  -")
    assert lines[1].endswith("  one (definitions)")
    assert lines[2].strip() == "one: a.py::f changed"
    assert lines[-2].endswith("  two (cells)")
    assert lines[-1] == "total 2 of 6; by definitions 1 of 4"


def test_the_package_is_read_from_git_objects(history):
    repo, made = history
    git_repo = blast.Git(repo)
    try:
        sources = blast.GitSources(git_repo, made["reached"])
        assert sources.files() == ["__init__.py", "a.py", "b.py"]
        assert "x + 2" in sources.read("a.py") and sources.read("c.py") is None
        assert blast.chapter_paths(git_repo, made["new chapter"]) == {
            "one": "book/one.md", "two": "book/two.md", "three": "book/three.md"}
    finally:
        git_repo.close()


def test_the_old_rule_follows_imports_between_modules(history):
    repo, made = history
    git_repo = blast.Git(repo)
    try:
        modules = blast.imported_modules([TWO], blast.GitSources(git_repo, made["start"]))
    finally:
        git_repo.close()
    assert list(modules) == ["__init__.py", "a.py", "b.py"]  # b imports a


@pytest.mark.parametrize("args, says", [
    (["HEAD~1", "HEAD", "--repo", "{tmp}"], "is not a git repository"),
    (["nosuchcommit", "HEAD", "--repo", "{repo}"], "unknown commit 'nosuchcommit'"),
])
def test_errors_are_one_line_and_exit_2(history, tmp_path, capsys, args, says):
    repo, _ = history
    args = [a.format(tmp=tmp_path, repo=repo) for a in args]
    assert blast.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
