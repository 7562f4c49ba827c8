"""The GPU memory a chapter needs: the peak in use on the device while it was recorded.

A chapter's memory is not only its kernel's: stock `generate()` runs in processes of its
own, and the caching allocator holds more than the tensors alive. So the watch reads the
device's memory in use, as `nvidia-smi` reports it, every `interval` seconds while the
chapter runs, and keeps the peak above what was in use when it started. Without
`nvidia-smi` (a CPU run) it reports nothing rather than a guess; a spike shorter than the
interval can be missed, so the figure is a lower bound, close to it for a chapter that
holds its buffers for seconds.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

QUERY = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]


def used_mib(index: int = 0) -> float | None:
    """Memory in use on GPU `index`, in MiB, or None where nvidia-smi cannot say."""
    if shutil.which(QUERY[0]) is None:
        return None
    try:
        out = subprocess.run(QUERY + ["-i", str(index)], capture_output=True, text=True,
                             timeout=10, check=True).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class PeakMemory:
    """`with PeakMemory() as watch: ...`, then `watch.peak_gib`: the peak in use above the
    start, in GiB (None without nvidia-smi)."""

    def __init__(self, index: int = 0, interval: float = 0.2, read=used_mib):
        self.index, self.interval, self._read = index, interval, read
        self._stop = threading.Event()
        self._start = self._peak = None

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            now = self._read(self.index)
            if now is not None:
                self._peak = now if self._peak is None else max(self._peak, now)

    def __enter__(self) -> "PeakMemory":
        self._start = self._read(self.index)
        if self._start is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._start is not None:
            self._thread.join()

    @property
    def peak_gib(self) -> float | None:
        if self._start is None or self._peak is None:
            return None
        return round(max(self._peak - self._start, 0.0) / 1024, 2)
