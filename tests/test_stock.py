"""Stock generate() timed in a fresh process (gpuinfer.measure.stock), on the CPU: a toy
model, few tokens. Each variant starts a Python process of its own (imports included), so
the module's one real run is shared by the tests that read it."""

import math
import os
import subprocess

import pytest
import torch

from gpuinfer.decode.loops import decode_naive
from gpuinfer.measure import stock as st
from gpuinfer.measure.timing import Timing
from gpuinfer.model.configs import build_model, model_config, random_prompt
from gpuinfer.report import results

PROMPT, TOKENS, ROUNDS = 12, 6, 3


@pytest.fixture(scope="module")
def baselines():
    return st.stock_fresh("toy", dtype=torch.float32, prompt_len=PROMPT, new_tokens=TOKENS,
                          variants=("dynamic", "static"), rounds=ROUNDS, warmup=1,
                          device="cpu", attn_implementation="eager")


def test_each_variant_gives_positive_decode_times_within_their_spread(baselines):
    assert list(baselines.runs) == ["dynamic", "static"]
    for run in baselines.runs.values():
        assert run.ok, run.error
        assert len(run.decode_ms) == len(run.prefill_ms) == len(run.whole_ms) == ROUNDS
        assert 0 < run.low <= run.median <= run.high
        assert run.prefill > 0 and run.clock == "host"
        assert run.first_call_s > 0 and not run.compiled  # generate() compiles on GPUs only
        assert run.graphs_in_rounds == 0


def test_the_decode_time_leaves_the_prefill_out(baselines):
    for run in baselines.runs.values():
        for decode, first, whole in zip(run.decode_ms, run.prefill_ms, run.whole_ms):
            assert decode == pytest.approx((whole - first) / (TOKENS - 1))
            assert decode * (TOKENS - 1) < whole  # t_N less the prefill and first token


def test_the_fresh_process_builds_the_chapters_model_and_prompt(baselines):
    model = build_model(model_config("toy"), seed=0, attn_implementation="eager")
    prompt = random_prompt(model.config, PROMPT)
    reference = tuple(decode_naive(model, prompt, TOKENS)[0].tolist())
    assert all(run.tokens == reference for run in baselines.runs.values())


def test_glue_values_and_the_generate_static_ratio(baselines):
    static = baselines["static"]
    values = baselines.glue_values()
    assert values["stock_static_fresh_ms"] == static.median
    assert values["stock_dynamic_fresh_low"] == baselines["dynamic"].low
    assert all(type(v) is float for v in values.values())
    ours = Timing((static.median / 4, static.median / 2), "host")
    cmp = static.against("ours", ours)
    assert cmp.ratio == pytest.approx(static.median / ours.median)
    assert cmp.low == pytest.approx(static.low / ours.max) and cmp.faster
    rows = results.from_rounds(baselines.as_rounds(), model="toy",
                               bytes_per_token={r.label: 1.0 for r in
                                                baselines.runs.values()}, bandwidth=1.0)
    rebased = baselines.rebase(rows)
    assert rebased[1].x_generate_static == pytest.approx(1.0)  # static over itself
    low, high = rebased[1].x_generate_static_range
    assert low <= 1.0 <= high
    assert all(r.stock for r in rebased)  # the stock runs' own rows, not the book's loops
    ours = results.Result("V9", "toy", 1.0, 1.0, 1.0, ms_range=(0.9, 1.1))
    assert not baselines.rebase([ours])[0].stock
    assert "per decode token" in baselines.sentence()


def test_unknown_variant_or_config_is_refused_before_any_process():
    with pytest.raises(ValueError, match="unknown stock variant.*'static'"):
        st.stock_fresh("toy", prompt_len=4, new_tokens=3, variants=("statik",))
    with pytest.raises(ValueError, match="unknown model config 'huge'"):
        st.stock_fresh("huge", prompt_len=4, new_tokens=3)
    with pytest.raises(ValueError, match="new_tokens >= 2"):
        st.stock_fresh("toy", prompt_len=4, new_tokens=1)


def test_a_failed_process_names_the_variant_and_passes_its_stderr(monkeypatch, capsys):
    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nOSError: no disk\n")

    monkeypatch.setattr(st.subprocess, "run", failing)
    with pytest.raises(RuntimeError, match=r"'static' failed .*exit 1.*OSError: no disk"
                                           r".*python -m gpuinfer.measure.stock_process"):
        st.stock_fresh("toy", prompt_len=4, new_tokens=3, variants=("static",),
                       device="cpu")
    assert "Traceback" in capsys.readouterr().err


def test_a_variant_that_raises_is_reported_not_raised():
    failed = st.StockRun("docs", error="RuntimeError: overwritten")
    assert not failed.ok and math.isnan(failed.median) and math.isnan(failed.prefill)
    assert failed.label == st.STOCK_VARIANTS["docs"]
    baselines = st.StockBaselines({"docs": failed}, "toy", 4, 3, 1)
    assert math.isnan(baselines.glue_values()["stock_docs_fresh_ms"])
    assert "failed (RuntimeError: overwritten)" in baselines.sentence()
    assert baselines.as_rounds().times_ms == {}
    with pytest.raises(ValueError, match="failed in its fresh process"):
        failed.against("ours", Timing((1.0,), "host"))


def test_saved_baselines_load_as_they_were(baselines, tmp_path):
    path = baselines.save(tmp_path)
    assert path.name == "stock-toy-float32.json" and not list(tmp_path.glob("*.tmp"))
    loaded = st.StockBaselines.load(path)
    assert loaded == baselines
    assert loaded.workload() == {"config": "toy", "dtype": "float32", "prompt_len": PROMPT,
                                 "new_tokens": TOKENS, "gpu": None}
    assert loaded["static"].median == baselines["static"].median
    path.write_text("{not json", encoding="utf8")
    with pytest.raises(ValueError, match="stock-toy-float32.json is not a saved stock"):
        st.StockBaselines.load(path)


def test_gzipped_baselines_load_as_the_plain_ones(baselines, tmp_path):
    """The record command keeps a chapter's files gzipped: `load` reads them as they are."""
    import gzip

    plain = baselines.save(tmp_path)
    packed = plain.with_name(plain.name + ".gz")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert st.StockBaselines.load(packed) == baselines
    for broken in (b"not gzip", gzip.compress(plain.read_bytes())[:-12]):
        packed.write_bytes(broken)
        with pytest.raises(ValueError, match="stock-toy-float32.json.gz is not a saved"):
            st.StockBaselines.load(packed)


def test_each_process_compiles_into_empty_caches_of_its_own(monkeypatch):
    seen = []

    def fake_run(cmd, env, **kwargs):
        seen.append({k: env[k] for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")})
        raise subprocess.TimeoutExpired(cmd, 1)

    monkeypatch.setattr(st.subprocess, "run", fake_run)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="did not finish"):
            st.stock_fresh("toy", prompt_len=4, new_tokens=3, variants=("static",),
                           device="cpu")
    assert seen[0]["TORCHINDUCTOR_CACHE_DIR"] != seen[1]["TORCHINDUCTOR_CACHE_DIR"]
    assert all(not os.path.exists(s["TRITON_CACHE_DIR"]) for s in seen)  # removed after
