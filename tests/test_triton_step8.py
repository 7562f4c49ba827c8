"""The Triton step with issue 58's eight-bit kernels (`decode.triton_step8`): for each
format, on a small random Llama in FP32, the step's logits are those of the book's
PyTorch forward on the very weights the decoder holds, dequantized (tight: FP32 sums in
another order), and its greedy tokens are that forward's; its bytes count each format's
own; misuse is refused. Under Triton's interpreter without a GPU (PDL off)."""

import importlib
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import eight_bit, eight_bit_gemv  # noqa: E402

if not torch.cuda.is_available():  # decorated for compiling by an earlier import?
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(eight_bit.fold, InterpretedFunction):
        importlib.reload(eight_bit)
    if not isinstance(eight_bit_gemv.rows_dot8, InterpretedFunction):
        importlib.reload(eight_bit_gemv)

from gpuinfer.decode import triton_step8  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.decode.triton_step8 import (EIGHT_BIT, EightBitDecoder,  # noqa: E402
                                          Fp8Linear)
from gpuinfer.kernels.gemv import GemvConfig  # noqa: E402
from gpuinfer.model.llama import (AS_STORED, INT8, KVCache, forward,  # noqa: E402
                                  rotary_table, weights_of)
from gpuinfer.model.quant import Int8Matrix  # noqa: E402

from kernel_checks import DEVICE, quiet_numpy  # noqa: E402,F401
CAP = torch.cuda.get_device_capability() if DEVICE == "cuda" else (9, 0)
FORMATS = [f for f in ("int8", "fp8_bits", "fp8_cvt")
           if f != "fp8_cvt" or CAP >= (8, 9)]
# o and gate/up in two tiles of 32 columns, down in four of 64: the loops, not one tile
TILED = {"o": (GemvConfig(32, 32), 8), "gate_up": (GemvConfig(64, 32), 8),
         "down": (GemvConfig(32, 64), 16)}


@pytest.fixture(scope="module")
def model():
    """tests/test_triton_decode.py's small Llama (1B-like: grouped heads, tied)."""
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256,
                         initializer_range=0.113, tie_word_embeddings=True,
                         rms_norm_eps=1e-5, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(DEVICE)


def prompt_of(length, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (1, length), generator=gen).to(DEVICE)


def dequantized(w):
    return w if isinstance(w, torch.Tensor) else w.dequantized(torch.float32)


