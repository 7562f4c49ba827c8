import warnings

from gpuinfer import known_warnings


def test_silence_filters_the_known_warnings_and_no_other():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        known_warnings.silence()
        warnings.warn("Warning: Profiler clears events at the end of each cycle.Only")
        warnings.warn("dynamo_pgo force disabled by torch.compiler.config")
        warnings.warn("something new")
    assert [str(w.message) for w in caught] == ["something new"]
