"""Which chapter recordings each past commit staled, under today's rule and the old one.

`python scripts/blast.py FROM TO [--repo PATH] [--units]` replays the first-parent
commits after FROM up to TO and compares each chapter with the parent commit under two
rules:

- today's (gpuinfer.publish.reach): a chapter is staled by its `cells` (its measurement
  cells, as parsed, differ) and/or by its `definitions` (the package definitions those
  cells and its literalincludes reach differ);
- the older per-module one: by its code cells as written and/or by its `modules` (every
  package module its cells import, followed through the imports between modules, each
  hashed as parsed).

A chapter is a `file:` of the commit's `_toc.yml` that is a MyST notebook; one the parent
did not have is new, not staled. Files are read from git objects (`git ls-tree`, `git
cat-file`), never checked out, so the working tree is left as it is. The last line,
`total N of M; by definitions n of m`, counts the recordings staled under today's rule (N)
and the per-module one (M), and the part of each caused by package code rather than by the
chapter's own cells (n, m): the blast radius of a change to the package.

A tool for looking back at the project's history, not part of the book's package: it runs
with the package importable (installed, or `PYTHONPATH=code`).
"""

from __future__ import annotations

import argparse
import posixpath
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuinfer.publish import reach
from gpuinfer.publish.parsed import source_hash
from gpuinfer.publish.units import ROOT, analyse, dotted_name

PACKAGE = f"code/{ROOT}/"  # where the package lies in the repository


class BlastError(ValueError):
    """A repository or a commit that cannot be read; the message is one line."""


# --- reading git objects ------------------------------------------------------------------

