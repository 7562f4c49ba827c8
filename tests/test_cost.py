"""The byte and FLOP accounting of a decode step (gpuinfer.model.cost), against
hand-computed values."""

import pytest

from gpuinfer.model import cost as C
from gpuinfer.model.configs import build_model, model_config

# The reduced config, by hand: 2 layers, hidden 64, 4 query / 2 key-value heads of 16,
# MLP 256, vocab 512, tied embeddings.
#   q, k, v: 64 x (4 + 2 + 2) x 16 = 8192;  o: 64 x 64 = 4096;  MLP: 3 x 64 x 256 = 49152
#   -> 61440 per layer; 2 layers = 122880; embedding 512 x 64 = 32768; norms 2 x 2 x 64 + 64.
LAYER_MATMUL = 8192 + 4096 + 49152
MATMUL_PARAMS = 2 * LAYER_MATMUL + 32768  # the layers and the output projection: 155648
PARAMS = 2 * LAYER_MATMUL + 320 + 32768  # 155968


def test_shape_counts_by_hand():
    small_model = build_model(model_config("reduced"), seed=0)
    shape = C.ModelShape.of(small_model.config)
    assert shape == C.ModelShape(2, 64, 4, 2, 16, 256, 512, True)
    assert shape.layer_matmul_params == LAYER_MATMUL == 61440
    assert shape.matmul_params == MATMUL_PARAMS == 155648
    assert shape.params == PARAMS == 155968
    assert sum(p.numel() for p in small_model.parameters()) == PARAMS  # tied: counted once
    # Keys and values of one token, all layers, BF16: 2 (k, v) x 2 layers x 2 heads x 16 x 2 B.
    assert shape.kv_bytes_per_token(2) == 256


def test_step_cost_by_hand():
    shape = C.ModelShape.of(model_config("reduced"))
    cost = C.step_cost(shape, batch=3, context=10, itemsize=2)
    # FLOPs: 3 x (2 x 155648 + 4 x 2 layers x 4 heads x 16 x 10) = 3 x (311296 + 5120).
    assert cost.flops == 949248
    # Bytes: weights 155968 x 2, cache read 3 x 10 x 256, new keys/values 3 x 256.
    assert cost.bytes == 311936 + 7680 + 768 == 320384
    assert cost.intensity == pytest.approx(949248 / 320384)
    parts = C.bytes_by_part(shape, batch=3, context=10, itemsize=2)
    assert sum(parts.values()) == cost.bytes
    assert parts["MLP (gate, up, down)"] == 2 * 49152 * 2
    assert parts["KV cache, read"] == 7680


def test_step_cost_untied_reads_only_the_batch_rows_of_the_input_embedding():
    shape = C.ModelShape.of(model_config("reduced", tie_word_embeddings=False))
    assert shape.params == PARAMS + 32768  # a separate output projection
    # Weights read: everything but the input embedding table, plus 3 of its rows.
    assert shape.weight_bytes(3, 2) == (PARAMS + 3 * 64) * 2
    cost = C.step_cost(shape, batch=3, context=10, itemsize=2)
    assert cost.bytes == (PARAMS + 3 * 64) * 2 + 7680 + 768
    assert cost.flops == 949248  # the same products
    parts = C.bytes_by_part(shape, batch=3, context=10, itemsize=2)
    assert sum(parts.values()) == cost.bytes


def test_llama_1b_shape():
    shape = C.ModelShape.of(model_config("1b"))
    assert shape.params == 1_235_814_400  # Llama-3.2-1B: 1.24 B parameters
    assert shape.params * 2 / 1e9 == pytest.approx(2.47, abs=0.005)  # GB in BF16
    assert shape.kv_bytes_per_token(2) == 32768  # 2 x 16 x 8 x 64 x 2 B
    # Batch 1 is about one FLOP per byte; the weights are nearly all of the bytes.
    cost = C.step_cost(shape, batch=1, context=256, itemsize=2)
    assert 0.95 < cost.intensity < 1.05
    assert shape.weight_bytes(1, 2) / cost.bytes > 0.99


