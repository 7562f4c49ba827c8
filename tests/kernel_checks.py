"""What the kernel tests share: the device they run on, outputs poisoned with NaN, the
relative error of an output, seeded random inputs, NumPy kept quiet under Triton's
interpreter (`quiet_numpy`: import it into a test module and it applies to every test
there), and a script run in a Python that compiles kernels (`compiled_run`)."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def quiet_numpy():
    with warnings.catch_warnings():  # the interpreter's exp overflows to inf, as meant
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def compiled_run(script: str, *args: str,
                 timeout: int = 600) -> subprocess.CompletedProcess:
    """`script` (its argv `args`) in a fresh Python that compiles kernels rather than
    interpreting them, with this checkout's package; stdout and stderr captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = Path(__file__).resolve().parent.parent / "code"
    env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", script, *args], env=env, check=False,
                          capture_output=True, text=True, timeout=timeout)


def run_output(proc: subprocess.CompletedProcess) -> str:
    """What a `compiled_run` shows when a check fails: its output, its errors' tail."""
    return proc.stdout + proc.stderr[-3000:]


def unspilled_lines(script: str, count: int) -> tuple[list[str], str]:
    """The lines `script` printed (one a compiled kernel, with its
    `aot.resource_usage`), once checked: it exited 0, printed `count` lines, and no
    kernel spilled ('stack': 0). Returns them and the output a failed check shows."""
    proc = compiled_run(script)
    out = run_output(proc)
    assert proc.returncode == 0, out
    lines = proc.stdout.splitlines()
    assert len(lines) == count, out
    assert all("'stack': 0," in line for line in lines), out
    return lines, out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in FP64: NaN if any element of out is NaN."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


def randn(*shape, dtype=torch.float32, scale=1.0, seed=None):
    """Normal values drawn on the device, after seeding torch's generator if `seed`."""
    if seed is not None:
        torch.manual_seed(seed)
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def fixed_randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    """Normal values drawn on the CPU from a generator of their own: the same values on
    every device, and torch's global generator left alone."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def poisoned(*shape, dtype):
    """An output buffer of NaN: an element a kernel fails to write fails the test."""
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


def graphed_chain_error(product, reference, *, scale, links=10, n=1024):
    """`links` dependent BF16 products of n × n weights, each reading the last one's output
    (product(w, x, out)), captured in a CUDA graph with their outputs poisoned before
    the replay: the relative error of the chain's last output against `reference`
    applied link by link. A PDL wait that fails to order the links shows here."""
    ws = [randn(n, n, dtype=torch.bfloat16, seed=i, scale=scale) for i in range(links)]
    x0 = randn(n, dtype=torch.bfloat16)
    bufs = [x0.clone()] + [poisoned(n, dtype=torch.bfloat16) for _ in ws]

    def chain():
        for i, w in enumerate(ws):
            product(w, bufs[i], bufs[i + 1])

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for b in bufs[1:]:
        b.fill_(float("nan"))
    graph.replay()
    ref = x0
    for w in ws:
        ref = reference(w, ref)
    return rel_err(bufs[-1], ref)
