"""Launch-overhead measurements of Chapter 3: the chain, the sweep, the graph capture."""

import math

import pytest
import torch

from gpuinfer.measure import launch


def test_chain_is_k_alternating_ops():
    x = torch.randn(100)
    assert torch.equal(launch.chain(x, 0), x)
    assert torch.equal(launch.chain(x, 1), x * 1.0001)
    assert torch.equal(launch.chain(x, 3), (x * 1.0001 + 0.0001) * 1.0001)


def test_eager_sweep_on_the_cpu():
    points = launch.chain_sweep([1, 4], [64, 256], modes=("eager",), device="cpu",
                                warmup=1, repeats=2)
    assert [(p.mode, p.k, p.numel) for p in points] == [
        ("eager", 1, 64), ("eager", 1, 256), ("eager", 4, 64), ("eager", 4, 256)]
    assert all(p.timing.repeats == 2 and p.us_per_op > 0 and p.compile_s is None
               for p in points)
    assert points[2].us_per_op == pytest.approx(points[2].timing.median * 1e3 / 4)


def test_launch_cost_on_the_cpu():
    cost = launch.launch_cost(50, device="cpu", repeats=2)
    assert cost["n_launches"] == 50 and cost["eager_us"] > 0
    assert math.isnan(cost["graph_us"])  # no graphs without CUDA


def test_launch_us_on_the_cpu():
    cost = launch.launch_us(50, device="cpu", rounds=7, warmup=1)
    assert cost.rounds == 7 and cost.n_launches == 50 and cost.clock == "host"
    assert 0 < cost.low <= cost.median <= cost.high
    assert "µs per launch" in str(cost)


@pytest.mark.gpu
def test_capture_graph_replays_the_same_kernels():
    x = torch.randn(1000, device="cuda")
    graph, out = launch.capture_graph(lambda: launch.chain(x, 8))
    x.copy_(torch.randn(1000, device="cuda"))  # new values at the same address
    graph.replay()
    assert torch.equal(out, launch.chain(x, 8))


@pytest.mark.gpu
def test_graph_launches_are_cheaper():
    cost = launch.launch_cost(200, repeats=5)
    assert cost["graph_us"] < cost["eager_us"]


@pytest.mark.gpu
@pytest.mark.slow
def test_full_sweep_on_the_gpu():
    points = launch.chain_sweep([1, 16], [2**12], repeats=5)
    assert {p.mode for p in points} == {"eager", "compiled", "graph"}
    compiled = [p for p in points if p.mode == "compiled"]
    assert all(p.compile_s is not None and p.compile_s > 0 for p in compiled)


def test_count_ops():
    x = torch.randn(4, 4)
    counts = launch.count_ops(lambda: (x.t() @ x).reshape(16).relu())  # t, reshape: views
    assert counts == {"aten::mm": 1, "aten::relu": 1}


def test_graph_launch_us_without_cuda_is_nan():
    assert math.isnan(launch.graph_launch_us(50, device="cpu"))


@pytest.mark.gpu
def test_a_kernel_in_a_graph_costs_less_than_an_eager_launch():
    assert launch.graph_launch_us(200, repeats=5) < launch.launch_us(200, rounds=5).median
