"""The roofline model: datasheet ceilings, arithmetic intensity, attainable performance.

A kernel that does F floating-point operations and must move B bytes through device memory
has arithmetic intensity I = F / B (FLOP per byte). On a GPU with peak compute P (FLOP/s)
and memory bandwidth W (bytes/s) it can run no faster than

    attainable(I) = min(P, W * I)

Below the ridge point I* = P / W the kernel is memory-bound (bytes set the time); above it,
compute-bound. Williams, Waterman and Patterson, "Roofline: an insightful visual performance
model for multicore architectures", CACM 52(4), 2009.

Everything here is plain arithmetic in SI units (FLOP, bytes, seconds), so it is tested on
the CPU against hand-computed values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


# ------------------------------------------------------------------------------------------
# Datasheet ceilings
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet ceilings of one GPU: dense (no sparsity) peaks in TFLOP/s, bandwidth in
    TB/s.

    A peak is None where the GPU has no such mode (the T4 has no TF32 and no BF16).
    """

    name: str
    pattern: str  # regex matched against torch.cuda.get_device_name()
    memory: str
    hbm_tbs: float
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    source: str

    def peak_tflops(self, precision: str) -> float | None:
        peaks = {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops,
                 "bf16": self.bf16_tflops}
        return peaks[precision]


# Dense tensor-core peaks: NVIDIA's datasheets quote TF32/BF16 "with sparsity" (2x); the
# dense figure is half of that. FP32 is the non-tensor (CUDA-core) peak.
GPU_SPECS: tuple[GPUSpec, ...] = (
    GPUSpec("A100 SXM4 40GB", r"A100-SXM4-40GB", "40 GB HBM2", 1.555, 19.5, 156.0, 312.0,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    GPUSpec("A100 SXM4 80GB", r"A100-SXM4-80GB", "80 GB HBM2e", 2.039, 19.5, 156.0, 312.0,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    GPUSpec("A100 PCIe 40GB", r"A100-PCIE-40GB", "40 GB HBM2", 1.555, 19.5, 156.0, 312.0,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    GPUSpec("A100 PCIe 80GB", r"A100 80GB PCIe", "80 GB HBM2e", 1.935, 19.5, 156.0, 312.0,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    GPUSpec("H100 SXM5 80GB", r"H100 80GB HBM3|H100 SXM", "80 GB HBM3", 3.35, 67.0, 494.7,
            989.4, "NVIDIA H100 Tensor Core GPU datasheet (2023)"),
    GPUSpec("H100 PCIe 80GB", r"H100 PCIe", "80 GB HBM2e", 2.0, 51.0, 378.0, 756.0,
            "NVIDIA H100 Tensor Core GPU datasheet (2023)"),
    GPUSpec("H200 SXM 141GB", r"^NVIDIA H200$|H200 SXM", "141 GB HBM3e", 4.8, 67.0, 494.7,
            989.4, "NVIDIA H200 Tensor Core GPU datasheet (2024)"),
    GPUSpec("L40S", r"L40S", "48 GB GDDR6", 0.864, 91.6, 183.0, 362.05,
            "NVIDIA L40S GPU datasheet (2023)"),
    GPUSpec("L4", r"\bL4$", "24 GB GDDR6", 0.300, 30.3, 60.0, 121.0,
            "NVIDIA L4 Tensor Core GPU datasheet (2023)"),
    GPUSpec("T4", r"\bT4$", "16 GB GDDR6", 0.320, 8.1, None, None,
            "NVIDIA T4 Tensor Core GPU datasheet (2019)"),
)


def lookup_spec(device_name: str | None) -> GPUSpec | None:
    """The datasheet row for a device name as torch reports it, or None if not in the table.

    >>> lookup_spec("NVIDIA H200").name
    'H200 SXM 141GB'
    """
    if not device_name:
        return None
    for spec in GPU_SPECS:
        if re.search(spec.pattern, device_name):
            return spec
    return None


# ------------------------------------------------------------------------------------------
# Roofline arithmetic
# ------------------------------------------------------------------------------------------


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: min(peak compute, bandwidth x intensity), in FLOP/s."""
    if intensity <= 0 or peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("intensity, peak and bandwidth must be positive")
    return min(peak_flops, bandwidth * intensity)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the bandwidth roof meets the compute roof."""
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak and bandwidth must be positive")
    return peak_flops / bandwidth


@dataclass(frozen=True)
class Workload:
    """What a kernel must do: FLOPs, and the fewest bytes it must move (each input read
    once, each output written once)."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def elementwise(name: str, numel: int, itemsize: int, *, inputs: int = 1, outputs: int = 1,
                flops_per_element: float = 1) -> Workload:
    """An elementwise op (or a fused chain of them) over `numel` elements.

    y = 2 * x in fp32: 1 FLOP per 8 bytes (4 read + 4 written), intensity 1/8.
    """
    return Workload(name, flops_per_element * numel, (inputs + outputs) * numel * itemsize)


def reduction(name: str, numel: int, itemsize: int) -> Workload:
    """A full reduction (sum): an add per element read; the scalar written is negligible."""
    return Workload(name, numel, numel * itemsize)


# max, subtract, exp, sum, divide: five operations per element, one read and one write.
SOFTMAX_FLOPS_PER_ELEMENT = 5


def softmax(name: str, rows: int, cols: int, itemsize: int) -> Workload:
    """Row softmax of a rows x cols matrix, read once and written once."""
    numel = rows * cols
    return Workload(name, SOFTMAX_FLOPS_PER_ELEMENT * numel, 2 * numel * itemsize)


def matmul(name: str, m: int, n: int, k: int, itemsize: int) -> Workload:
    """(m x k) @ (k x n): 2mnk FLOPs (a multiply and an add per term); A, B read, C written.

    Square n = 4096 in bf16: 2 * 4096^3 FLOP over 3 * 4096^2 * 2 bytes = 1365 FLOP/byte.
    With m = 1 (a decode step's matrix-vector product) the weight matrix dominates the bytes
    and the intensity falls to about 1 FLOP/byte in bf16.
    """
    return Workload(name, 2 * m * n * k, (m * k + k * n + m * n) * itemsize)


def achieved(workload: Workload, seconds: float) -> tuple[float, float]:
    """(FLOP/s, bytes/s) achieved by running `workload` in `seconds`."""
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    return workload.flops / seconds, workload.bytes / seconds
