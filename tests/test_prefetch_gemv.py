"""`kernels.prefetch_gemv`: weight tiles copied into shared memory (TMA) before the PDL
wait. Gluon kernels do not run under Triton's interpreter, so on a CPU the kernel is
compiled for sm_90 (in a fresh Python without TRITON_INTERPRET) at the 1B step's
shapes and odd ones: it must assemble, spill nothing, take the shared memory the
launcher counts, and start its copies before the wait. The launcher's refusals run
anywhere; the products themselves are checked on a Hopper GPU (`gpu`) against
W.float() @ x.float()."""

import json

import pytest
import torch

from gpuinfer.kernels.prefetch_gemv import (SHARED_LIMIT, prefetch_gemv,
                                            prefetch_gemv_reference, shared_bytes)
from gpuinfer.model.quant import quantize_int8

from kernel_checks import (DEVICE, compiled_run, graphed_chain_error,  # noqa: F401
                           poisoned, quiet_numpy, randn, rel_err, run_output)

BF = torch.bfloat16
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9

# --------------------------------------------------------------------------------------
# Compiled for sm_90 without a GPU
# --------------------------------------------------------------------------------------

# (N, K, stages, block_n, block_k, num_warps, pdl): gate/up, down, o of the 1B step at
# the probe's tilings; odd shapes (N, K not multiples of the tile; tiles that wrap the
# ring); one without PDL
AOT_CASES = [(16384, 2048, s, 8, 512, 4, True) for s in (1, 2, 4)] + [
    (2048, 8192, 1, 8, 2048, 4, True), (2048, 8192, 2, 8, 2048, 4, True),
    (2048, 8192, 4, 8, 512, 4, True), (2048, 2048, 2, 8, 1024, 4, True),
    (2048, 2048, 1, 8, 2048, 4, True), (2048, 2048, 4, 16, 256, 4, True),
    (1003, 1000, 3, 16, 256, 4, True), (1003, 1000, 3, 16, 128, 4, True),
    (1003, 3000, 2, 4, 1024, 8, True),
    (1003, 3000, 2, 2, 512, 4, False)]

AOT_SCRIPT = """
import json, sys, torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.prefetch_gemv import prefetch_gemv
t = lambda *shape: torch.empty(shape, dtype=torch.bfloat16)
for n, k, stages, bn, bk, warps, pdl in json.loads(sys.argv[1]):
    with aot.compile_only(90) as done:
        prefetch_gemv(t(n, k), t(k), t(n), stages=stages, block_n=bn, block_k=bk,
                      pdl=pdl, num_warps=warps)
    kernel = done[-1][2]
    ptx = kernel.asm["ptx"]
    order = [ptx.find(s) for s in ("cp.async.bulk.tensor", "griddepcontrol.wait",
                                   "ld.global")]
    print(json.dumps(dict(aot.resource_usage(kernel), sm=aot.cubin_capability(kernel),
                          dynamic=kernel.metadata.shared, order=order,
                          griddep=ptx.count("griddepcontrol"))))
"""


@pytest.fixture(scope="module")
def compiled():
    """One row (a dict) per AOT_CASES entry, from one fresh Python that compiles."""
    proc = compiled_run(AOT_SCRIPT, json.dumps(AOT_CASES))
    assert proc.returncode == 0, run_output(proc)
    rows = [json.loads(line) for line in proc.stdout.splitlines()
            if line.startswith("{")]
    assert len(rows) == len(AOT_CASES), proc.stdout
    return rows


def test_compiles_for_sm_90_without_spills(compiled):
    """Every case assembles for sm_90 (TMA, mbarriers, griddepcontrol) and keeps its
    accumulator in registers: no stack, and few registers (the tile is in shared
    memory, read a chunk at a time)."""
    for case, row in zip(AOT_CASES, compiled):
        assert row["sm"] == 90 and row["stack"] == 0, (case, row)
        assert row["regs"] <= 96, (case, row)


def test_takes_the_shared_memory_the_launcher_counts(compiled):
    for (n, k, stages, bn, bk, _, _), row in zip(AOT_CASES, compiled):
        assert row["dynamic"] == shared_bytes(stages, bn, bk, k) <= SHARED_LIMIT, row


def test_copies_start_before_the_pdl_wait_and_x_is_read_after(compiled):
    """The point of the kernel: its first TMA copies are issued before
    griddepcontrol.wait, and x (which the previous kernel writes) is loaded after.
    Without PDL there is no wait at all."""
    for case, row in zip(AOT_CASES, compiled):
        tma, wait, load = row["order"]
        if case[-1]:
            assert row["griddep"] == 2 and 0 <= tma < wait < load, (case, row)
        else:
            assert row["griddep"] == 0 and 0 <= tma < load, (case, row)


# --------------------------------------------------------------------------------------
# What the launcher refuses (no kernel is compiled or run)
# --------------------------------------------------------------------------------------

def cpu(*shape, dtype=BF):
    return torch.zeros(shape, dtype=dtype)


TILE = dict(stages=2, block_n=8, block_k=512, pdl=False)


