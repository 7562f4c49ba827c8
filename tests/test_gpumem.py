"""The peak GPU memory a recording stores: the watch's arithmetic, with a fake reader."""

import time

from gpuinfer.publish import gpumem


def test_the_peak_above_the_start_in_gib():
    readings = iter([1024.0, 2048.0, 9216.0, 4096.0] + [3072.0] * 1000)
    with gpumem.PeakMemory(interval=0.001, read=lambda index: next(readings)) as watch:
        time.sleep(0.05)
    assert watch.peak_gib == 8.0  # 9216 MiB in use at the peak, 1024 before the start


def test_nothing_is_reported_without_a_reading():
    with gpumem.PeakMemory(interval=0.001, read=lambda index: None) as watch:
        time.sleep(0.01)
    assert watch.peak_gib is None


def test_a_cpu_machine_reads_nothing(monkeypatch):
    monkeypatch.setattr(gpumem.shutil, "which", lambda name: None)
    assert gpumem.used_mib() is None
