"""Probe (issue 57): bisect "an illegal memory access" that `spec_rows.py --variants`
hit with several TritonDecoders of other gate/up and down tilings in one process.

An illegal access poisons the CUDA context, so every case runs in a fresh process, and
the parent prints one line per case: its return code and the child's last line. The
axes, one at a time from a case that works:

  tiling   each of spec_rows.VARIANTS alone (base, one tile, one tile w8, ...)
  T        the step (T = 1) and a verify pass of T = 5
  compile  `compile_ahead` (threads compile while nothing runs) or the first launch
  run      eager launches, or a captured CUDA graph replayed (`repeatable`)
  several  the tiling after a decoder of the base tiling in the same process

An eager child runs with CUDA_LAUNCH_BLOCKING=1, so the failing kernel is the one named
(a graphed one without: its replay reports the fault at the next synchronize).
Usage on the GPU: PYTHONPATH=code python scripts/probes/spec_bisect.py  (~3-4 min)
Skip the first N cases: ... spec_bisect.py --from N
A child alone: ... spec_bisect.py --child "one tile w8" 5 ahead graph 0
"""

import os
import subprocess
import sys
import time

CHILD_TIMEOUT_S = 120


def child(name: str, query: int, compile_mode: str, run: str, several: bool) -> None:
    import torch

    from gpuinfer.decode.speculative import repeatable
    from gpuinfer.decode.triton_step import TritonDecoder
    from gpuinfer.kernels.common import compile_ahead
    from gpuinfer.model.configs import build_model
    from spec_rows import TARGET, VARIANTS, config, prompt

    model = build_model(config(TARGET), seed=0, dtype=torch.bfloat16, device="cuda")
    decoders = []
    if several:
        base = TritonDecoder(model, capacity=256, max_query=5, configs=VARIANTS["base"])
        base.prefill(prompt(128, 8192))
        decoders.append(base)
    dec = TritonDecoder(model, capacity=256, max_query=5, configs=VARIANTS[name])
    dec.prefill(prompt(128, 8192))
    decoders.append(dec)
    for d in decoders:
        fn = d.device_step if query == 1 else (lambda d=d: d.verify_step(query))
        if compile_mode == "ahead":
            compile_ahead(fn)
        if run == "graph":
            replay = repeatable(d.pos, 150 + query - 1, fn)
            for _ in range(20):
                replay()
        else:
            for _ in range(20):
                d.pos.fill_(150 + query - 1)
                fn()
        torch.cuda.synchronize()
    print("ok", flush=True)


CASES = [(name, q, "ahead", "graph", False)
         for name in ("base", "one tile", "one tile w8", "one tile gu2", "one tile dn2")
         for q in (1, 5)]
CASES += [("one tile w8", q, c, r, s) for q in (5,) for c in ("ahead", "launch")
          for r in ("eager", "graph") for s in (False, True)]


def parent(first: int = 0) -> None:
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    cases = list(dict.fromkeys(CASES))  # each case once, in order
    # the cases with several decoders first: the fault was seen there
    cases = [k for k in cases if k[4]] + [k for k in cases if not k[4]]
    for name, q, c, r, s in cases[first:]:
        t0 = time.perf_counter()
        try:
            argv = [sys.executable, __file__, "--child", name, str(q), c, r, f"{s:d}"]
            blocking = {"CUDA_LAUNCH_BLOCKING": "1"} if r == "eager" else {}
            done = subprocess.run(argv, env=env | blocking, capture_output=True,
                                  text=True, timeout=CHILD_TIMEOUT_S)
            lines = (done.stdout + done.stderr).strip().splitlines() or ["(no output)"]
            rc, last = done.returncode, lines[-1][:120]
        except subprocess.TimeoutExpired:
            rc, last = "timeout", f"over {CHILD_TIMEOUT_S} s"
        took = time.perf_counter() - t0
        print(f"{name:14s} T={q} {c:6s} {r:5s} several={s:d}: rc {rc}, {took:5.1f} s, "
              f"{last}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        name, q, c, r, s = sys.argv[2:7]
        child(name, int(q), c, r, bool(int(s)))
    else:  # `--from N` skips the first N cases (a rerun after a cut)
        parent(int(sys.argv[2]) if sys.argv[1:2] == ["--from"] else 0)