class Reference:
    """The book's PyTorch forward (`model.llama.forward`) on the decoder's own matrices,
    dequantized to FP32: the model the decoder's weights stand for."""

    def __init__(self, model, decoder, capacity):
        w = weights_of(model)
        layers = [replace(layer, **{m: dequantized(getattr(layer, m))
                                    for m in ("qkv", "o", "gate_up", "down")})
                  for layer in decoder.layers]
        self.weights = replace(w, layers=layers, lm_head=dequantized(decoder.lm_head))
        cos, sin = rotary_table(model, capacity)
        shape = (1, w.n_kv_heads, capacity, w.head_dim)
        self.cache = KVCache([torch.zeros(shape, device=DEVICE) for _ in layers],
                             [torch.zeros(shape, device=DEVICE) for _ in layers],
                             cos, sin, torch.arange(capacity, device=DEVICE))
        self.pos = 0

    @torch.no_grad()
    def __call__(self, ids):
        """Logits (1, vocab) after the tokens ids (1, T) at the next T slots."""
        slots = self.cache.slots[self.pos: self.pos + ids.shape[1]]
        self.pos += ids.shape[1]
        return forward(self.weights, self.cache, ids, slots)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("tiling", ["one tile", "tiled"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_step_computes_the_model_its_weights_stand_for(model, fmt, tiling):
    """Teacher-forced: each step's logits within FP32 rounding of the reference's, and
    the greedy tokens of the step (4 of them) equal to the reference's."""
    decoder = EightBitDecoder(model, capacity=24, format=fmt,
                              eight_bit=TILED if tiling == "tiled" else None)
    kinds = {type(getattr(decoder.layers[0], m)) for m in EIGHT_BIT}
    assert kinds == {Fp8Linear if fmt.startswith("fp8") else Int8Matrix}
    assert isinstance(decoder.layers[0].qkv, Int8Matrix)  # the parent's, INT8
    ref = Reference(model, decoder, 24)
    sequence = prompt_of(12, seed=3)
    assert rel(decoder.prefill(sequence[:, :8]), ref(sequence[:, :8])) <= 1e-5
    for pos in range(8, 11):
        token = sequence[:, pos: pos + 1]
        ours = decoder.step_logits(token)
        assert rel(ours, ref(token)) <= 1e-5, (fmt, pos)
    prompt = prompt_of(7, seed=5)
    tokens = decoder.generate(prompt, 4)
    ref = Reference(model, decoder, 24)
    logits, expected = ref(prompt), []
    for _ in range(4):
        expected.append(int(logits.argmax(-1)))
        logits = ref(torch.tensor([[expected[-1]]], device=DEVICE))
    assert tokens.tolist() == [expected], fmt


def test_dp4a_is_the_model_within_its_activations_quantization(model):
    """dp4a also quantizes x (per token, in every program): its logits stay within a
    few per cent of its weights' model (~3 % here), not within FP32 rounding."""
    decoder = EightBitDecoder(model, capacity=16, format="dp4a")
    ref = Reference(model, decoder, 16)
    sequence = prompt_of(10, seed=3)
    decoder.prefill(sequence[:, :7]), ref(sequence[:, :7])
    errors = [rel(decoder.step_logits(sequence[:, p: p + 1]),
                  ref(sequence[:, p: p + 1])) for p in range(7, 9)]
    assert all(1e-4 < e <= 0.08 for e in errors), errors


def test_bf16_parent_weights_and_bytes(model):
    """With the parent's matrices as stored (q/k/v, lm_head FP32 here), fp8 o, gate/up,
    down: the step still computes its weights' model, and `step_bytes` counts every
    matrix as held (fp8: a byte a weight, an FP32 scale a row)."""
    decoder = EightBitDecoder(model, capacity=16, format="fp8_bits", weights=AS_STORED)
    assert isinstance(decoder.layers[0].qkv, torch.Tensor)
    ref = Reference(model, decoder, 16)
    sequence = prompt_of(10, seed=7)
    decoder.prefill(sequence[:, :6]), ref(sequence[:, :6])
    for pos in range(6, 8):
        token = sequence[:, pos: pos + 1]
        assert rel(decoder.step_logits(token), ref(token)) <= 1e-5
    cfg = model.config
    h, inter, d, layers = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim,
                           cfg.num_hidden_layers)
    heads = cfg.num_attention_heads * d
    fp8 = [(h, heads), (2 * inter, h), (h, inter)]  # o, gate/up, down: (rows, cols)
    per_layer = (sum(n * k + 4 * n for n, k in fp8)
                 + 4 * (heads + 2 * cfg.num_key_value_heads * d) * h + 2 * 4 * h)
    lm_head, final_norm, embed_row = 4 * cfg.vocab_size * h, 4 * h, 4 * h
    kv = 2 * layers * cfg.num_key_value_heads * d * 4 * (5 + 2)
    assert decoder.step_bytes(5) == (layers * per_layer + lm_head + final_norm
                                     + embed_row + kv)


def test_nothing_moves_and_int8_is_the_parents_own(model):
    """Every tensor the step touches keeps its address across generations; int8's o,
    gate/up and down are the parent's quantized matrices, not new copies."""
    decoder = EightBitDecoder(model, capacity=24, format="fp8_cvt"
                              if "fp8_cvt" in FORMATS else "fp8_bits")
    tensors = decoder.tensors()
    assert all(isinstance(t, torch.Tensor) for t in tensors)
    addresses = [t.data_ptr() for t in tensors]
    first = decoder.generate(prompt_of(5), 3)
    assert torch.equal(decoder.generate(prompt_of(5), 3), first)
    assert addresses == [t.data_ptr() for t in decoder.tensors()]
    parent = weights_of(model, INT8).layers[0].down
    int8 = EightBitDecoder(model, capacity=24, format="int8").layers[0].down
    assert torch.equal(int8.q, parent.q) and torch.equal(int8.scale, parent.scale)


def test_tilings_are_fitted(model):
    decoder = EightBitDecoder(model, capacity=16, eight_bit={
        "gate_up": (GemvConfig(8, 4096), 64), "down": (GemvConfig(8, 16), 16)})
    config, fold = decoder.configs8["gate_up"]
    assert (config.block_k, fold) == (64, 16)  # K = 64: the tile, and a fold within it
    assert decoder.configs8["down"] == (GemvConfig(8, 16), 4)
    dp4a = EightBitDecoder(model, capacity=16, format="dp4a")
    assert all(fold == 1 for _, fold in dp4a.configs8.values())


@pytest.mark.parametrize("fmt", ["int8", "fp8_bits"])
def test_only_the_named_matrices_go_eight_bit(model, fmt):
    """matrices=("gate_up",): gate/up on the eight-bit kernels in `fmt`, o and down the
    parent's int8 matrices on the parent's kernels; each step the model its weights
    stand for, within FP32 rounding."""
    decoder = EightBitDecoder(model, capacity=24, format=fmt, matrices=("gate_up",))
    parent = TritonDecoder(model, capacity=24, weights=INT8)
    layer, theirs = decoder.layers[0], parent.layers[0]
    assert isinstance(layer.gate_up, Fp8Linear if fmt == "fp8_bits" else Int8Matrix)
    for m in ("o", "down"):
        assert torch.equal(getattr(layer, m).q, getattr(theirs, m).q)
    ref = Reference(model, decoder, 24)
    sequence = prompt_of(12, seed=3)
    assert rel(decoder.prefill(sequence[:, :8]), ref(sequence[:, :8])) <= 1e-5
    for pos in range(8, 11):
        token = sequence[:, pos: pos + 1]
        assert rel(decoder.step_logits(token), ref(token)) <= 1e-5, (fmt, pos)


def test_misuse_is_refused(model):
    with pytest.raises(ValueError, match="one-token steps.*TritonDecoder"):
        EightBitDecoder(model, max_query=2)
    with pytest.raises(ValueError, match="format='int4'"):
        EightBitDecoder(model, format="int4")
    with pytest.raises(ValueError, match="'gateup'"):
        EightBitDecoder(model, eight_bit={"gateup": (GemvConfig(), 16)})
    with pytest.raises(ValueError, match="do not split"):
        EightBitDecoder(model, capacity=16,
                        eight_bit={"down": (GemvConfig(8, 64, split_k=2), 16)})
    with pytest.raises(ValueError, match="a power of two"):
        EightBitDecoder(model, capacity=16, eight_bit={"down": (GemvConfig(8, 64), 3)})
    for matrices in ("gate_up", ("gateup",)):
        with pytest.raises(ValueError, match=r"matrices=.*\('gate_up',\)"):
            EightBitDecoder(model, capacity=16, matrices=matrices)
    with pytest.raises(ValueError, match="fp8 is converted"):
        triton_step8.to_format(Int8Matrix(torch.zeros(2, 4, dtype=torch.int8),
                                          torch.ones(2)), "fp8_bits")
    decoder = EightBitDecoder(model, capacity=16, format="int8")
    decoder.prefill(prompt_of(4))
    with pytest.raises(ValueError, match="TritonDecoder"):
        decoder.pass_logits(prompt_of(2))
    with pytest.raises(ValueError, match="one-token steps"):
        decoder.refresh_step()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_graph_replay_gives_the_eager_tokens(fmt):
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(DEVICE, torch.bfloat16)
    decoder = EightBitDecoder(model, capacity=64, format=fmt)
    eager = decoder.generate(prompt_of(9), 40, graph=False)
    assert torch.equal(decoder.generate(prompt_of(9), 40, graph=True), eager)
