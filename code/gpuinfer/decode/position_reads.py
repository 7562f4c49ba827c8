"""The position after each speculative pass, read by the host without stalling the GPU and
without a copy behind the pass: the pass's last kernel stores it into a ring of pinned host
slots (`kernels.position_ring`), and an event recorded after the pass says when its slot
holds it.
"""

from __future__ import annotations

from collections import deque

import torch

from gpuinfer.kernels.position_ring import copy_position


class PositionReads:
    """The positions after up to `most` passes in flight. `publish()` runs inside a pass,
    as its last kernel (captured into its graph): the position into the next of `most`
    pinned host slots. `queue()` after the pass records that slot's event; `oldest()`
    waits for the oldest and reads its slot. On a CPU, stored and read at once.

    The slots, the device's counter of them and the events are made once and kept: a
    captured graph holds their addresses."""

    def __init__(self, pos: torch.Tensor, most: int = 2):
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise ValueError(f"most = {most!r} positions in flight: an int >= 1")
        self.pos, self.cuda, self.most = pos, pos.is_cuda, most
        self.ring = torch.zeros(most, dtype=pos.dtype, pin_memory=self.cuda)
        # The slot the next publish() writes, kept on the device: a pass advances it
        # without the host (and from a graph, which cannot take a host value).
        self.next_slot = torch.zeros(1, dtype=torch.int32, device=pos.device)
        self.events = [torch.cuda.Event() for _ in range(most)] if self.cuda else []
        self.queued = 0  # passes queued since reset(): the next one writes queued % most
        self.slots: deque[int] = deque()

    @property
    def in_flight(self) -> int:
        return len(self.slots)

    def publish(self) -> None:
        """The position as the pass leaves it, stored into the next slot: the pass's last
        kernel."""
        copy_position(self.pos, self.ring, self.next_slot)

    def queue(self) -> None:
        """After a pass that published: its slot's event, recorded behind it."""
        if len(self.slots) == self.most:
            raise ValueError(f"{len(self.slots)} positions in flight: PositionReads holds "
                             f"at most {self.most}; read the oldest first")
        i = self.queued % self.most
        if self.cuda:
            self.events[i].record()
        self.queued += 1
        self.slots.append(i)

    def oldest(self) -> int:
        """The position after the oldest pass in flight, once it has ended."""
        if not self.slots:
            raise ValueError("no position in flight: queue() one after a pass")
        i = self.slots.popleft()
        if self.cuda:
            self.events[i].synchronize()  # the pass, its store to the slot included, done
        return int(self.ring[i])

    def reset(self) -> None:
        """Before a generation's first pass: slot 0 next, on the device (queued behind
        the passes before, not waited for) and here; nothing in flight. Passes that
        published since the last reset (warm-up runs, `decode_step`) are forgotten."""
        self.next_slot.zero_()
        self.queued = 0
        self.slots.clear()
