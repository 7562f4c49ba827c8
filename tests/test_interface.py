"""One decoder interface (decode.interface): every decoder built from a model or a
checkpoint folder, generating the model's own greedy tokens; the capture of a step
keeps the decoder's state, a prefill included, or raises; clear errors for checkpoints
the decoders do not cover."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.decode import interface, runners  # noqa: E402
from gpuinfer.decode.loops import decode_naive  # noqa: E402
from gpuinfer.decode.speculative import Speculative  # noqa: E402
from gpuinfer.decode.static import StaticDecoder  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.model.configs import load_llama, model_config  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW = 12


@pytest.fixture(scope="module")
def loaded(checkpoint):
    return load_llama(checkpoint, dtype=torch.float32, device=DEVICE)


@pytest.fixture(scope="module")
def prompt():
    return (torch.arange(8) * 3 % 64)[None].to(DEVICE)


def decoders(source, capacity=64):
    """Every decoder of the book, built from `source` (a model or a checkpoint folder)."""
    target = StaticDecoder(source, 1, capacity)
    return {"static": StaticDecoder(source, 1, capacity),
            "triton": TritonDecoder(source, capacity=capacity),
            "speculative": Speculative(target, StaticDecoder(source, 1, capacity), k=3)}


def test_a_checkpoint_loads_by_path_through_every_decoder(checkpoint, loaded, prompt):
    reference = decode_naive(loaded, prompt, NEW)
    assert len(set(reference[0].tolist())) > 3  # a trained model: not one token repeated
    for name, decoder in decoders(str(checkpoint)).items():
        assert isinstance(decoder, interface.Decoder)
        tokens = decoder.generate(prompt, NEW)
        assert torch.equal(tokens, reference), name


def test_every_decoder_keeps_its_state_through_a_prefill_and_steps(loaded, prompt):
    reference = decode_naive(loaded, prompt, 4)
    for name, decoder in decoders(loaded).items():
        with torch.no_grad():
            decoder.prefill(prompt)
            start = int(decoder.pos)
            decoder.decode_step()
        done = int(decoder.pos) - start + 1  # tokens after the prompt, the prefill's too
        assert torch.equal(decoder.tokens[:, start: start + min(done, 4)].cpu(),
                           reference[:, : min(done, 4)]), name


def test_checkpoints_the_decoders_do_not_cover_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_llama(tmp_path)
    biased = LlamaConfig(**{**model_config("reduced").to_dict(), "attention_bias": True})
    LlamaForCausalLM(biased).save_pretrained(tmp_path / "biased")
    with pytest.raises(NotImplementedError, match="attention_bias"):
        StaticDecoder(str(tmp_path / "biased"), 1, 16)
    mistral = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1)
    mistral.save_pretrained(tmp_path / "mistral")
    with pytest.raises(NotImplementedError, match="'mistral'"):
        TritonDecoder(str(tmp_path / "mistral"))
    with pytest.raises(TypeError, match="checkpoint folder"):
        load_llama(3)


def test_a_capture_without_room_raises(loaded, prompt):
    decoder = StaticDecoder(loaded, 1, 16)
    decoder.pos.fill_(14)
    with pytest.raises(ValueError, match="past the cache"):
        interface.graphed_step(decoder)
    assert int(decoder.pos) == 14  # nothing ran


def test_a_prompt_that_does_not_fit_is_refused(loaded, prompt):
    decoder = StaticDecoder(loaded, 1, 16)
    with pytest.raises(ValueError, match="capacity of 16"):
        interface.generate(decoder, prompt, 10)
    with pytest.raises(ValueError, match="batch 2"):
        decoder.prefill(prompt.repeat(2, 1))


def test_a_compiled_mode_is_refused_for_a_triton_decoder(loaded):
    with pytest.raises(ValueError, match="V4 .eager. or V5"):
        runners.runner(TritonDecoder(loaded, capacity=16), runners.V7)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["static", "triton"])
def test_a_step_captured_after_a_prefill_keeps_it(loaded, prompt, kind):
    """The bug of issue 29: a graphed Triton step captured right after a prefill ran its
    warm-up steps over the prefilled state (2 % top-1 agreement, no error). Teacher
    forced with the model's own tokens, the graphed step must give the eager step's."""
    bf16 = copy.deepcopy(loaded).to(torch.bfloat16)
    eager, graphed = (decoders(bf16)[kind] for _ in range(2))
    sequence = torch.cat([prompt, decode_naive(bf16, prompt, NEW).to(DEVICE)], 1)
    with torch.no_grad():
        eager.prefill(prompt)
        graphed.prefill(prompt)
        step = runners.runner(graphed, runners.V5)  # captured now, after the prefill
        for i in range(prompt.shape[1], sequence.shape[1] - 1):
            for decoder, run in ((eager, eager.decode_step), (graphed, step)):
                decoder.tokens[:, i] = sequence[:, i]
                run()
            torch.cuda.synchronize()
            assert torch.equal(graphed.tokens[:, i + 1], eager.tokens[:, i + 1]), i
            if kind == "triton":
                torch.testing.assert_close(graphed.logits, eager.logits)
    assert int(graphed.pos) == int(eager.pos) == sequence.shape[1] - 1
