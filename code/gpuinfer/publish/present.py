"""Running a chapter's presentation cells from its recording, as every build does.

A recording holds the outputs of the chapter's measurement cells and, in `data.json`, the
values its presentation cells read (gpuinfer.publish.kept). `present` runs the presentation
cells of a notebook, in order, in a fresh kernel on this machine's CPU: before the first
presentation cell after measurement cell m, it restores what the recording kept there,
then runs the cells as written today. Their outputs (figures, tables, glued values) go into
the notebook in place, beside the recorded outputs of the measurement cells.

Every page also glues `peak_gpu_gib` (PEAK_NAME): the peak GPU memory in use, all the
chapter's processes together, while it was recorded (the record command's
gpuinfer.publish.gpumem, in the recording's provenance), in GiB; NaN where the chapter was
not recorded on a GPU (a smoke run). Its output goes with the outputs of the page's last
code cell, as a cell that ran `glue(PEAK_NAME, value, display=False)` would leave it: a
cell of its own would change the notebook's cache key (its code cells), which must stay
the chapter's. (A chapter that myst-nb executes as a preview glues it through
gpuinfer.publish.sphinx_recordings.PREVIEW_CELL.)

A presentation cell cannot touch the GPU or time anything: the rules of
gpuinfer.publish.cells are checked before anything runs, and the kernel sees no CUDA device
(CUDA_VISIBLE_DEVICES is empty), so what slips past the check fails there, naming the cell.
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

from gpuinfer.publish import cells as cellkinds
from gpuinfer.publish.kept import DATA_FILE, read
from gpuinfer.publish.reach import cells_hashes
from gpuinfer.publish.validation import METADATA_KEY

CELL_TIMEOUT_S = 300
PEAK_NAME = "peak_gpu_gib"  # glued on every chapter's page: its recording's peak GPU memory
GLUE_PREFIX = "application/papermill.record/"  # myst_nb.glue(..., display=False)
NUMBER_KEY = "gpuinfer_cell"  # the chapter's code-cell number, on each cell that runs


class PresentationError(RuntimeError):
    """A presentation cell broke a rule or failed; the message is one line naming it."""


def _restore_source(after: int, data_path: Path) -> str:
    return (f"__import__('gpuinfer.publish.kept', fromlist=['restore']).restore("
            f"{after}, globals(), {str(data_path)!r})")


def renumbered(kept: dict[int, dict], recorded, nb) -> dict[int, dict]:
    """`kept`, keyed by the code-cell numbers its measurement cells had in `recorded` (the
    notebook it was recorded with), keyed by the numbers the same cells have in `nb`.

    Code cells are numbered together, so a presentation cell added or removed since the
    recording renumbers the measurement cells after it, though they and their order are
    unchanged. With a different number of measurement cells (a stale recording) `kept` is
    returned as it is."""
    if recorded is None:
        return kept
    then = [n for n, _ in cellkinds.measurement_cells(recorded)]
    now = [n for n, _ in cellkinds.measurement_cells(nb)]
    if len(then) != len(now):
        return kept
    number = {0: 0, **dict(zip(then, now))}  # 0: before any measurement cell
    return {number.get(after, after): values for after, values in kept.items()}


def plan(nb, data_path: Path, recorded=None) -> list[tuple[int | None, object]]:
    """What the kernel runs, in order: (None, the restore of measurement cell m's kept
    values) before the first presentation cell after it, then (index in nb.cells, cell).
    `recorded`: the notebook the values were kept from, where its code cells may be
    numbered otherwise (renumbered)."""
    import nbformat

    analysed = iter(cellkinds.code_cells(nb))
    as_recorded = read(data_path) if data_path.is_file() else {}
    kept = renumbered(as_recorded, recorded, nb)
    # {number now: number when recorded}: restore() reads data.json by the latter
    recorded_number = renumbered({m: m for m in as_recorded}, recorded, nb)
    steps, after, restored = [], 0, set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        info = next(analysed)
        if not info.presentation:
            after = info.number
            continue
        if after not in restored and after in kept:
            restored.add(after)
            step = nbformat.v4.new_code_cell(
                _restore_source(recorded_number.get(after, after), data_path))
            step.metadata[NUMBER_KEY] = -after  # negative: a restore, not a cell
            steps.append((None, step))
        run = copy.deepcopy(cell)
        run.metadata[NUMBER_KEY] = info.number
        steps.append((index, run))
    return steps


def missing(nb, data_path: Path, recorded=None) -> list[str]:
    """What the presentation cells read that the recording did not keep, a line each
    (`recorded`: as for plan)."""
    kept = renumbered(read(data_path) if data_path.is_file() else {}, recorded, nb)
    said = []
    numbers = {c.number: c for c in cellkinds.code_cells(nb)}
    for after, names in cellkinds.kept_names(list(numbers.values())).items():
        absent = [n for n in names if n not in kept.get(after, {})]
        if absent and data_path.is_file() and after in kept:
            # kept there, but not these names: either a live NameError (the name was
            # unbound when recorded) or a presentation cell reading something new
            readers = [str(c) for c in numbers.values()
                       if c.presentation and set(c.reads) & set(absent)]
            said.append(f"{', '.join(readers)} read{'s' if len(readers) == 1 else ''} "
                        f"{', '.join(absent)}, which the recording did not keep after "
                        f"measurement cell {after}")
        elif absent:
            said.append(f"the presentation cells after measurement cell {after} read "
                        f"{', '.join(absent)}, and the recording's {DATA_FILE} keeps "
                        "nothing there")
    return said


def peak_gib(meta: dict) -> float:
    """The recording's peak GPU memory (GiB) as the page glues it: a plain float, NaN
    where there is none (a smoke run, a run without nvidia-smi, a recording before it)."""
    peak = meta.get("peak_gpu_memory_gib")
    if meta.get("smoke") or isinstance(peak, bool) or not isinstance(peak, (int, float)):
        return float("nan")
    return float(peak)


def glue_output(name: str, value: float):
    """The output `myst_nb.glue(name, value, display=False)` leaves for a float: its repr
    as text/plain, under the glue's prefix, named in the scrapbook metadata."""
    import nbformat

    return nbformat.v4.new_output(
        "display_data", data={GLUE_PREFIX + "text/plain": repr(float(value))},
        metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})