@pytest.mark.parametrize("w, x, out, match", [
    (cpu(64, 256, dtype=torch.float32), cpu(256), None, "torch.bfloat16 matrix"),
    (cpu(256), cpu(256), None, "2-D"),
    (quantize_int8(cpu(64, 256, dtype=torch.float32)), cpu(256), None,
     "Int8Matrix.*gemv.gemv"),
    (cpu(64, 100), cpu(100), None, "K a multiple of 8"),
    (cpu(256, 64).t(), cpu(256), None, r"strides \(1, 64\).*contiguous"),
    (cpu(64, 256), cpu(255), None, r"x of shape \(255,\).*\(256,\)"),
    (cpu(64, 256), cpu(256, dtype=torch.float16), None, "x of.*torch.float16"),
    (cpu(64, 256), cpu(1, 256), None, r"x of shape \(1, 256\)"),
    (cpu(64, 256), cpu(256), cpu(63), r"out of shape \(63,\).*\(64,\)"),
    (cpu(64, 256), cpu(256), cpu(64, dtype=torch.float32), "out of.*float32"),
    (cpu(64, 256), torch.empty(256, dtype=BF, device="meta"), None,
     "x is on meta.*move it"),
])
def test_refuses_operands_it_cannot_take(w, x, out, match):
    with pytest.raises(ValueError, match=match):
        prefetch_gemv(w, x, out, **TILE)


@pytest.mark.parametrize("tiling, match", [
    (dict(stages=0), "stages=0.*>= 1"),
    (dict(stages=1.5), "stages=1.5"),
    (dict(block_n=6), "block_n=6 is not a power of two"),
    (dict(block_k=768), "block_k=768 is not a power of two"),
    (dict(num_warps=3), "num_warps=3 is not a power of two"),
    (dict(block_n=512), "block_n=512: a TMA box has at most 256 rows"),
    (dict(block_n=256, block_k=4, num_warps=1), "block_k=4.*16 bytes"),
    (dict(block_n=2, block_k=64), r"2 x 64.*block_n \* block_k >= 1024"),
    (dict(stages=8, block_n=16, block_k=2048), "stages=8 of 16 x 2048.*fewer stages"),
])
def test_refuses_tilings_it_cannot_run(tiling, match):
    w, x = cpu(64, 8192), cpu(8192)
    with pytest.raises(ValueError, match=match):
        prefetch_gemv(w, x, **{**TILE, **tiling})


def test_counts_the_threads_of_a_tile_narrowed_to_k():
    """8 x 2048 fills 4 warps, but at K = 64 the tile is 8 x 64: too few weights."""
    with pytest.raises(ValueError, match=r"tile of 8 x 64.*>= 1024"):
        prefetch_gemv(cpu(64, 64), cpu(64), **{**TILE, "block_k": 2048})


def test_shared_memory_is_the_ring_x_and_a_barrier_a_slot():
    assert shared_bytes(4, 8, 512, 2048) == 4 * 8 * 512 * 2 + 2048 * 2 + 4 * 8
    # a tile wider than K is narrowed to K, and stages to the row's tiles
    assert shared_bytes(4, 8, 2048, 1000) == 8 * 1024 * 2 + 1024 * 2 + 8
    assert shared_bytes(4, 8, 2048, 2048) == shared_bytes(1, 8, 2048, 2048)


# --------------------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
hopper = pytest.mark.skipif(not HOPPER, reason="TMA needs Hopper (sm_90) or later")


@gpu
@hopper
@pytest.mark.parametrize("n, k, stages, block_n, block_k, warps", [
    (1003, 1000, 3, 16, 256, 4),  # N, K ragged; 4 tiles through 3 slots
    (1003, 1000, 3, 16, 128, 4),  # 8 tiles; a warp across 2 rows of a tile
    (1003, 3000, 2, 8, 256, 4),  # 12 tiles through 2 slots: 6 phases a slot
    (1003, 3000, 2, 4, 1024, 8),  # 3 tiles; warps across the columns too
    (1003, 2104, 2, 8, 2048, 4),  # tile 2 holds 56 columns: TMA boxes wholly past K
    (37, 2048, 4, 2, 512, 4),  # one block short of rows; the whole row before the wait
    (16384, 2048, 2, 8, 512, 4),  # gate/up
    (2048, 8192, 4, 8, 2048, 4),  # down
    (2048, 2048, 1, 8, 2048, 4),  # o
])
@pytest.mark.parametrize("pdl", [False, True])
def test_matches_the_fp32_product(n, k, stages, block_n, block_k, warps, pdl):
    w = randn(n, k, dtype=BF, seed=n + k, scale=k ** -0.5)
    x = randn(k, dtype=BF)
    out = poisoned(n, dtype=BF)
    prefetch_gemv(w, x, out, stages=stages, block_n=block_n, block_k=block_k,
                  num_warps=warps, pdl=pdl)
    assert rel_err(out, w.float() @ x.float()) <= 1e-2
    assert rel_err(out, prefetch_gemv_reference(w, x)) <= 1e-2


@gpu
@hopper
def test_pdl_chain_in_a_cuda_graph():
    """Ten dependent products, each reading the last one's output, launched with PDL
    and replayed from a CUDA graph: each program's copies run before its wait, its
    reads of x after it."""
    def product(w, x, out):
        prefetch_gemv(w, x, out, stages=2, block_n=8, block_k=256, pdl=True)

    assert graphed_chain_error(product, prefetch_gemv_reference,
                               scale=1024 ** -0.5) <= 2e-2
