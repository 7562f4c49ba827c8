"""The roofline arithmetic against hand-computed values, and the datasheet table lookup."""

import math

import pytest

from gpuinfer import roofline as rl


def test_elementwise_intensity():
    # y = 2 * x in fp32: 1 FLOP per element, 4 bytes read + 4 written.
    w = rl.elementwise("2x", 1000, 4)
    assert (w.flops, w.bytes) == (1000, 8000)
    assert w.intensity == pytest.approx(1 / 8)
    # x + y in fp32: two inputs, one output.
    assert rl.elementwise("x+y", 10, 4, inputs=2).intensity == pytest.approx(1 / 12)
    # A fused chain of K = 8 steps of 2 FLOPs each, bf16: 16 FLOP per 4 bytes.
    assert rl.elementwise("chain", 10, 2, flops_per_element=16).intensity == pytest.approx(4)


def test_reduction_and_softmax_intensity():
    assert rl.reduction("sum", 1 << 20, 4).intensity == pytest.approx(0.25)
    sm = rl.softmax("sm", 128, 1024, 2)
    assert sm.flops == 5 * 128 * 1024
    assert sm.bytes == 2 * 128 * 1024 * 2
    assert sm.intensity == pytest.approx(1.25)


def test_matmul_intensity():
    # 4096^3 bf16: 2 * 4096^3 FLOP over 3 * 4096^2 * 2 bytes = 4096 / 3.
    w = rl.matmul("sq", 4096, 4096, 4096, 2)
    assert w.flops == 2 * 4096**3
    assert w.bytes == 3 * 4096**2 * 2
    assert w.intensity == pytest.approx(4096 / 3)
    # Decode shape: (1 x 8192) @ (8192 x 8192) in bf16, about 1 FLOP per byte.
    g = rl.matmul("gemv", 1, 8192, 8192, 2)
    assert g.flops == 2 * 8192 * 8192
    assert g.bytes == (8192 + 8192 * 8192 + 8192) * 2
    assert g.intensity == pytest.approx(2 * 8192**2 / ((8192**2 + 2 * 8192) * 2))
    assert 0.99 < g.intensity < 1.0


def test_attainable_is_min_of_roofs():
    peak, bw = 989e12, 4.8e12
    assert rl.attainable(1.0, peak, bw) == pytest.approx(4.8e12)  # memory-bound
    assert rl.attainable(1e4, peak, bw) == pytest.approx(989e12)  # compute-bound
    ridge = rl.ridge_point(peak, bw)
    assert ridge == pytest.approx(989 / 4.8)
    assert rl.attainable(ridge, peak, bw) == pytest.approx(peak)
    with pytest.raises(ValueError):
        rl.attainable(0, peak, bw)
    with pytest.raises(ValueError):
        rl.ridge_point(peak, 0)


def test_achieved():
    w = rl.Workload("w", flops=2e12, bytes=1e9)
    flops, bandwidth = rl.achieved(w, 0.5)
    assert (flops, bandwidth) == (4e12, 2e9)
    with pytest.raises(ValueError):
        rl.achieved(w, 0)


@pytest.mark.parametrize(
    "device_name, row",
    [
        ("NVIDIA H200", "H200 SXM 141GB"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),  # not L40S
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA H100 PCIe", "H100 PCIe 80GB"),
    ],
)
def test_lookup_known_gpus(device_name, row):
    assert rl.lookup_spec(device_name).name == row


@pytest.mark.parametrize("device_name", ["NVIDIA H200 NVL", "NVIDIA H100 NVL",
                                         "NVIDIA GeForce RTX 4090", "", None])
def test_lookup_unknown_gpus(device_name):
    assert rl.lookup_spec(device_name) is None


def test_spec_table_is_consistent():
    for spec in rl.GPU_SPECS:
        assert spec.source and spec.hbm_tbs > 0 and spec.fp32_tflops > 0
        for prec in ("tf32", "bf16"):
            peak = spec.peak_tflops(prec)
            assert peak is None or peak > spec.fp32_tflops  # tensor cores beat CUDA cores
    h200 = rl.lookup_spec("NVIDIA H200")
    assert (h200.hbm_tbs, h200.bf16_tflops) == (4.8, 989.4)
    assert math.isclose(rl.ridge_point(h200.bf16_tflops, h200.hbm_tbs), 206.1, rel_tol=1e-3)
