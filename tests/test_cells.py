"""A chapter's two kinds of cells (gpuinfer.publish.cells): the names a cell reads and
binds, what the recording keeps for the presentation cells, and the rules they keep."""

import pytest

from gpuinfer.publish import cells


def analysed(*sources, presentation=()):
    return [cells.analyse(i, src, i in presentation) for i, src in enumerate(sources, 1)]


@pytest.mark.parametrize("source, reads, binds", [
    ("y = x + 1", ("x",), {"y"}),
    ("x = x + 1", ("x",), {"x"}),  # read before the cell binds it
    ("x += 1", ("x",), {"x"}),
    ("a = 1\nb = a", (), {"a", "b"}),
    ("import numpy as np\nnp.zeros(3)", (), {"np"}),
    ("from m import f\nf(g)", ("g",), {"f"}),
    ("def f(a, b=c):\n    return a + d + e\ne = 1", ("c", "d"), {"f", "e"}),
    ("lambda q: q + r", ("r",), set()),
    ("[i * k for i in xs if i > lo]", ("xs", "lo", "k"), set()),  # as evaluated
    ("{k: v for k, v in pairs.items()}", ("pairs",), set()),
    ("for i in range(n):\n    total = i\nprint(total)", ("n",), {"i", "total"}),
    ("with open(p) as f:\n    f.read()", ("p",), {"f"}),
    ("try:\n    pass\nexcept ValueError as err:\n    print(err)", (), {"err"}),
    ("class A(Base):\n    size = width\n    def f(self):\n        return self.size + z",
     ("Base", "width", "z"), {"A"}),
    ("if (n := count) > 1:\n    print(n)", ("count",), {"n"}),
    ("display(x)\nprint(len(y))", ("x", "y"), set()),  # builtins and the kernel's own
    ("%matplotlib inline\nplt.plot(x)", ("plt", "x"), set()),  # IPython syntax
])
def test_what_a_cell_reads_and_binds(source, reads, binds):
    cell = cells.analyse(1, source, False)
    assert cell.reads == reads and cell.binds == binds


def test_a_presentation_cell_keeps_what_it_reads_from_measurement_cells():
    found = analysed(
        "import numpy as np\nrows = measure()",  # 1: measurement
        "fig = draw(rows, np)",                   # 2: presentation
        "best = max(rows)\nrows = [0]",           # 3: measurement
        "label = f'{best}'",                      # 4: presentation
        "print(label, rows, fig)",                # 5: presentation: label, fig are its own
        presentation={2, 4, 5})
    assert cells.kept_names(found) == {
        1: {"rows": "presentation cell 2", "np": "presentation cell 2"},
        3: {"best": "presentation cell 4", "rows": "presentation cell 5"}}
    assert cells.problems(found) == []


def test_a_measurement_cell_cannot_read_what_only_a_presentation_cell_binds():
    found = analysed("x = 1", "scale = 2 * x", "y = x * scale", presentation={2})
    said = cells.problems(found)
    assert said == ["measurement cell 3 reads scale, which only presentation cell 2 binds: "
                    "a measurement cannot depend on a presentation cell; bind it in a "
                    "measurement cell"]


@pytest.mark.parametrize("source, what", [
    ("torch.cuda.synchronize()", "uses torch.cuda.synchronize"),
    ("x = t.cuda()", "uses t.cuda"),
    ("t.to('cuda:0')", "names the device 'cuda:0'"),
    ("import time\nt0 = time.perf_counter()", "imports time"),
    ("from gpuinfer.measure.timing import benchmark", "imports from gpuinfer.measure.timing"),
    ("from gpuinfer import decode", "imports gpuinfer.decode"),
    ("with torch.profiler.profile():\n    pass", "uses torch.profiler"),
])
def test_a_presentation_cell_that_would_touch_the_gpu_or_a_clock_is_refused(source, what):
    said = cells.problems(analysed("import torch", source, presentation={2}))
    assert said and said[0].startswith(f"presentation cell 2 {what}"), said


def test_a_presentation_cell_cannot_call_a_measuring_function_a_measurement_cell_imported():
    found = analysed("from gpuinfer.measure.timing import benchmark, Timing",
                     "t = benchmark(f)", presentation={2})
    assert cells.problems(found) == [
        "presentation cell 2 uses benchmark (from gpuinfer.measure.timing.benchmark), which "
        "measures, decodes or touches the GPU: call it in a measurement cell and present "
        "its result"]


def test_what_a_presentation_cell_may_use():
    found = analysed("from gpuinfer.report.plots import plt\nimport numpy as np\nx = 1",
                     "from gpuinfer.roofline import ridge\nplt.plot(np.arange(x))",
                     presentation={2})
    assert cells.problems(found) == []


def test_a_cell_that_is_not_python_names_itself():
    from gpuinfer.publish.book import read_chapter  # noqa: F401 (the reader of chapters)
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("def (:")])
    with pytest.raises(SyntaxError, match="code cell 2"):
        cells.code_cells(nb)
