"""The position after each speculative pass, stored by the pass into a ring of host slots
(`kernels.position_ring`) and read back oldest first (`decode.position_reads`): the
positions in order across more passes than the ring holds, a reset that starts again at
slot 0, the kernel (interpreted without a GPU) equal to the CPU's torch ops, and the
kernel compiled for sm_80, sm_89 and sm_90."""

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.decode.position_reads import PositionReads  # noqa: E402
from gpuinfer.kernels.position_ring import copy_position, copy_position_kernel  # noqa: E402

from kernel_checks import DEVICE, unspilled_lines  # noqa: E402


def passes(reads, pos, moves, most_in_flight):
    """`Speculative.generate`'s loop on a stand-in pass that moves pos by each of
    `moves` and publishes: the positions read back, in the order read."""
    read, queued = [], 0
    while len(read) < len(moves):
        while reads.in_flight < most_in_flight and queued < len(moves):
            pos.add_(moves[queued])  # the pass
            reads.publish()  # its last kernel
            reads.queue()
            queued += 1
        read.append(reads.oldest())
    return read


@pytest.mark.parametrize("most", [1, 3, 4])
def test_the_ring_receives_every_position_in_order_past_its_slots(most):
    pos = torch.tensor([7], device=DEVICE)
    reads = PositionReads(pos, most=most)
    moves = [1, 3, 2, 5, 1, 1, 4, 2, 3, 1, 5]  # 11 passes: the ring wraps
    expected = [7 + sum(moves[: i + 1]) for i in range(len(moves))]
    assert passes(reads, pos, moves, most) == expected
    assert reads.in_flight == 0 and reads.queued == len(moves)
    assert int(reads.next_slot) == len(moves) % most
    for i in range(len(moves) - most, len(moves)):  # each slot holds its last pass's
        assert int(reads.ring[i % most]) == expected[i]


def test_reset_starts_again_at_slot_zero_and_forgets_what_was_in_flight():
    pos = torch.tensor([20], device=DEVICE)
    reads = PositionReads(pos, most=4)
    for _ in range(3):  # passes that publish, two of them queued, none read
        pos.add_(1)
        reads.publish()
    reads.queue()
    reads.queue()
    reads.reset()
    assert reads.in_flight == 0 and reads.queued == 0 and int(reads.next_slot) == 0
    assert passes(reads, pos, [2, 2, 2, 2, 2], 2) == [25, 27, 29, 31, 33]
    assert int(reads.ring[0]) == 33  # the fifth pass wrapped to slot 0


def test_misuse_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"most = 0 positions in flight: an int >= 1"):
        PositionReads(torch.tensor([1]), most=0)
    with pytest.raises(ValueError, match=r"most = 2\.0 positions in flight"):
        PositionReads(torch.tensor([1]), most=2.0)
    with pytest.raises(ValueError, match="no position in flight: queue"):
        PositionReads(torch.tensor([1])).oldest()


@pytest.mark.parametrize("start", [0, 2, 3, 9])  # 9: wrapped on the load, as the kernel
def test_the_kernel_equals_the_torch_ops(start):
    """The kernel (interpreted on a CPU; compiled, with a pinned ring, on a GPU) against
    `copy_position`'s torch ops on a CPU, from a counter at `start` (4 slots)."""
    pos, slot = torch.tensor([41]), torch.tensor([start], dtype=torch.int32)
    ring = torch.full((4,), -1, dtype=torch.long)
    expected_ring, expected_slot = ring.clone(), slot.clone()
    copy_position(pos, expected_ring, expected_slot)  # the CPU's path
    assert expected_ring.tolist()[start % 4] == 41 and int(expected_slot) == (start + 1) % 4
    if DEVICE == "cuda":
        pos, slot, ring = pos.cuda(), slot.cuda(), ring.pin_memory()
    copy_position_kernel[(1,)](pos, ring, slot, MOST=4)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(ring, expected_ring) and torch.equal(slot.cpu(), expected_slot)


@pytest.mark.gpu
def test_a_captured_pass_stores_into_the_pinned_ring():
    """What the interpreter cannot check: the store to a pinned host slot captured in a
    CUDA graph, and seen by the host once the event after the replay has completed."""
    pos = torch.tensor([3], device="cuda")
    reads = PositionReads(pos, most=4)

    def one_pass():
        pos.add_(2)
        reads.publish()

    from gpuinfer.measure.timing import capture_graph

    graph, _ = capture_graph(one_pass, warmup=2)  # moves pos and the counter: reset
    pos.fill_(3)
    reads.reset()
    read, queued = [], 0
    while len(read) < 10:
        while reads.in_flight < reads.most and queued < 10:
            graph.replay()
            reads.queue()
            queued += 1
        read.append(reads.oldest())
    assert read == [3 + 2 * (i + 1) for i in range(10)]


AOT_SCRIPT = """
import torch
from gpuinfer.kernels import aot
from gpuinfer.kernels.position_ring import copy_position_kernel
for cap in aot.TARGETS:
    with aot.compile_only(cap) as done:
        copy_position_kernel[(1,)](torch.zeros(1, dtype=torch.long),
                                   torch.zeros(4, dtype=torch.long),
                                   torch.zeros(1, dtype=torch.int32), MOST=4, num_warps=1)
    for name, _, kernel in done:
        assert aot.cubin_capability(kernel) == cap, (name, cap)
        print(cap, name, aot.resource_usage(kernel))
"""


def test_the_kernel_compiles_for_sm_80_89_90():
    lines, out = unspilled_lines(AOT_SCRIPT, 3)
    assert all("copy_position_kernel" in line for line in lines), out
