"""Chapter 4's package code on the CPU: the byte and FLOP accounting against hand-computed
values, our decoder's tokens against the reference loop, and the measurement helpers."""

import contextlib

import pytest
import torch

from gpuinfer import scale as sc
from gpuinfer.decode import decode_naive
from gpuinfer.llama import random_prompt

pytestmark = pytest.mark.filterwarnings("ignore::gpuinfer.timing.HostClockWarning")

# The reduced config, by hand: 2 layers, hidden 64, 4 query / 2 key-value heads of 16,
# MLP 256, vocab 512, tied embeddings.
#   q, k, v: 64 x (4 + 2 + 2) x 16 = 8192;  o: 64 x 64 = 4096;  MLP: 3 x 64 x 256 = 49152
#   -> 61440 per layer; 2 layers = 122880; embedding 512 x 64 = 32768; norms 2 x 2 x 64 + 64.
LAYER_MATMUL = 8192 + 4096 + 49152
MATMUL_PARAMS = 2 * LAYER_MATMUL + 32768  # the layers and the output projection: 155648
PARAMS = 2 * LAYER_MATMUL + 320 + 32768  # 155968


@pytest.fixture(scope="module")
def small_model():
    return sc.build_on_device(sc.reduced_config(), seed=0, dtype=torch.float32)


def test_shape_counts_by_hand(small_model):
    shape = sc.ModelShape.of(small_model.config)
    assert shape == sc.ModelShape(2, 64, 4, 2, 16, 256, 512, True)
    assert shape.layer_matmul_params == LAYER_MATMUL == 61440
    assert shape.matmul_params == MATMUL_PARAMS == 155648
    assert shape.params == PARAMS == 155968
    assert sum(p.numel() for p in small_model.parameters()) == PARAMS  # tied: counted once
    # Keys and values of one token, all layers, BF16: 2 (k, v) x 2 layers x 2 heads x 16 x 2 B.
    assert shape.kv_bytes_per_token(2) == 256


def test_step_cost_by_hand():
    shape = sc.ModelShape.of(sc.reduced_config())
    cost = sc.step_cost(shape, batch=3, context=10, itemsize=2)
    # FLOPs: 3 x (2 x 155648 + 4 x 2 layers x 4 heads x 16 x 10) = 3 x (311296 + 5120).
    assert cost.flops == 949248
    # Bytes: weights 155968 x 2, cache read 3 x 10 x 256, new keys/values 3 x 256.
    assert cost.bytes == 311936 + 7680 + 768 == 320384
    assert cost.intensity == pytest.approx(949248 / 320384)
    parts = sc.bytes_by_part(shape, batch=3, context=10, itemsize=2)
    assert sum(parts.values()) == cost.bytes
    assert parts["MLP (gate, up, down)"] == 2 * 49152 * 2
    assert parts["KV cache, read"] == 7680


def test_step_cost_untied_reads_only_the_batch_rows_of_the_input_embedding():
    shape = sc.ModelShape.of(sc.reduced_config(tie_word_embeddings=False))
    assert shape.params == PARAMS + 32768  # a separate output projection
    # Weights read: everything but the input embedding table, plus 3 of its rows.
    assert shape.weight_bytes(3, 2) == (PARAMS + 3 * 64) * 2
    cost = sc.step_cost(shape, batch=3, context=10, itemsize=2)
    assert cost.bytes == (PARAMS + 3 * 64) * 2 + 7680 + 768
    assert cost.flops == 949248  # the same products
    parts = sc.bytes_by_part(shape, batch=3, context=10, itemsize=2)
    assert sum(parts.values()) == cost.bytes


def test_llama_1b_shape():
    shape = sc.ModelShape.of(sc.llama_1b_config())
    assert shape.params == 1_235_814_400  # Llama-3.2-1B: 1.24 B parameters
    assert shape.params * 2 / 1e9 == pytest.approx(2.47, abs=0.005)  # GB in BF16
    assert shape.kv_bytes_per_token(2) == 32768  # 2 x 16 x 8 x 64 x 2 B
    # Batch 1 is about one FLOP per byte; the weights are nearly all of the bytes.
    cost = sc.step_cost(shape, batch=1, context=256, itemsize=2)
    assert 0.95 < cost.intensity < 1.05
    assert shape.weight_bytes(1, 2) / cost.bytes > 0.99


def test_decode_cost_is_the_mean_step():
    shape = sc.ModelShape.of(sc.reduced_config())
    steps = [sc.step_cost(shape, batch=2, context=16 + k, itemsize=2) for k in range(1, 12)]
    mean = sc.decode_cost(shape, batch=2, prompt_len=16, new_tokens=12, itemsize=2)
    assert mean.bytes == pytest.approx(sum(s.bytes for s in steps) / len(steps))
    assert mean.flops == pytest.approx(sum(s.flops for s in steps) / len(steps))


def test_mbu():
    # 1 GB in 1 ms is 1 TB/s: half of a 2 TB/s memory.
    assert sc.mbu(1e9, 1e-3, 2e12) == pytest.approx(0.5)


def test_ridge_batch():
    shape = sc.ModelShape.of(sc.llama_1b_config())
    # Weights alone give about B FLOP/byte in BF16; the cache pushes the crossing out.
    b = sc.ridge_batch(shape, context=1, itemsize=2, ridge=100)
    assert 95 < b < 110
    lo = sc.step_cost(shape, batch=b - 1, context=1, itemsize=2).intensity
    hi = sc.step_cost(shape, batch=b, context=1, itemsize=2).intensity
    assert lo < 100 <= hi
    assert sc.ridge_batch(shape, context=512, itemsize=2, ridge=100) > b
    # A long context caps the intensity below the ridge: no batch is compute-bound.
    assert sc.ridge_batch(shape, context=4096, itemsize=2, ridge=183) is None


