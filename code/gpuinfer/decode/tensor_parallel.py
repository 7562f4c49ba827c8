"""The decode step split over N processes, Megatron-style: each holds 1/N of every matrix.

A batch-1 step reads every weight once, so a second GPU that holds half of them reads
half the bytes in parallel. The split (Shoeybi et al., Megatron-LM) needs two
all-reduces per layer and no other communication inside it:

- q, k, v and gate, up are split by their *output* features (columns): rank r holds
  heads r·h/N ... (r+1)·h/N - 1 and their key/value heads, and a slice of the MLP's
  intermediate features. Attention and the SiLU-gated product then run on local
  features only;
- o and down are split by their *input* features (rows of the product's sum): each rank
  multiplies its own features and gets a partial sum of the whole hidden vector, which an
  all-reduce adds up (`RowParallel`);
- the lm_head is split by vocabulary: each rank computes its 1/N of the logits, which an
  all-gather puts side by side (`VocabParallel`), so every rank takes the same argmax;
- the embedding and the norms are small or read a row at a time: every rank keeps them.

Each rank's KV cache holds only its own key/value heads. Nothing of the model changes:
`model.llama.forward` runs on the rank's `Weights`, whose o, down and lm_head are
matrices of another kind (they have a `linear`, as int8 matrices do) that communicate.
The decoder is a `StaticDecoder` on those weights, so Chapter 3's runners (compiled,
captured by `interface.graphed_step`) run its step unchanged, one graph per rank.

The collectives are `torch.distributed`'s functional ones, which `torch.compile` traces
into the step's graph: NCCL on GPUs, gloo on CPUs (the tests, and smoke mode).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpuinfer.decode.static import StaticDecoder
from gpuinfer.model.llama import AS_STORED, KVCache, LayerWeights, Weights


# torch.distributed's functional collectives, the ops that torch.compile traces: each
# returns a new tensor, valid once waited for (a no-op in a compiled graph, where the
# collective is ordered on the stream like any kernel).
_c10d = torch.ops._c10d_functional


def all_reduce(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of every rank's `x`, on every rank."""
    return _c10d.wait_tensor(_c10d.all_reduce(x, "sum", group.group_name))


def all_gather_last(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's `x` side by side along the last axis, in rank order, on every rank."""
    ranks = dist.get_world_size(group)
    stacked = _c10d.wait_tensor(_c10d.all_gather_into_tensor(x.contiguous(), ranks,
                                                             group.group_name))
    stacked = stacked.view(ranks, *x.shape).movedim(0, -2)  # (..., ranks, slice)
    return stacked.reshape(*x.shape[:-1], ranks * x.shape[-1])


@dataclass(frozen=True)
class RowParallel:
    """A matrix split by its input features: `linear` multiplies this rank's slice of
    x by its columns of the matrix, and sums the partial results of all ranks."""

    shard: torch.Tensor  # (out_features, in_features / N)
    group: dist.ProcessGroup

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(F.linear(x, self.shard), self.group)


@dataclass(frozen=True)
class VocabParallel:
    """The output projection split by vocabulary: `linear` gives every rank all the
    logits, each rank's slice gathered along the last axis in rank order."""

    shard: torch.Tensor  # (vocab / N, hidden)
    group: dist.ProcessGroup

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(F.linear(x, self.shard), self.group)


def check_split(w: Weights, ranks: int, vocab: int, intermediate: int) -> None:
    """Refuse a split that does not divide the model evenly, naming what does not."""
    sizes = {"attention heads": w.n_heads, "key/value heads": w.n_kv_heads,
             "MLP features": intermediate, "vocabulary": vocab}
    uneven = [f"{name} ({n})" for name, n in sizes.items() if n % ranks]
    if uneven:
        raise ValueError(f"a split over {ranks} ranks needs each of {', '.join(sizes)} to "
                         f"divide by {ranks}; these do not: {', '.join(uneven)}. Split "
                         f"over a number of GPUs that divides all of them")


def shard_weights(w: Weights, group: dist.ProcessGroup) -> Weights:
    """This rank's part of `w` (new, contiguous tensors; the full ones are left as they
    are): the matrices split as the module's docstring says, the rest shared."""
    if w.format is not AS_STORED:
        raise ValueError(f"split the model's own weights, not {w.format.name} ones")
    ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    d, h, kv = w.head_dim, w.n_heads, w.n_kv_heads
    intermediate = w.layers[0].gate_up.shape[0] // 2
    check_split(w, ranks, w.lm_head.shape[0], intermediate)

    def part(t: torch.Tensor, dim: int, *sections: int) -> torch.Tensor:
        """This rank's 1/N of each consecutive section of `t` along `dim`, joined."""
        pieces = t.split(list(sections), dim)
        return torch.cat([p.chunk(ranks, dim)[rank] for p in pieces], dim).contiguous()

    layers = [replace(
        layer,
        qkv=part(layer.qkv, 0, h * d, kv * d, kv * d),  # columns of q, of k, of v
        o=RowParallel(part(layer.o, 1, h * d), group),
        gate_up=part(layer.gate_up, 0, intermediate, intermediate),
        down=RowParallel(part(layer.down, 1, intermediate), group),
    ) for layer in w.layers]
    lm_head = VocabParallel(part(w.lm_head, 0, w.lm_head.shape[0]), group)
    return replace(w, layers=layers, lm_head=lm_head, n_heads=h // ranks,
                   n_kv_heads=kv // ranks)


class TensorParallelDecoder(StaticDecoder):
    """A `StaticDecoder` of this rank's shard of `model`, in `group` (every rank builds
    one, from the same model, and runs the same steps in the same order).

    Every rank holds the whole token sequence and position, and takes the same greedy
    token from the same gathered logits, so `tokens` and `pos` agree on every rank with
    no further communication. It is built as the unsplit decoder first (whose stacked
    matrices are new tensors), then keeps only its shard of them and a cache of its own
    key/value heads: building it needs room for the whole model's matrices once.
    """

    def __init__(self, model, batch: int, capacity: int, group: dist.ProcessGroup, *,
                 attention: str = "matmul"):
        super().__init__(model, batch, capacity, attention=attention)
        self.group = group
        self.weights = shard_weights(self.weights, group)
        w, full = self.weights, self.cache
        local = (batch, w.n_kv_heads, capacity, w.head_dim)

        def zeros():  # as StaticDecoder's cache: zeros, one tensor per layer
            return full.keys[0].new_zeros(local)

        self.cache = KVCache([zeros() for _ in w.layers], [zeros() for _ in w.layers],
                             full.cos, full.sin, full.slots)
        for t in self.tensors():  # the new tensors' addresses are fixed too
            torch._dynamo.mark_static_address(t)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a step reads or writes, the shards of the communicating matrices
        included."""
        w = self.weights  # (the full weights while StaticDecoder's __init__ runs)
        matrices = [m for layer in w.layers for m in (layer.o, layer.down)] + [w.lm_head]
        return super().tensors() + [m.shard for m in matrices if _communicates(m)]


def _communicates(matrix) -> bool:
    return isinstance(matrix, (RowParallel, VocabParallel))


def rank_bytes(w: Weights) -> int:
    """Bytes of the matrices a rank's step streams: its shards, or the whole matrices of
    an unsplit model (`Weights`, of either kind)."""
    def matrix(m) -> torch.Tensor:
        return m.shard if _communicates(m) else m

    return sum(matrix(getattr(layer, name)).nbytes for layer in w.layers
               for name in LayerWeights.MATRICES) + matrix(w.lm_head).nbytes
