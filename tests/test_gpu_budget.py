"""The GPU budget of a chapter (gpuinfer.env.cap_gpu_memory): every process a chapter starts
stays within it, so the peak a recording reports is what a reader's card needs."""

import pytest
import torch

from gpuinfer import env


def test_without_cuda_nothing_is_capped():
    if torch.cuda.is_available():
        pytest.skip("a CPU-only check")
    assert env.cap_gpu_memory() is None
    assert env.GPU_BUDGET_GIB - env.CONTEXT_GIB > 0


@pytest.mark.gpu
def test_the_allocator_stays_within_the_budget_less_the_context():
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated() / 2**30  # what earlier tests left alive
    try:
        cap = env.cap_gpu_memory(held + env.CONTEXT_GIB + 3)
        assert cap == pytest.approx(held + 3)
        x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")  # fits
        del x
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(3.5 * 2**30), dtype=torch.uint8, device="cuda")
        with pytest.raises(ValueError, match="give a budget above"):
            env.cap_gpu_memory(env.CONTEXT_GIB / 2)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