def test_turning_batch():
    batches = [1, 2, 4, 8, 16]
    # Memory-bound up to 4 (flat), then the time doubles with the batch.
    assert sc.turning_batch(batches, [1.0, 1.0, 1.0, 2.0, 4.0]) == 8
    # 1 -> 2 at 1.3x the time buys 1.54x the throughput: still mostly free.
    assert sc.turning_batch(batches, [1.0, 1.3, 1.3, 1.3, 1.3]) is None
    # 1.4x the time: 1.43x the throughput, under 1.5x.
    assert sc.turning_batch(batches, [1.0, 1.4, 1.4, 1.4, 1.4]) == 2
    # Non-doubling steps: 1 -> 4 at 2.5x the time is 1.6x throughput, (1.6-1)/3 = 0.2 free.
    assert sc.turning_batch([1, 4], [1.0, 2.5]) == 4
    # The roofline floor itself turns where the FLOPs overtake the bytes.
    shape = sc.ModelShape.of(sc.llama_1b_config())
    batches = [2**i for i in range(12)]
    costs = [sc.step_cost(shape, batch=b, context=64, itemsize=2) for b in batches]
    floor = [sc.roofline_seconds(c, peak=700e12, bandwidth=4e12) for c in costs]
    assert sc.turning_batch(batches, floor) in (256, 512)


@pytest.mark.parametrize("batch", [1, 3])
def test_scale_decoder_reproduces_reference_tokens(small_model, batch):
    prompt = random_prompt(small_model.config, 16, batch=batch, seed=1)
    reference = decode_naive(small_model, prompt, 12)
    assert len(set(reference[0].tolist())) > 4, "a degenerate reference would test nothing"
    decoder = sc.scale_decoder(small_model, batch, 64)
    assert {k: getattr(decoder, k) for k in sc.OURS} == sc.OURS
    with torch.no_grad():
        ours = decoder.generate(prompt, 12, "eager")
        assert torch.equal(ours, reference)
        # The same decoder, reused for a new prompt, starts from a clean state.
        assert torch.equal(decoder.generate(prompt, 12, "eager"), reference)


def test_scale_decoder_untied_and_stock_generate_agree():
    model = sc.build_on_device(sc.reduced_config(tie_word_embeddings=False), seed=2)
    prompt = random_prompt(model.config, 16, batch=2, seed=3)
    reference = decode_naive(model, prompt, 10)
    with torch.no_grad():
        assert torch.equal(sc.scale_decoder(model, 2, 64).generate(prompt, 10), reference)
    assert torch.equal(sc.generate_new_tokens(model, prompt, 10), reference)
    assert torch.equal(sc.generate_new_tokens(model, prompt, 10, cache_implementation="static"),
                       reference)


def test_count_ops():
    x = torch.randn(4, 4)
    counts = sc.count_ops(lambda: (x.t() @ x).reshape(16).relu())  # t, reshape: views
    assert counts == {"aten::mm": 1, "aten::relu": 1}


def test_measure_generation_times_and_keeps_tokens(small_model):
    prompt = random_prompt(small_model.config, 8, seed=1)
    result = sc.measure_generation("stock", lambda p, n: sc.generate_new_tokens(small_model, p, n),
                                   prompt, 6, repeats=2, first_repeats=2)
    assert result.ok and result.error is None
    assert torch.equal(result.tokens, decode_naive(small_model, prompt, 6))
    assert result.total.repeats == 2 and result.first.repeats == 2
    assert result.first_call_tokens == 6 and result.first_call_s > 0
    assert result.ms_per_token == pytest.approx((result.total.median - result.first.median) / 5)


def test_measure_generation_reports_failure_instead_of_raising():
    entered = []

    @contextlib.contextmanager
    def context():
        entered.append(True)
        yield

    def broken(prompt, n):
        raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten\nmore")

    result = sc.measure_generation("broken", broken, torch.zeros(1, 4, dtype=torch.long), 4,
                                   context=context)
    assert entered and not result.ok
    assert result.error == ("RuntimeError: accessing tensor output of CUDAGraphs that has "
                            "been overwritten")


def test_agreement():
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    b = torch.tensor([[1, 2, 9, 4], [1, 2, 3, 4]])
    assert sc.agreement(a, b) == (7 / 8, 2)
    assert sc.agreement(a, a[:, :3]) == (1.0, 3)


def test_docs_compiled_forward_restores_the_model(small_model):
    forward = small_model.forward
    with sc.docs_compiled_forward(small_model):
        assert small_model.forward is not forward
    assert "forward" not in vars(small_model)
    assert small_model.forward.__func__ is type(small_model).forward


def test_batch_sweep_on_cpu(small_model):
    points, note = sc.batch_sweep(small_model, [1, 2], prompt_len=8, how="eager", warmup=1,
                                  repeats=2)
    assert note == "" and [p.batch for p in points] == [1, 2]
    context = sc.timed_context(8, 1, 2)
    assert context == 8 + 1 + 1.5
    shape = sc.ModelShape.of(small_model.config)
    assert points[1].cost == sc.step_cost(shape, batch=2, context=context, itemsize=4)
    assert points[1].tokens_per_s == pytest.approx(2 / (points[1].step_ms / 1e3))


