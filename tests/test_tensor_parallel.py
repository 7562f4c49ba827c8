"""The decode step split over processes (`decode.tensor_parallel`) and Chapter 7's
experiments (`experiments.tensor_parallel`, `experiments.collectives`): on the CPU, two
processes over gloo; on a GPU, the split in a group of one, with NCCL inside the compiled,
graphed step."""

import pytest
import torch
import torch.distributed as dist

from gpuinfer.decode import runners
from gpuinfer.decode.static import StaticDecoder
from gpuinfer.decode.tensor_parallel import (TensorParallelDecoder, check_split,
                                             rank_bytes, shard_weights)
from gpuinfer.experiments import collectives as cl, tensor_parallel as tp
from gpuinfer.model.configs import build_model, model_config, random_prompt
from gpuinfer.model.llama import INT8, weights_of

# Two processes run over gloo on CPUs, over NCCL one GPU each where there is CUDA.
two_processes = pytest.mark.skipif(0 < torch.cuda.device_count() < 2,
                                   reason="two processes need two GPUs (or none: gloo)")
REDUCED = model_config("reduced")  # 4 heads, 2 key/value heads, MLP 256, vocabulary 512


def split_facts(config, prompt_len: int, new_tokens: int) -> dict:
    """A worker: the split decoder against the unsplit one, on this rank."""
    model = build_model(config, seed=0)
    prompt = random_prompt(config, prompt_len)
    capacity = prompt_len + new_tokens + 8
    whole = StaticDecoder(model, 1, capacity)
    split = TensorParallelDecoder(model, 1, capacity, dist.group.WORLD)
    layer, full = split.weights.layers[0], whole.weights.layers[0]
    return {
        "tokens": torch.equal(split.generate(prompt, new_tokens),
                              whole.generate(prompt, new_tokens)),
        "logits": float((split.prefill(prompt) - whole.prefill(prompt)).abs().max()),
        "heads": (split.weights.n_heads, split.weights.n_kv_heads),
        "shapes": [tuple(layer.qkv.shape), tuple(layer.o.shard.shape),
                   tuple(layer.gate_up.shape), tuple(layer.down.shard.shape),
                   tuple(split.weights.lm_head.shard.shape)],
        "full_shapes": [tuple(full.qkv.shape), tuple(full.o.shape),
                        tuple(full.gate_up.shape), tuple(full.down.shape)],
        "cache": tuple(split.cache.keys[0].shape),
        "bytes": (rank_bytes(split.weights), rank_bytes(whole.weights)),
    }


@two_processes
def test_a_split_over_two_gives_the_unsplit_tokens_and_logits():
    facts = tp.launch(2, split_facts, REDUCED, 12, 10)
    assert facts["tokens"], "the split step's greedy tokens differ from the unsplit's"
    assert facts["logits"] < 1e-5  # FP32: the sums differ in order only
    assert facts["heads"] == (2, 1)
    qkv, o, gate_up, down = facts["full_shapes"]
    # q, k, v by output rows (heads), o by input columns, gate/up by rows, down by columns
    assert facts["shapes"] == [(qkv[0] // 2, 64), (64, o[1] // 2), (gate_up[0] // 2, 64),
                               (64, down[1] // 2), (256, 64)]
    assert facts["cache"][1] == 1  # its own key/value head only
    split_bytes, whole_bytes = facts["bytes"]
    assert 2 * split_bytes == whole_bytes  # every matrix halves


@two_processes
def test_the_sweeps_time_every_key_and_predict_from_them():
    steps = tp.launch(2, tp.step_sweep, REDUCED, [1, 2], prompt_len=8, steps=2, rounds=2,
                      calls=3)
    assert set(steps.rounds.names) == {("step", 1), ("step", 2), ("all-reduce", 2),
                                       ("all-gather", 2)}
    assert steps.rounds.rounds == 2
    assert 2 * steps.rank_bytes[2] == steps.rank_bytes[1]
    assert steps.predicted_us(1) == steps.step_us(1)
    expected = (steps.step_us(1) / 2 + 2 * REDUCED.num_hidden_layers
                * steps.rounds[("all-reduce", 2)].median
                + steps.rounds[("all-gather", 2)].median)
    assert steps.predicted_us(2) == pytest.approx(expected)
    assert steps.speedup(2).ratio == pytest.approx(steps.step_us(1) / steps.step_us(2))


@two_processes
def test_tokens_by_ranks_and_the_all_reduce_sweep():
    tokens = tp.launch(2, tp.tokens_by_ranks, REDUCED, [1, 2], prompt_len=8, new_tokens=6)
    assert tokens[1] == tokens[2] and len(tokens[1]) == 6
    sweep = tp.launch(2, cl.collective_sweep, [64, 1024], calls=2, rounds=2)
    assert sweep.backend == ("nccl" if torch.cuda.is_available() else "gloo")
    assert sweep.ranks == 2
    assert set(sweep.rounds.names) == {(m.name, n) for m in cl.methods_here()
                                       for n in (64, 1024)}
    assert all(t > 0 for key in sweep.rounds.names for t in sweep.rounds.times_ms[key])


@two_processes
def test_a_worker_that_fails_is_reported_in_one_line():
    result, error = tp.attempt(2, tp.step_sweep, REDUCED, [2], prompt_len=8, steps=1,
                               rounds=1)
    assert result is None
    assert error == ("ValueError: the sweep compares with the unsplit step: include 1 in "
                     "sizes")


def test_uneven_splits_and_gpu_only_methods_are_refused():
    w = weights_of(build_model(REDUCED))
    with pytest.raises(ValueError, match=r"key/value heads \(2\)"):
        check_split(w, 4, 512, 256)
    with pytest.raises(ValueError, match="attention heads"):
        check_split(w, 3, 512, 256)
    with pytest.raises(ValueError, match="split the model's own weights"):
        shard_weights(w.converted(INT8), None)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="runs on GPUs only"):
            cl.collective_sweep([64], methods=[cl.ONE_SHOT])
        assert cl.methods_here() == (cl.FUNCTIONAL,)


@pytest.mark.gpu
def test_split_in_a_group_of_one_compiles_and_graphs_with_nccl(tmp_path):
    """The split step's NCCL calls inside torch.compile and a CUDA graph (V9), on the one
    GPU there is: a group of one rank, whose tokens equal the unsplit step's in FP32."""
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        config = model_config("1b", num_hidden_layers=2)
        model = build_model(config, device="cuda")
        prompt = random_prompt(config, 32, device="cuda")
        whole = StaticDecoder(model, 1, 64, attention="sdpa")
        split = TensorParallelDecoder(model, 1, 64, dist.group.WORLD, attention="sdpa")
        assert torch.equal(runners.generate(split, prompt, 12, runners.COMPILED_GRAPH_PDL),
                           runners.generate(whole, prompt, 12, runners.COMPILED_GRAPH_PDL))
    finally:
        dist.destroy_process_group()
