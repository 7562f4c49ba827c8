"""The position after a speculative pass, stored by the pass itself into pinned host memory:
one program that copies `pos` into the next slot of a ring and advances the ring's slot
counter, both on the device (`decode.position_reads.PositionReads`).

The ring is a pinned host tensor. With unified addressing its pointer is valid on the GPU,
so the kernel's store crosses to the host with no copy engine and no copy node in the
pass's graph; the counter lives on the device, so the pass needs nothing from the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def copy_position_kernel(pos_ptr, ring_ptr, slot_ptr, MOST: tl.constexpr):
    # wrapped on the load too: in the ring whatever the counter holds
    slot = tl.load(slot_ptr) % MOST
    tl.store(ring_ptr + slot, tl.load(pos_ptr))
    tl.store(slot_ptr, (slot + 1) % MOST)  # wraps: never overflows, however many passes


def copy_position(pos: torch.Tensor, ring: torch.Tensor, slot: torch.Tensor) -> None:
    """ring[slot] = pos, then slot = (slot + 1) % len(ring): pos (1,) and slot (1,) int32
    on the device, ring pinned on the host. On a CPU the same with torch ops, no kernel."""
    most = ring.numel()
    if not pos.is_cuda:
        i = int(slot[0]) % most
        ring[i] = pos[0]
        slot.fill_((i + 1) % most)
        return
    copy_position_kernel[(1,)](pos, ring, slot, MOST=most, num_warps=1)
