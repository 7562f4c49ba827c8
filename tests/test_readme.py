"""The README says what the tree holds: it leads with the two commands (and CI runs the
second exactly), its layout table names paths that exist, and its module table names
every module of the package."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "code" / "gpuinfer"


def readme() -> str:
    """Read by each test, not at collection: a copy of the tests without the README (as
    test_recordings makes) still collects."""
    return (ROOT / "README.md").read_text(encoding="utf8")


def table(heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after the line `heading`, as cells."""
    text = readme()
    after = text[text.index(heading + "\n"):]
    rows = re.search(r"^\|.*\|\n\|[-| ]+\|\n((?:\|.*\|\n)+)", after, re.M).group(1)
    return [[cell.strip() for cell in row.strip("|").split(" | ")]
            for row in rows.splitlines()]


def test_the_readme_leads_with_the_two_commands_and_ci_runs_the_second():
    first_block = re.search(r"```bash\n(.*?)```", readme(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["bash scripts/build", "bash scripts/test"]
    for command in commands:
        assert (ROOT / command.split()[1]).is_file(), command
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#")]
    assert ci[-1] == "exec bash scripts/test"


def test_the_layout_table_names_paths_that_exist():
    rows = table("## Layout")
    paths = [p for row in rows for p in re.findall(r"`([^`]+)`", row[0])]
    assert paths, "no paths in the layout table"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"the README's layout table names paths that do not exist: {missing}"


def test_the_module_table_names_every_module():
    rows = table("The package, one idea per module:")
    names = {n for row in rows for n in re.findall(r"`([\w.*]+)`", row[0])}
    said = " ".join(" | ".join(row) for row in rows)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            continue
        dotted = ".".join(parts)
        # a row `kernels.*` names each module of kernels/ in backticks
        grouped = ".".join(parts[:-1]) + ".*" in names and f"`{parts[-1]}`" in said
        if dotted not in names and not grouped:
            missing.append(dotted)
    assert not missing, f"the README's module table leaves out: {', '.join(missing)}"
    modules = {".".join(p.relative_to(PACKAGE).with_suffix("").parts)
               for p in PACKAGE.rglob("*.py")}
    packages = {".".join(p.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("*")
                if p.is_dir() and (p / "__init__.py").exists()}
    named = {n for n in names if not n.endswith(".*")}
    gone = sorted(n for n in named if n not in modules and n not in packages)
    assert not gone, f"the README's module table names modules that do not exist: {gone}"
