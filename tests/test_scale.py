"""Chapter 4's experiments (gpuinfer.experiments.scale) on the CPU: our decoder's tokens against the
reference loop, the measurement helpers, the batch sweep."""

import contextlib

import pytest
import torch

from gpuinfer.decode import runners
from gpuinfer.decode.loops import decode_naive
from gpuinfer.model.stock_generate import generate_new_tokens
from gpuinfer.experiments import scale as sc
from gpuinfer.measure.rounds import decode_rounds
from gpuinfer.model.configs import build_model, model_config, random_prompt
from gpuinfer.model.cost import ModelShape, step_cost

pytestmark = pytest.mark.filterwarnings("ignore::gpuinfer.measure.timing.HostClockWarning")


@pytest.fixture(scope="module")
def small_model():
    return build_model(model_config("reduced"), seed=0, dtype=torch.float32)


@pytest.mark.parametrize("batch", [1, 3])
def test_our_decoder_reproduces_reference_tokens(small_model, batch):
    prompt = random_prompt(small_model.config, 16, batch=batch, seed=1)
    reference = decode_naive(small_model, prompt, 12)
    assert len(set(reference[0].tolist())) > 4, "a degenerate reference would test nothing"
    decoder = runners.decoder_for(small_model, batch, 64, attention=sc.ATTENTION)
    assert decoder.attention == sc.ATTENTION
    ours = runners.generate(decoder, prompt, 12, runners.EAGER)
    assert torch.equal(ours, reference)
    # The same decoder, reused for a new prompt, starts from a clean state.
    assert torch.equal(runners.generate(decoder, prompt, 12, runners.EAGER), reference)


def test_the_chapters_modes_are_the_books_untuned():
    assert [m.name for m in sc.MODES] == ["eager", "eager_graph", "compiled_graph_pdl",
                                          "compiled_trees"]
    assert not any(m.tune for m in sc.MODES)
    assert len({m.words for m in sc.MODES}) == len(sc.MODES)


def test_our_decoder_untied_and_stock_generate_agree():
    model = build_model(model_config("reduced", tie_word_embeddings=False), seed=2)
    prompt = random_prompt(model.config, 16, batch=2, seed=3)
    reference = decode_naive(model, prompt, 10)
    decoder = runners.decoder_for(model, 2, 64, attention=sc.ATTENTION)
    assert torch.equal(runners.generate(decoder, prompt, 10), reference)
    assert torch.equal(generate_new_tokens(model, prompt, 10), reference)
    assert torch.equal(generate_new_tokens(model, prompt, 10, cache_implementation="static"),
                       reference)


def test_first_call_keeps_tokens_and_decode_rounds_time_every_variant(small_model):
    prompt = random_prompt(small_model.config, 8, seed=1)
    stock = lambda p, n: generate_new_tokens(small_model, p, n)  # noqa: E731
    first = sc.first_call("stock", stock, prompt, 6)
    assert first.ok and first.error is None and first.seconds > 0
    assert torch.equal(first.tokens, decode_naive(small_model, prompt, 6))
    per_token, ttft = decode_rounds({"stock": stock, "again": stock}, prompt, 6, rounds=2)
    assert per_token.names == ["stock", "again"] and per_token.rounds == 2
    assert all(t > 0 for t in ttft.times_ms["stock"])


def test_first_call_reports_failure_instead_of_raising():
    entered = []

    @contextlib.contextmanager
    def context():
        entered.append(True)
        yield

    def broken(prompt, n):
        raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten\nmore")

    result = sc.first_call("broken", broken, torch.zeros(1, 4, dtype=torch.long), 4,
                           context=context)
    assert entered and not result.ok
    assert result.error == ("RuntimeError: accessing tensor output of CUDAGraphs that has "
                            "been overwritten")


def test_profile_generate_marks_the_call():
    from gpuinfer.report.trace import step_stats

    model = build_model(model_config("reduced"), seed=0)
    prompt = random_prompt(model.config, 8, seed=1)
    trace = sc.profile_generate(lambda p, n: generate_new_tokens(model, p, n), prompt, 3)
    assert step_stats(trace, step_name="generate").steps == 1


