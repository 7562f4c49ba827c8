"""What a decode step must compute and move, from first principles, and how close a
measured step comes to moving it at the speed of memory.

- `ModelShape`: the sizes of a Llama that set the cost of a step;
- `step_cost`, `bytes_by_part`, `decode_cost`: FLOPs and the fewest bytes of one decode step
  (every weight read once, the KV cache read so far, the new keys and values written), and
  the mean step of a generation;
- `int8_bytes_by_part`: the same bytes at batch 1 with every matrix stored as int8 and a
  scale per row (weight-only quantization);
- `recompute_flops`: what a loop without a KV cache does instead, every step;
- `mbu`: the model bandwidth utilisation of a measured step;
- the batch roofline: `ridge_batch` (where a step's intensity reaches the ridge point),
  `turning_batch` (where measured throughput stops growing with the batch),
  `roofline_seconds` (the roofline's floor for a step).

Plain arithmetic in SI units, tested on the CPU against hand-computed values, as
`gpuinfer.roofline` is.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig

from gpuinfer import roofline as rl
from gpuinfer.model.configs import head_dim


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama that set the cost of a decode step."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # the output projection (lm_head) is the input embedding matrix

    @classmethod
    def of(cls, config: LlamaConfig) -> ModelShape:
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim(config), config.intermediate_size,
                   config.vocab_size, bool(config.tie_word_embeddings))

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matrix products: q, k, v, o, and the MLP's gate, up, down."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return qkv + o + 3 * self.hidden * self.intermediate

    @property
    def matmul_rows(self) -> int:
        """Output rows of the matrices one token multiplies (one int8 scale each)."""
        layer = (self.heads + 2 * self.kv_heads) * self.head_dim + self.hidden \
            + 2 * self.intermediate + self.hidden
        return self.layers * layer + self.vocab

    @property
    def matmul_params(self) -> int:
        """Weights that one token multiplies: every layer's, plus the output projection."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters, a tied embedding counted once (as `model.parameters()` counts)."""
        norms = self.layers * 2 * self.hidden + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_matmul_params + norms + embeddings

    def weight_bytes(self, batch: int, itemsize: int) -> int:
        """Weight bytes one step reads. Untied, the input embedding is not read whole: only
        the batch's rows of it. Tied, the output projection reads the whole matrix anyway."""
        if self.tied:
            return self.params * itemsize
        return (self.params - self.vocab * self.hidden + batch * self.hidden) * itemsize

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of keys and values that one token leaves in the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


def step_cost(shape: ModelShape, *, batch: int, context: float, itemsize: int) -> rl.Workload:
    """FLOPs and the fewest bytes of one decode step: `batch` sequences, each attending to
    `context` cached tokens (the new one included).

    FLOPs: a multiply and an add per weight per token (2 x matmul_params x batch), plus
    attention, q.k and p.v over the context: 4 x heads x head_dim x context per layer and
    token. The norms, rotary and activations (under 0.1%) are left out.
    Bytes: the weights once, the cached keys and values once, the new ones written once.
    Activations are left out: kilobytes per sequence, against megabytes of cache.
    """
    kv = shape.kv_bytes_per_token(itemsize)
    flops = batch * (2 * shape.matmul_params
                     + 4 * shape.layers * shape.heads * shape.head_dim * context)
    moved = shape.weight_bytes(batch, itemsize) + batch * context * kv + batch * kv
    return rl.Workload(f"decode step, batch {batch}", flops, moved)


def bytes_by_part(shape: ModelShape, *, batch: int, context: float,
                  itemsize: int) -> dict[str, float]:
    """The bytes of `step_cost`, part by part: they sum to its `bytes`."""
    # The output projection reads the whole matrix; untied, the input embedding adds its rows.
    embedding = shape.vocab * shape.hidden + (0 if shape.tied else batch * shape.hidden)
    kv = shape.kv_bytes_per_token(itemsize)
    mlp = 3 * shape.hidden * shape.intermediate
    return {
        "attention projections (q, k, v, o)":
            shape.layers * (shape.layer_matmul_params - mlp) * itemsize,
        "MLP (gate, up, down)": shape.layers * mlp * itemsize,
        "embedding / output projection": embedding * itemsize,
        "norms": (2 * shape.layers + 1) * shape.hidden * itemsize,
        "KV cache, read": batch * context * kv,
        "KV cache, written": batch * kv,
    }


