"""Training a small Llama (gpuinfer.model.train) on the CPU: a stream with a pattern to learn, the
random windows, the same weights from the same seeds (on the GPU too), deterministic kernels
while it trains, the held-out loss and greedy text from the trained model."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gpuinfer.model.configs import build_model, model_config
from gpuinfer.model.corpus import EOT, decode
from gpuinfer.model.train import (TrainLog, batches, deterministic, greedy_text,
                                  heldout_loss, learning_rate, train)

VOCAB = 64


def toy_model(vocab_size: int = VOCAB):
    """Llama "toy" (2 layers, hidden 64) with a small vocabulary: trains in a second."""
    return build_model(model_config("toy", vocab_size=vocab_size,
                                    max_position_embeddings=128))


def pattern_stream(repeats: int = 200) -> torch.Tensor:
    """16 token ids, always in the same order, over and over: after one token of context
    every next token is certain, so a model that learns the pattern reaches a loss near 0.
    The pattern holds id 0 (EOT in a corpus) and id 2 (the config's eos): neither may stop
    greedy decoding."""
    pattern = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:16]
    pattern[3], pattern[9] = 0, 2
    return pattern.repeat(repeats)


@pytest.fixture(scope="module")
def trained():
    """A toy model trained 60 steps on the pattern, and its log (the printed lines too)."""
    model = toy_model()
    log = train(model, pattern_stream(), steps=60, batch=8, seq_len=32, lr=3e-3,
                log_every=25, name="toy")
    return model, log


def test_batches_are_windows_of_the_stream():
    stream = torch.arange(1000)
    windows = batches(stream, batch=4, seq_len=16, generator=torch.Generator().manual_seed(1))
    assert windows.shape == (4, 17) and windows.dtype == torch.int64
    assert (windows.diff(dim=1) == 1).all()  # consecutive tokens of the stream
    again = batches(stream, batch=4, seq_len=16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(windows, again)
    whole = batches(torch.arange(17), batch=3, seq_len=16, generator=torch.Generator())
    assert all(torch.equal(row, torch.arange(17)) for row in whole)  # the only window


def test_batches_refuse_a_stream_shorter_than_a_window():
    with pytest.raises(ValueError, match="stream of 16 tokens.*seq_len \\+ 1 = 17"):
        batches(torch.arange(16), batch=2, seq_len=16, generator=torch.Generator())


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    rates = [learning_rate(s, steps=100, lr=1e-3, warmup=10) for s in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert rates[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:]))  # never rises after warmup


def test_training_learns_the_pattern(trained):
    model, log = trained
    assert isinstance(log, TrainLog) and len(log.losses) == log.steps == 60
    assert log.tokens == 60 * 8 * 32 and log.seconds > 0
    assert log.losses[0] > 2.5  # about ln(64) = 4.2 untrained
    assert log.final_loss < log.losses[0] / 10
    assert log.final_loss == pytest.approx(sum(log.losses[-3:]) / 3)
    assert not model.training
    assert heldout_loss(model, pattern_stream(20), seq_len=32) < 0.5


def test_training_prints_progress_lines(capsys):
    model = toy_model()
    train(model, pattern_stream(20), steps=5, batch=2, seq_len=8, log_every=2, name="draft")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  loss")[0] for line in lines] == [
        "draft: step     2/5", "draft: step     4/5", "draft: step     5/5"]
    assert all(" loss " in line and line.endswith(" s") for line in lines)


def weights(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def train_twice(device: str) -> tuple[dict, dict]:
    """The toy trained twice from the same seeds, a few steps: its weights each time."""
    runs = []
    for _ in range(2):
        model = build_model(model_config("toy", vocab_size=VOCAB, max_position_embeddings=128),
                            seed=3, device=device)
        train(model, pattern_stream(40), steps=4, batch=4, seq_len=32, seed=5, log_every=4)
        runs.append(weights(model))
    return runs[0], runs[1]


def test_the_same_seeds_train_the_same_weights_bit_for_bit():
    first, second = train_twice("cpu")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[n], second[n]) for n in first)
    untrained = build_model(model_config("toy", vocab_size=VOCAB,
                                         max_position_embeddings=128), seed=3)
    assert not torch.equal(first["model.norm.weight"], untrained.model.norm.weight)


@pytest.mark.gpu
def test_the_same_seeds_train_the_same_weights_bit_for_bit_on_the_gpu():
    first, second = train_twice("cuda")
    differ = [n for n in first if not torch.equal(first[n], second[n])]
    assert not differ, f"weights that differ between two runs: {differ[:5]}"


class Spy(torch.nn.Module):
    """A model that notes whether deterministic algorithms are on when it runs."""

    def __init__(self):
        super().__init__()
        self.model = toy_model()
        self.seen = []

    def forward(self, **kwargs):
        self.seen.append(torch.are_deterministic_algorithms_enabled())
        return self.model(**kwargs)


def test_training_runs_deterministic_kernels_and_restores_the_settings():
    spy = Spy()
    before = torch.are_deterministic_algorithms_enabled()
    train(spy, pattern_stream(20), steps=3, batch=2, seq_len=8, log_every=3)
    assert spy.seen == [True] * 3
    assert torch.are_deterministic_algorithms_enabled() == before
    spy.seen.clear()
    train(spy, pattern_stream(20), steps=1, batch=2, seq_len=8, deterministic_kernels=False)
    assert spy.seen == [before]


def test_a_nondeterministic_cublas_workspace_is_refused_before_anything_changes(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    before = torch.are_deterministic_algorithms_enabled()
    with pytest.raises(ValueError, match="^CUBLAS_WORKSPACE_CONFIG=':0:0'.*':4096:8'"):
        with deterministic(torch.device("cuda")):
            pass
    assert torch.are_deterministic_algorithms_enabled() == before
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    with deterministic(torch.device("cuda")):  # no CUDA call: it only sets what it needs
        assert torch.are_deterministic_algorithms_enabled()
        import os
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() == before


def test_a_stream_too_short_is_refused_before_the_model_changes():
    model = toy_model()
    before = weights(model)
    with pytest.raises(ValueError, match="stream of 8 tokens.*seq_len \\+ 1 = 9"):
        train(model, torch.arange(8), steps=2, batch=2, seq_len=8)
    assert not model.training
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())


def test_heldout_loss_of_an_untrained_model_is_near_chance():
    loss = heldout_loss(toy_model(), pattern_stream(20), seq_len=32, batch=4, max_windows=5)
    assert 3.0 < loss < 5.5  # ln(64) = 4.16
    with pytest.raises(ValueError, match="stream of 32 tokens has no full window"):
        heldout_loss(toy_model(), torch.arange(32), seq_len=32)


def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE made as corpus.train_tokenizer makes one, from a line of code: its
    first ids (EOT, then single bytes) are the ones the toy model predicts."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(["def f(x):\n    return x + 1\n"] * 4, trainer=trainer)
    return tokenizer


def test_greedy_text_continues_the_learned_pattern(trained):
    model, _ = trained
    tokenizer = tiny_tokenizer()
    stream = pattern_stream(3)
    prompt = stream[:20]  # the pattern once, then 4 more tokens
    text = greedy_text(model, tokenizer, prompt.view(1, -1), 24)
    assert isinstance(text, str)
    # The next 24 tokens of the pattern, through EOT and eos: generation did not stop.
    assert text == decode(tokenizer, stream[20:44])
    assert text.count(EOT) == 1  # EOT (id 0) is the pattern's 4th token: at 35, not 51
