"""gpuinfer.env: what every recording says about the machine that made it (the GPU and the
host CPU: model, logical CPUs, clock; Triton's version), and the box a chapter opens with."""

import os
import platform
import shutil

import pytest

from gpuinfer import env

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.123

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 3800.000
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host whose /proc/cpuinfo and cpufreq files are files of the test."""
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    monkeypatch.setattr(env, "CPUINFO", str(tmp_path / "cpuinfo"))
    sources = ((str(tmp_path / "scaling_max_freq"), "maximum (cpufreq scaling_max_freq)"),
               (str(tmp_path / "cpuinfo_max_freq"), "maximum (cpufreq cpuinfo_max_freq)"))
    monkeypatch.setattr(env, "CLOCK_SOURCES", sources)
    return tmp_path


def test_provenance_names_the_host_and_triton():
    info = env.provenance()
    assert info["cpu_model"] and isinstance(info["cpu_model"], str)
    assert info["cpu_count"] == len(os.sched_getaffinity(0))  # this process's CPUs
    clock, source = info["cpu_clock_ghz"], info["cpu_clock_source"]
    assert (clock is None) == (source is None)
    assert clock is None or 0.1 < clock < 10  # GHz, whatever file it came from
    assert "triton" in info  # None where it is not installed
    assert info["cpu"] == (platform.processor() or platform.machine())  # as before


def test_the_cpu_model_and_the_clock_from_the_files(host):
    assert env.cpu_model() == "Intel(R) Xeon(R) Platinum 8480+"
    # no cpufreq: the clock of the moment, from /proc/cpuinfo (its first CPU), said so
    assert env.cpu_clock() == (2.0, "current (/proc/cpuinfo cpu MHz)")
    (host / "cpuinfo_max_freq").write_text("3800000\n")  # kHz
    assert env.cpu_clock() == (3.8, "maximum (cpufreq cpuinfo_max_freq)")
    (host / "scaling_max_freq").write_text("3500000\n")  # the driver's limit comes first
    assert env.cpu_clock() == (3.5, "maximum (cpufreq scaling_max_freq)")


def test_no_readable_clock_or_model_is_said_not_guessed(host, monkeypatch):
    (host / "scaling_max_freq").write_text("not a number\n")
    (host / "cpuinfo").write_text("processor\t: 0\nHardware\t: some board\n")
    assert env.cpu_clock() == (None, None)
    assert env.cpu_model() == (platform.processor() or platform.machine() or "unknown")
    monkeypatch.setattr(env, "CPUINFO", str(host / "absent"))
    assert env.cpu_clock() == (None, None) and env.cpu_model()


def test_host_text_of_a_recording_and_of_one_made_before_it_was_recorded():
    info = {"cpu_model": "AMD EPYC 9654", "cpu_count": 16, "cpu_clock_ghz": 3.7,
            "cpu_clock_source": "maximum (cpufreq scaling_max_freq)"}
    assert env.host_text(info) == ("AMD EPYC 9654, 16 logical CPUs, 3.7 GHz maximum "
                                   "(cpufreq scaling_max_freq)")
    assert env.host_text({**info, "cpu_clock_ghz": None, "cpu_clock_source": None}) == \
        "AMD EPYC 9654, 16 logical CPUs, clock not readable"
    assert env.host_text({"cpu": "x86_64", "gpu": "NVIDIA H200"}) == "not recorded"


def test_announce_caps_memory_and_shows_only_the_smoke_warning(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    monkeypatch.setattr(env, "cap_gpu_memory", lambda: 21.0)  # what a GPU run returns
    monkeypatch.setattr(env, "provenance", lambda: {"smoke": False, "gpu": "NVIDIA H200"})
    info = env.announce()
    assert info["gpu_memory_cap_gib"] == 21.0 and shown == []  # the page's box shows it
    monkeypatch.setattr(env, "provenance", lambda: {"smoke": True, "gpu": None})
    env.announce()
    assert [env.SMOKE_WARNING in obj.data for obj in shown] == [True]


# Scratch folders: clean-up deletes only what this package made (issue 56)
# ---------------------------------------------------------------------------------------

def dead_pid() -> int:
    """The pid of a process that has ended."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


@pytest.fixture
def tmpdir_of_test(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_scratch_folder_holds_its_marker_and_a_killed_runs_is_removed(tmpdir_of_test):
    path = env.scratch_dir("test")
    marker = os.path.join(path, env.SCRATCH_MARKER)
    assert open(marker).read().strip() == str(os.getpid())
    pid = dead_pid()  # as a run killed before its exit handler ran leaves one
    left = tmpdir_of_test / f"gpuinfer-{pid}-artifacts-abc"
    left.mkdir()
    (left / env.SCRATCH_MARKER).write_text(f"{pid}\n")
    assert env.remove_stale_scratch() == [str(left)]
    assert os.path.isdir(path)  # this process's own stays


def test_a_hand_made_look_alike_survives_clean_up(tmpdir_of_test):
    import subprocess
    import sys
    from pathlib import Path

    pid = dead_pid()
    mine = tmpdir_of_test / f"gpuinfer-{pid}-x"  # a person's folder: no marker
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    forged = tmpdir_of_test / f"gpuinfer-{pid}-y"  # a marker of another pid: not ours
    forged.mkdir()
    (forged / env.SCRATCH_MARKER).write_text("1\n")
    assert env.remove_stale_scratch() == []
    env.artifact_dir("ch")  # the call the chapters make (it cleans up on first use)
    killed = tmpdir_of_test / f"gpuinfer-{pid}-z"  # a killed run's: --recover removes it
    killed.mkdir()
    (killed / env.SCRATCH_MARKER).write_text(f"{pid}\n")
    book = tmpdir_of_test / "book"
    shutil.copytree(Path(__file__).parent / "fixtures" / "book", book,
                    ignore=shutil.ignore_patterns("_build", "_recorded"))
    path = os.pathsep.join([str(Path(env.__file__).parents[1]),
                            os.environ.get("PYTHONPATH", "")])  # this tree's package
    subprocess.run([sys.executable, "-m", "gpuinfer.publish.record", "--root", str(book),
                    "--recover"], check=True, capture_output=True,
                   env={**os.environ, "TMPDIR": str(tmpdir_of_test), "PYTHONPATH": path})
    assert not killed.exists()  # --recover reached the clean-up
    assert (mine / "notes.txt").read_text() == "keep me" and forged.is_dir()


def test_provenance_parses_cpuinfo_once(host, monkeypatch):
    import builtins

    opened, real = [], builtins.open

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    info = env.provenance()
    assert opened.count(env.CPUINFO) == 1
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["cpu_clock_ghz"] == 2.0