def int8_bytes_by_part(shape: ModelShape, *, context: float,
                       itemsize: int) -> dict[str, float]:
    """The fewest bytes of a batch-1 decode step whose matrices (every layer's and the
    output projection) are int8 with one scale per row, in the activations' `itemsize`,
    as `model.quant` stores them. The rest stays as it was: the norms, the KV cache,
    and the input embedding, of which a step reads one row (tied or not: the output
    projection is an int8 copy)."""
    kv = shape.kv_bytes_per_token(itemsize)
    return {
        "matrices, int8": shape.matmul_params,
        "their scales, one a row": shape.matmul_rows * itemsize,
        "embedding row": shape.hidden * itemsize,
        "norms": (2 * shape.layers + 1) * shape.hidden * itemsize,
        "KV cache, read": context * kv,
        "KV cache, written": kv,
    }


def decode_cost(shape: ModelShape, *, batch: int, prompt_len: int, new_tokens: int,
                itemsize: int) -> rl.Workload:
    """The mean cost of the decode steps of a generation of `new_tokens` after `prompt_len`.

    The prefill produces the first new token; the next new_tokens - 1 come from decode steps,
    step k attending to prompt_len + k tokens. Cost is linear in the context, so the mean
    step is the step at the mean context, prompt_len + new_tokens / 2.
    """
    return step_cost(shape, batch=batch, context=prompt_len + new_tokens / 2, itemsize=itemsize)


def recompute_flops(shape: ModelShape, *, length: int) -> float:
    """FLOPs of one step of a loop without a KV cache: the whole sequence of `length`
    tokens through the model, the output projection included (its logits are computed for
    every position), and causal attention, in which position i meets i + 1 positions.
    Per layer and head, q.k and p.v take 2 x head_dim FLOPs a pair each."""
    pairs = length * (length + 1) / 2
    return (2 * shape.matmul_params * length
            + 4 * shape.layers * shape.heads * shape.head_dim * pairs)


def mbu(bytes_per_step: float, step_seconds: float, bandwidth: float) -> float:
    """Model bandwidth utilisation: the bytes a step must move, per second of step, as a
    fraction of the memory bandwidth. 1.0 is a step that runs at the speed of memory."""
    return bytes_per_step / step_seconds / bandwidth


def ridge_batch(shape: ModelShape, *, context: float, itemsize: int, ridge: float,
                limit: int = 1 << 20) -> int | None:
    """The smallest batch whose decode step has intensity >= `ridge` (FLOP/byte), or None.

    A step's intensity grows with the batch (the weights are shared) but saturates, because
    every sequence brings its own KV cache: it tends to (FLOPs per sequence) / (cache bytes
    per sequence). If that limit is below the ridge, no batch makes the step compute-bound.
    """
    def intensity(batch: int) -> float:
        return step_cost(shape, batch=batch, context=context, itemsize=itemsize).intensity

    if intensity(limit) < ridge:
        return None
    lo, hi = 1, limit  # intensity rises with the batch: bisect for the first batch past ridge
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if intensity(mid) < ridge else (lo, mid)
    return lo


def turning_batch(batches: list[int], step_seconds: list[float], *,
                  free: float = 0.5) -> int | None:
    """The first batch at which most of the added sequences no longer come for free.

    Memory-bound, a step costs the same whatever the batch, so doubling the batch doubles
    the tokens per second; compute-bound, the step time grows with the batch and tokens per
    second stay flat. Between two batch sizes, the fraction of added sequences that came for
    free is (throughput gain - 1) / (batch ratio - 1): 1 while memory-bound, 0 once
    compute-bound. This returns the first batch where it falls below `free` (for a doubling,
    the default 0.5 means "doubling the batch bought less than 1.5x the tokens per second"),
    or None if it never does. Apply it to measured and to predicted step times alike.
    """
    for (b0, t0), (b1, t1) in zip(zip(batches, step_seconds), zip(batches[1:], step_seconds[1:])):
        gain = (b1 / t1) / (b0 / t0)
        if (gain - 1) / (b1 / b0 - 1) < free:
            return b1
    return None


def roofline_seconds(cost: rl.Workload, *, peak: float, bandwidth: float) -> float:
    """The roofline's floor for a step: the longer of moving its bytes and doing its FLOPs."""
    return max(cost.bytes / bandwidth, cost.flops / peak)