def test_decode_cost_is_the_mean_step():
    shape = C.ModelShape.of(model_config("reduced"))
    steps = [C.step_cost(shape, batch=2, context=16 + k, itemsize=2) for k in range(1, 12)]
    mean = C.decode_cost(shape, batch=2, prompt_len=16, new_tokens=12, itemsize=2)
    assert mean.bytes == pytest.approx(sum(s.bytes for s in steps) / len(steps))
    assert mean.flops == pytest.approx(sum(s.flops for s in steps) / len(steps))


def test_mbu():
    # 1 GB in 1 ms is 1 TB/s: half of a 2 TB/s memory.
    assert C.mbu(1e9, 1e-3, 2e12) == pytest.approx(0.5)


def test_ridge_batch():
    shape = C.ModelShape.of(model_config("1b"))
    # Weights alone give about B FLOP/byte in BF16; the cache pushes the crossing out.
    b = C.ridge_batch(shape, context=1, itemsize=2, ridge=100)
    assert 95 < b < 110
    lo = C.step_cost(shape, batch=b - 1, context=1, itemsize=2).intensity
    hi = C.step_cost(shape, batch=b, context=1, itemsize=2).intensity
    assert lo < 100 <= hi
    assert C.ridge_batch(shape, context=512, itemsize=2, ridge=100) > b
    # A long context caps the intensity below the ridge: no batch is compute-bound.
    assert C.ridge_batch(shape, context=4096, itemsize=2, ridge=183) is None


def test_turning_batch():
    batches = [1, 2, 4, 8, 16]
    # Memory-bound up to 4 (flat), then the time doubles with the batch.
    assert C.turning_batch(batches, [1.0, 1.0, 1.0, 2.0, 4.0]) == 8
    # 1 -> 2 at 1.3x the time buys 1.54x the throughput: still mostly free.
    assert C.turning_batch(batches, [1.0, 1.3, 1.3, 1.3, 1.3]) is None
    # 1.4x the time: 1.43x the throughput, under 1.5x.
    assert C.turning_batch(batches, [1.0, 1.4, 1.4, 1.4, 1.4]) == 2
    # Non-doubling steps: 1 -> 4 at 2.5x the time is 1.6x throughput, (1.6-1)/3 = 0.2 free.
    assert C.turning_batch([1, 4], [1.0, 2.5]) == 4
    # The roofline floor itself turns where the FLOPs overtake the bytes.
    shape = C.ModelShape.of(model_config("1b"))
    batches = [2**i for i in range(12)]
    costs = [C.step_cost(shape, batch=b, context=64, itemsize=2) for b in batches]
    floor = [C.roofline_seconds(c, peak=700e12, bandwidth=4e12) for c in costs]
    assert C.turning_batch(batches, floor) in (256, 512)


def test_recompute_flops_by_hand():
    shape = C.ModelShape.of(model_config("reduced"))
    # 10 tokens: 2 x 155648 x 10 products; attention 4 x 2 layers x 4 heads x 16 x 55 pairs.
    assert C.recompute_flops(shape, length=10) == 2 * 155648 * 10 + 4 * 2 * 4 * 16 * 55
    # The step of a cached loop at the same context does a tenth of the products.
    cached = C.step_cost(shape, batch=1, context=10, itemsize=2).flops
    assert C.recompute_flops(shape, length=10) > 9 * cached


def test_int8_bytes_by_hand():
    """Reduced config, BF16 activations: rows per layer q,k,v 128 + o 64 + gate/up 512 +
    down 64 = 768; 2 layers + the output projection's 512 rows = 2048 scales of 2 B."""
    shape = C.ModelShape.of(model_config("reduced"))
    assert shape.matmul_rows == 2 * 768 + 512 == 2048
    parts = C.int8_bytes_by_part(shape, context=10, itemsize=2)
    assert parts == {"matrices, int8": MATMUL_PARAMS, "their scales, one a row": 4096,
                     "embedding row": 128, "norms": 5 * 64 * 2, "KV cache, read": 2560,
                     "KV cache, written": 256}
    bf16 = C.step_cost(shape, batch=1, context=10, itemsize=2).bytes
    assert 0.5 < sum(parts.values()) / bf16 < 0.56  # half, plus scales and the cache
