"""Probe (issue 46, for the persistent design): programs of ONE kernel handing results to
each other through a counter, instead of a kernel boundary. STAGES stages; at each stage
every program waits until all programs have finished the stage before (polling the
stage's counter with `ld.acquire.gpu`, each thread on its own), reads all their values,
writes its own and counts itself in (a barrier, then an atomic add with release
semantics). The grid is at most the programs resident at once, so nobody waits for a
program that cannot run. The result is checked against the host's arithmetic: a read
that passed its acquire would show as a wrong sum. Its time per stage is what a
dependency inside a persistent kernel costs, against `handoff.py`'s kernel boundary.
Usage on the GPU: PYTHONPATH=code python scripts/probes/acquire_chain.py"""

import torch
import triton
import triton.language as tl

from gpuinfer.measure.timing import capture_graph
from gpuinfer.measure.rounds import interleaved_rounds

STAGES = 80


@triton.jit
def acquire_load(ptrs):
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                                     [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def stages_kernel(data_ptr, cnt_ptr, STAGES: tl.constexpr, G_P2: tl.constexpr,
                  NUM_WARPS_THREADS: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    lane = tl.arange(0, NUM_WARPS_THREADS)
    others = tl.arange(0, G_P2)
    value = (pid + 1).to(tl.float32)
    tl.store(data_ptr + pid, value)
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
    for s in range(1, STAGES):
        seen = acquire_load(cnt_ptr + (s - 1) + lane * 0)
        while tl.min(seen, axis=0) < G:
            seen = acquire_load(cnt_ptr + (s - 1) + lane * 0)
        prev = tl.load(data_ptr + (s - 1) * G + others, mask=others < G, other=0.0,
                       cache_modifier=".cg")
        value = tl.sum(prev, axis=0) / G + (pid + 1).to(tl.float32)
        tl.store(data_ptr + s * G + pid, value)
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + s, 1, sem="release", scope="gpu")


@triton.jit
def release_store(ptrs, values):
    return tl.inline_asm_elementwise(
        "st.release.gpu.global.b32 [$1], $2; mov.u32 $0, 0;", "=r,l,r", [ptrs, values],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def flags_kernel(data_ptr, flag_ptr, STAGES: tl.constexpr, G_P2: tl.constexpr,
                 NUM_WARPS_THREADS: tl.constexpr):
    """The same stages without atomics: each program publishes the stage it finished in
    its own flag (st.release); a waiter reads all flags (ld.acquire, spread over its
    threads) until every one has reached the stage."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    others = tl.arange(0, G_P2)
    mine = flag_ptr + pid + tl.arange(0, 1)
    value = (pid + 1).to(tl.float32)
    tl.store(data_ptr + pid, value)
    tl.debug_barrier()
    release_store(mine, tl.full((1,), 1, tl.int32))
    flags = flag_ptr + tl.minimum(others, G - 1)
    for s in range(1, STAGES):
        seen = acquire_load(flags)
        while tl.min(seen, axis=0) < s:
            seen = acquire_load(flags)
        prev = tl.load(data_ptr + (s - 1) * G + others, mask=others < G, other=0.0,
                       cache_modifier=".cg")
        value = tl.sum(prev, axis=0) / G + (pid + 1).to(tl.float32)
        tl.store(data_ptr + s * G + pid, value)
        tl.debug_barrier()
        release_store(mine, tl.full((1,), s + 1, tl.int32))


def expected(programs: int) -> torch.Tensor:
    v = torch.arange(1, programs + 1, dtype=torch.float64)
    for _ in range(1, STAGES):
        v = v.mean() + torch.arange(1, programs + 1, dtype=torch.float64)
    return v


def make(programs: int, warps: int, kernel):
    data = torch.zeros(STAGES * programs, device="cuda")
    cnt = torch.zeros(max(STAGES, programs), device="cuda", dtype=torch.int32)

    def run():
        cnt.zero_()
        kernel[(programs,)](data, cnt, STAGES=STAGES,
                                   G_P2=triton.next_power_of_2(programs),
                                   NUM_WARPS_THREADS=32 * warps, num_warps=warps)
    run()
    torch.cuda.synchronize()
    graph, _ = capture_graph(run)
    return graph, data


KERNELS = {"counter": stages_kernel, "flags": flags_kernel}
variants = {(k, p, w): make(p, w, kernel) for k, kernel in KERNELS.items()
            for p in (8, 132, 264, 528) for w in (1, 4)}
bad = 0
for (k, p, w), (graph, data) in variants.items():
    for _ in range(200):  # a stress: every replay checked
        graph.replay()
        got = data.view(STAGES, p)[-1].double().cpu()
        if not torch.allclose(got, expected(p), rtol=1e-5):
            bad += 1
print(f"wrong results in {bad} of {200 * len(variants)} replays")
rounds = interleaved_rounds({f"{k}: {p} programs, {w} warps": g.replay
                             for (k, p, w), (g, _) in variants.items()},
                            rounds=20, warmup=3)
for name in rounds.names:
    t = rounds[name]
    print(f"{name:34s} {1e3 * t.median / STAGES:6.2f} us a stage "
          f"({1e3 * t.min / STAGES:.2f}-{1e3 * t.max / STAGES:.2f})")
