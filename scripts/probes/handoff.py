"""Probe (issue 46): what one kernel boundary costs in a graphed chain on this GPU. A
chain of N tiny Triton kernels, each waiting for the one before (PDL, or a plain launch)
and then reading what it wrote and writing one value: its time per kernel is the floor
of a hand-over, the part of the 1B step's per-kernel cost that no tiling removes. Usage
on the GPU: PYTHONPATH=code python scripts/probes/handoff.py"""

import torch
import triton
import triton.language as tl

from gpuinfer.kernels.common import launch_options, pdl_wait
from gpuinfer.measure.timing import capture_graph
from gpuinfer.measure.rounds import interleaved_rounds

N = 80  # kernels in a chain, about a step's


@triton.jit
def relay(src_ptr, dst_ptr, PDL: tl.constexpr):
    pdl_wait(PDL)
    i = tl.arange(0, 32)
    v = tl.load(src_ptr + i, cache_modifier=".cg")  # written by the kernel before
    if tl.program_id(0) == 0:
        tl.store(dst_ptr + i, v + 1)


def chain(programs: int, pdl: bool):
    bufs = [torch.zeros(32, device="cuda") for _ in range(2)]

    def run():
        for k in range(N):
            relay[(programs,)](bufs[k % 2], bufs[(k + 1) % 2], PDL=pdl,
                               **launch_options(1, 1, pdl))
    run()
    graph, _ = capture_graph(run)
    return graph, bufs


chains = {(p, pdl): chain(p, pdl) for p in (1, 132, 1056) for pdl in (False, True)}
rounds = interleaved_rounds({f"{p} programs, PDL {'on' if pdl else 'off'}": g.replay
                             for (p, pdl), (g, _) in chains.items()},
                            rounds=20, warmup=3)
for name in rounds.names:
    t = rounds[name]
    print(f"{name:28s} {1e3 * t.median / N:6.2f} us a kernel "
          f"({1e3 * t.min / N:.2f}-{1e3 * t.max / N:.2f})")