class Git:
    """One repository's commits and blobs, read through git, each blob once."""

    def __init__(self, repo: Path | str):
        self.repo = str(repo)
        if self._git("rev-parse", "--git-dir", check=False) is None:
            raise BlastError(f"{self.repo} is not a git repository")
        self._trees: dict[str, dict[str, str]] = {}
        self._blobs: dict[str, str] = {}
        self._cat: subprocess.Popen | None = None

    def _git(self, *args: str, check: bool = True) -> str | None:
        done = subprocess.run(["git", "-C", self.repo, *args], capture_output=True,
                              text=True, encoding="utf8", errors="replace")
        if done.returncode:
            if check:
                raise BlastError(f"git {' '.join(args)}: {done.stderr.strip()}")
            return None
        return done.stdout

    def commit(self, name: str) -> str:
        found = self._git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}",
                          check=False)
        if not found:
            raise BlastError(f"unknown commit {name!r} in {self.repo}")
        return found.strip()

    def first_parents(self, start: str, end: str) -> list[tuple[str, str, str]]:
        """(commit, its first parent or '', subject) after start up to end, oldest first."""
        out = self._git("log", "--first-parent", "--reverse", "--format=%H %P%x00%s",
                        f"{start}..{end}")
        found = []
        for line in out.splitlines():
            ids, _, subject = line.partition("\0")
            commit, *parents = ids.split()
            found.append((commit, parents[0] if parents else "", subject))
        return found

    def tree(self, commit: str) -> dict[str, str]:
        """{path: blob id} of every file of the commit."""
        if commit not in self._trees:
            out = self._git("ls-tree", "-r", "-z", "--full-tree", commit)
            entries = (e.split("\t", 1) for e in out.split("\0") if e)
            self._trees[commit] = {path: head.split()[2] for head, path in entries
                                   if head.split()[1] == "blob"}
        return self._trees[commit]

    def blob(self, oid: str) -> str:
        """A blob's text, through one long-lived `git cat-file --batch`."""
        if oid not in self._blobs:
            if self._cat is None:
                self._cat = subprocess.Popen(
                    ["git", "-C", self.repo, "cat-file", "--batch"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._cat.stdin.write(oid.encode() + b"\n")
            self._cat.stdin.flush()
            size = int(self._cat.stdout.readline().split()[2])
            data = self._cat.stdout.read(size + 1)[:-1]
            self._blobs[oid] = data.decode("utf8", errors="replace")
        return self._blobs[oid]

    def text(self, commit: str, path: str) -> str | None:
        oid = self.tree(commit).get(path)
        return None if oid is None else self.blob(oid)

    def close(self) -> None:
        if self._cat is not None:
            self._cat.stdin.close()
            self._cat.wait()
            self._cat = None


class GitSources:
    """The package of one commit, as gpuinfer.publish.reach reads it."""

    def __init__(self, git: Git, commit: str):
        self.git = git
        tree = git.tree(commit)
        self.oids = {path[len(PACKAGE):]: oid for path, oid in tree.items()
                     if path.startswith(PACKAGE) and path.endswith(".py")}

    def read(self, relpath: str) -> str | None:
        oid = self.oids.get(relpath)
        return None if oid is None else self.git.blob(oid)

    def files(self) -> list[str]:
        return sorted(self.oids)


# --- the old per-module rule --------------------------------------------------------------

def imported_modules(cell_sources: list[str], sources: reach.Sources) -> dict[str, str]:
    """{module: source_hash} of every package module the cells import, followed through the
    imports between modules (wherever they stand), with the `__init__.py` of every package
    on the way: the per-module rule, read through `sources`."""
    relpaths = {dotted_name(rel): rel for rel in sources.files()}
    todo = [name for source in cell_sources for name in reach.cell_code(source).imported]
    todo.append(ROOT)
    found: dict[str, str] = {}
    while todo:
        parts = todo.pop().split(".")
        for n in range(1, len(parts) + 1):  # the packages above it are imported first
            name = ".".join(parts[:n])
            rel = relpaths.get(name)
            if rel is None or rel in found:
                continue
            text = sources.read(rel) or ""
            found[rel] = source_hash(text)
            module = analyse(text, name, rel.endswith("__init__.py"))
            for code in [module.statements[1]] + [c for _, c in module.units.values()]:
                todo += code.imported
    return dict(sorted(found.items()))


# --- one chapter at one commit ------------------------------------------------------------

@dataclass(frozen=True)
class Chapter:
    """What both rules compare of a chapter at one commit."""

    code: tuple[str, ...]  # every code cell as written (the old rule)
    modules: dict[str, str]  # the old rule's imported modules
    cells: tuple[str, ...]  # measurement cells, as parsed (today's rule)
    definitions: dict[str, str]  # what they reach (today's rule)


def _front_matter_says_notebook(text: str) -> bool:
    """Whether a page's YAML front matter makes it a MyST notebook (as in
    gpuinfer.publish.book.is_myst_notebook)."""
    import yaml

    if not text.startswith("---"):
        return False
    head, closed, _ = text[3:].partition("\n---")
    try:
        meta = yaml.safe_load(head) if closed else None
    except yaml.YAMLError:
        return False
    if not isinstance(meta, dict):
        return False
    jupytext = meta.get("jupytext") if isinstance(meta.get("jupytext"), dict) else {}
    shown = jupytext.get("text_representation")
    return (isinstance(shown, dict) and shown.get("format_name") == "myst") or \
        meta.get("file_format") == "mystnb"


def chapter_paths(git: Git, commit: str) -> dict[str, str]:
    """{stem: path} of the commit's chapters: its TOC's files that are MyST notebooks."""
    import yaml

    from gpuinfer.publish.book import toc_entries

    toc = git.text(commit, "_toc.yml")
    try:
        entries = toc_entries(yaml.safe_load(toc)) if toc else []
    except yaml.YAMLError:
        return {}
    found = {}
    for entry in entries:
        path = posixpath.normpath(entry if entry.endswith(".md") else entry + ".md")
        text = git.text(commit, path)
        if text is not None and _front_matter_says_notebook(text):
            found.setdefault(posixpath.splitext(posixpath.basename(path))[0], path)
    return found


class Chapters:
    """Each chapter at each commit, computed once (a commit is a child, then a parent)."""

    def __init__(self, git: Git):
        self.git = git
        self._notebooks: dict[str, tuple] = {}
        self._found: dict[tuple[str, str], Chapter] = {}

    def _cells(self, text: str) -> tuple:
        """(every code cell, the measurement cells) of a chapter's text."""
        if text not in self._notebooks:
            import jupytext

            from gpuinfer.publish.cells import is_presentation

            code = [c for c in jupytext.reads(text, fmt="md:myst").cells
                    if c.cell_type == "code"]
            self._notebooks[text] = (tuple(c.source for c in code),
                                     [c.source for c in code if not is_presentation(c)])
        return self._notebooks[text]

    def at(self, commit: str, path: str) -> Chapter:
        if (commit, path) not in self._found:
            text = self.git.text(commit, path)
            code, measured = self._cells(text)
            sources = GitSources(self.git, commit)
            shown = reach.shown(text, posixpath.dirname(path))
            self._found[commit, path] = Chapter(
                code, imported_modules(list(code), sources),
                tuple(reach.cells_hashes(measured)),
                reach.definitions(measured, shown, sources))
        return self._found[commit, path]


# --- the replay ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Staled:
    """One commit: the chapters it staled under each rule, and why."""

    commit: str
    subject: str
    new: dict[str, tuple[str, ...]]  # chapter -> ('cells', 'definitions'), today's rule
    old: dict[str, tuple[str, ...]]  # chapter -> ('cells', 'modules'), the per-module one
    units: dict[str, list[str]] = field(default_factory=dict)  # chapter -> units changed


@dataclass
class Blast:
    commits: list[Staled]

    def _count(self, rule: str, package: str) -> tuple[int, int]:
        staled = [why for c in self.commits for why in getattr(c, rule).values()]
        return len(staled), sum("cells" not in why and package in why for why in staled)

    @property
    def totals(self) -> tuple[int, int, int, int]:
        """(N, M, n, m): recordings staled under today's rule and the per-module one, and
        of each those staled by package code, not by the chapter's own cells."""
        (new, new_code), (old, old_code) = (self._count("new", "definitions"),
                                            self._count("old", "modules"))
        return new, old, new_code, old_code


def _reasons(pairs) -> tuple[str, ...]:
    return tuple(label for label, differ in pairs if differ)


def blast(repo: Path | str, start: str, end: str) -> Blast:
    """Replay the first-parent commits after `start` up to `end` in `repo`."""
    git = Git(repo)
    try:
        git.commit(start), git.commit(end)
        chapters = Chapters(git)
        found = []
        for commit, parent, subject in git.first_parents(start, end):
            new, old, units = {}, {}, {}
            before = chapter_paths(git, parent) if parent else {}
            for stem, path in chapter_paths(git, commit).items():
                if before.get(stem) is None:
                    continue  # a new chapter: recorded for the first time, not staled
                a, b = chapters.at(parent, before[stem]), chapters.at(commit, path)
                why_new = _reasons([("cells", a.cells != b.cells),
                                    ("definitions", a.definitions != b.definitions)])
                why_old = _reasons([("cells", a.code != b.code),
                                    ("modules", a.modules != b.modules)])
                if why_new:
                    new[stem] = why_new
                if why_old:
                    old[stem] = why_old
                if "definitions" in why_new:
                    units[stem] = reach.changed(a.definitions, b.definitions)
            found.append(Staled(commit, subject, new, old, units))
        return Blast(found)
    finally:
        git.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/blast.py",
        description="Which chapter recordings each first-parent commit after FROM up to "
                    "TO staled, under today's rule and the per-module one.")
    parser.add_argument("start", metavar="FROM")
    parser.add_argument("end", metavar="TO")
    parser.add_argument("--repo", default=".", help="the repository (default: here)")
    parser.add_argument("--units", action="store_true",
                        help="under each commit, the units that staled each chapter")
    args = parser.parse_args(argv)
    try:
        result = blast(args.repo, args.start, args.end)
    except BlastError as exc:
        print(f"blast: {exc}", file=sys.stderr)
        return 2
    for staled in result.commits:
        said = ", ".join(f"{stem} ({', '.join(why)})" for stem, why in staled.new.items())
        subject = staled.subject if len(staled.subject) <= 48 else staled.subject[:47] + "…"
        print(f"{staled.commit[:7]} {subject:<48}  {said or '-'}")
        for stem, units in staled.units.items() if args.units else ():
            print(f"          {stem}: {'; '.join(units)}")
    new, old, new_code, old_code = result.totals
    print(f"total {new} of {old}; by definitions {new_code} of {old_code}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