def glue_peak(nb, peak: float) -> None:
    """Add the glue of PEAK_NAME to the outputs of nb's last code cell (a new list: a
    measurement cell's outputs are the recording's)."""
    import nbformat

    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code:  # no cell to carry it: a hidden one (such a notebook runs nothing)
        code = [nbformat.v4.new_code_cell("", metadata={"tags": ["remove-cell"]})]
        nb.cells.append(code[0])
    code[-1].outputs = [*code[-1].get("outputs", []), glue_output(PEAK_NAME, peak)]


def present(nb, data_path: Path, cwd: Path, chapter: str,
            peak_gpu_gib: float | None = None, recorded=None) -> None:
    """Run nb's presentation cells in place from the values kept in `data_path`, and glue
    `peak_gpu_gib` (PEAK_NAME; by default the peak in nb's own provenance where nb is a
    recording, else NaN);
    PresentationError (one line, naming the chapter and the cell) if one breaks a rule of
    gpuinfer.publish.cells or fails."""
    try:
        broken = cellkinds.problems(cellkinds.code_cells(nb))
    except SyntaxError as exc:
        raise PresentationError(f"chapter {chapter}: {exc}") from None
    if broken:
        raise PresentationError(f"chapter {chapter}: {broken[0]}")
    steps = plan(nb, Path(data_path).resolve(), recorded)  # the kernel runs in `cwd`
    if steps:
        _run(nb, steps, cwd, chapter)
    if peak_gpu_gib is None:
        peak_gpu_gib = peak_gib(nb.metadata.get(METADATA_KEY) or {})
    glue_peak(nb, peak_gpu_gib)


def _run(nb, steps, cwd: Path, chapter: str) -> None:
    """Run `steps` (plan) in a fresh kernel; their outputs go into nb's cells in place."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    run = nbformat.v4.new_notebook(cells=[cell for _, cell in steps],
                                   metadata=copy.deepcopy(nb.metadata))
    client = NotebookClient(run, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    try:
        # the kernel's own start-up chatter is not the page's; it sees no CUDA device
        with tempfile.TemporaryFile("w+", encoding="utf8") as kernel_log:
            client.execute(stderr=kernel_log,
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    except CellExecutionError as exc:
        failed = next((c for c in run.cells for o in c.get("outputs", [])
                       if o.get("output_type") == "error"), None)
        number = failed.metadata.get(NUMBER_KEY, 0) if failed is not None else 0
        where = (f"presentation cell {number}" if number > 0 else
                 f"restoring the values kept after measurement cell {-number}")
        said = f"{exc.ename}: {exc.evalue}".splitlines()[0][:300]
        if "CUDA" in said or "cuda" in said:
            said += " (a presentation cell cannot touch the GPU)"
        raise PresentationError(f"chapter {chapter}: {where} failed: {said}") from None
    for index, cell in steps:
        if index is not None:
            nb.cells[index].outputs = cell.outputs
            nb.cells[index].execution_count = cell.get("execution_count")
    if "language_info" in run.metadata:
        nb.metadata.setdefault("language_info", run.metadata["language_info"])


def page(nb, recorded, data_path: Path, cwd: Path, chapter: str):
    """`nb` (the chapter as written today) as its page shows it, in place: the recorded
    outputs of its measurement cells (from the notebook `recorded`, matched as parsed, so a
    re-worded comment keeps its outputs) and the outputs of its presentation cells, run now
    from the values kept in `data_path`. ValueError if the measurement cells are not the
    recorded ones; PresentationError if a presentation cell fails."""
    cells, recorded_cells = ([c for _, c in cellkinds.measurement_cells(notebook)]
                             for notebook in (nb, recorded))
    if cells_hashes([c.source for c in cells]) != \
            cells_hashes([c.source for c in recorded_cells]):
        raise ValueError("its measurement cells differ from the chapter's")
    for cell, rec in zip(cells, recorded_cells):
        cell.outputs, cell.execution_count = rec.outputs, rec.execution_count
    if "language_info" in recorded.metadata:  # the lexer of the code cells
        nb.metadata["language_info"] = recorded.metadata["language_info"]
    present(nb, data_path, cwd, chapter, peak_gib(recorded.metadata.get(METADATA_KEY) or {}),
            recorded)
    return nb
