"""The values a recording keeps for its presentation cells (gpuinfer.publish.kept): plain
JSON that reads as what was measured, and comes back as the same values."""

import json
import math

import numpy as np
import pytest
import torch
from IPython.display import Markdown
from myst_nb import glue

from gpuinfer.measure.timing import Timing
from gpuinfer.measure.rounds import Comparison, Rounds
from gpuinfer.publish import kept
from gpuinfer.report.results import Result


def round_trip(value):
    return kept.decode(json.loads(json.dumps(kept.encode(value, "x"))))


@pytest.mark.parametrize("value", [
    None, True, 3, 2.5, "text", [1, 2.0, "a"], (1, (2, 3)), {"a": [1, 2]}, {(1, 2): "k"},
    {1: 2, 3: 4}, {"$odd": 1}, {1, 2, 3}, frozenset({"a"}), np.float64(4.18), np.int64(7),
    Timing((1.0, 2.0, 3.0), "cuda-event"), Rounds({"V0": (1.0, 2.0), ("V9", 1): (0.5, 0.6)},
                                                  "host"),
    Comparison("a", "b", 2.0, 1.9, 2.1, True, 5),
])
def test_values_come_back_equal_and_of_their_type(value):
    back = round_trip(value)
    assert back == value and type(back) is type(value)


def test_plain_values_stay_plain():
    assert kept.encode({"ms": [1.5, 2.5], "name": "V9"}, "x") == {"ms": [1.5, 2.5],
                                                                 "name": "V9"}


def test_arrays_tensors_dtypes_and_floats_that_are_not_numbers():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = round_trip(a)
    assert back.dtype == np.float32 and (back == a).all()
    assert round_trip(np.zeros((0, 3))).shape == (0, 3)
    t = torch.arange(4, dtype=torch.bfloat16)
    assert torch.equal(round_trip(t), t) and round_trip(torch.float16) is torch.float16
    assert math.isnan(round_trip(float("nan"))) and round_trip(float("inf")) == math.inf


def test_modules_and_functions_are_kept_by_name():
    assert round_trip(np) is np and round_trip(glue) is glue
    assert round_trip(Result) is Result
    assert round_trip(Markdown("**x**")).data == "**x**"


@pytest.mark.parametrize("value, said", [
    (lambda: 1, "defined in the chapter"),
    (torch.device("cpu"), "a torch.device"),
    (object(), "which a recording cannot keep"),
    (np.array([object()]), "numpy array of Python objects"),
])
def test_what_cannot_be_kept_is_refused_naming_it(value, said):
    with pytest.raises(kept.Unkeepable, match=said) as caught:
        kept.encode({"inner": value}, "rows, which presentation cell 4 reads,")
    assert str(caught.value).startswith("rows, which presentation cell 4 reads,")


def test_keep_and_restore_through_the_file(tmp_path):
    kept.keep(3, {"rows": "presentation cell 4", "absent": "presentation cell 4"},
              {"rows": [(1, 2.5)], "np": np}, str(tmp_path))
    kept.keep(7, {"np": "presentation cell 9"}, {"np": np}, str(tmp_path))
    text = (tmp_path / kept.DATA_FILE).read_text()
    assert '"rows": [{"$tuple": [1, 2.5]}]' in text  # a line a value, readable
    namespace = {}
    kept.restore(3, namespace, str(tmp_path / kept.DATA_FILE))
    assert namespace == {"rows": [(1, 2.5)]}  # "absent" was unbound: left out
    kept.restore(7, namespace, str(tmp_path / kept.DATA_FILE))
    assert namespace["np"] is np


def test_a_file_that_is_not_kept_data_says_so(tmp_path):
    path = tmp_path / kept.DATA_FILE
    path.write_text('{"format": 99}')
    with pytest.raises(ValueError, match="is not a recording's kept data"):
        kept.read(path)