def test_batch_sweep_on_cpu(small_model):
    points, note = sc.batch_sweep(small_model, [1, 2], prompt_len=8, mode=runners.EAGER,
                                  warmup=1, repeats=2)
    assert note == "" and [p.batch for p in points] == [1, 2]
    assert [p.compiled for p in points] == [0, 0]  # the eager step compiles nothing
    context = sc.timed_context(8, 1, 2)
    assert context == 8 + 1 + 1.5
    shape = ModelShape.of(small_model.config)
    assert points[1].cost == step_cost(shape, batch=2, context=context, itemsize=4)
    assert points[1].tokens_per_s == pytest.approx(2 / (points[1].step_ms / 1e3))


def test_batch_sweep_counts_compilations_and_stops_at_the_recompile_limit(small_model,
                                                                         monkeypatch):
    """Each batch's compilations are counted; a batch that torch.compile would recompile
    past its limit (by default: run uncompiled, timed as if compiled) ends the sweep."""
    shape_specific = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
    real_step_timing = runners.step_timing

    def step_timing(decoder, prompt, mode, **kw):
        shape_specific(torch.zeros(decoder.batch))  # a new shape per batch: a compilation
        if decoder.batch == 4:
            raise torch._dynamo.exc.FailOnRecompileLimitHit("recompile limit reached")
        return real_step_timing(decoder, prompt, mode, **kw)

    monkeypatch.setattr(runners, "step_timing", step_timing)
    points, note = sc.batch_sweep(small_model, [1, 2, 4, 8], prompt_len=8,
                                  mode=runners.EAGER, warmup=1, repeats=2)
    assert [(p.batch, p.compiled) for p in points] == [(1, 1), (2, 1)]
    assert note.startswith("batch 4 would have been recompiled past torch.compile's limit")


def test_batch_sweep_times_a_reused_decoder_in_its_own_mode(small_model):
    """A batch in `reuse` runs on the decoder given for it, in the mode given with it (no
    new decoder, nothing compiled again); the other batches as before."""
    decoder = runners.decoder_for(small_model, 1, 64, attention=sc.ATTENTION)
    runners.generate(decoder, random_prompt(small_model.config, 8, seed=1), 4, runners.EAGER)
    built = dict(decoder.__dict__["_gpuinfer_runners"])
    points, note = sc.batch_sweep(small_model, [1, 2], prompt_len=8, mode=runners.EAGER,
                                  warmup=1, repeats=2, reuse={1: (decoder, runners.EAGER)})
    assert note == "" and [p.batch for p in points] == [1, 2]
    assert [p.capacity for p in points] == [64, 64]  # capacity_for(8, 4) rounds up to 64
    assert [p.mode for p in points] == ["V4: eager"] * 2
    assert decoder.__dict__["_gpuinfer_runners"] == built  # its runner, reused
    with pytest.raises(ValueError, match="decoder of batch 1"):
        sc.batch_sweep(small_model, [2], prompt_len=8, mode=runners.EAGER, warmup=1,
                       repeats=2, reuse={2: (decoder, runners.EAGER)})


def test_stock_baselines_gives_each_variant_its_own_warmup(monkeypatch):
    from gpuinfer.measure import stock

    calls = []

    def fake(config_name, *, variants, warmup, **kw):
        calls.append((variants, warmup))
        return stock.StockBaselines({variants[0]: stock.StockRun(variants[0])},
                                    config_name, kw["prompt_len"], kw["new_tokens"],
                                    kw["rounds"])

    monkeypatch.setattr(stock, "stock_fresh", fake)
    both = sc.stock_baselines("reduced", {"dynamic": 1, "static": 3}, prompt_len=8,
                              new_tokens=4, rounds=3)
    assert calls == [(("dynamic",), 1), (("static",), 3)]
    assert list(both.runs) == ["dynamic", "static"] and both.rounds == 3
    assert both["static"].label == stock.STOCK_VARIANTS["static"]
