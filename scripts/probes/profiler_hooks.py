"""Probe (issue 56): does a profiled run slow the eager loops timed after it?

Chapter 2's context sweep times the lean loop at a 4,096-token prompt at 10.67 ms a step,
where the chapter's rounds, run before any profiling, time it at 4.91 ms; the sweep runs
right after the kernel counts, each a profiled run. Here, in one process: the typical step
of the lean loop and of the naive loop (3 rounds each, as the sweep times them), then one
profiled generation of each (as the chapter counts kernels), then the same timings again;
and the launch cost of a tiny kernel before and after; then two more profiled runs, of the
4-layer model, as the chapter makes, and the timings once more. On the GPU machine:

    PYTHONPATH=code python3 scripts/probes/profiler_hooks.py
"""

import functools

import torch

from gpuinfer.decode import loops as dec
from gpuinfer.measure.launch import launch_us
from gpuinfer.measure.profiling import profile_decode
from gpuinfer.measure.rounds import split_rounds
from gpuinfer.model.configs import build_model, model_config, random_prompt

torch.set_float32_matmul_precision("highest")
dev = torch.device("cuda")
config = model_config("small")
model = build_model(config, seed=0, device=dev, attn_implementation="eager")
TOKENS, ROUNDS = 16, 3
prompts = {n: random_prompt(config, n, device=dev) for n in (32, 4096)}


def typical(name: str, length: int) -> str:
    """The typical decode step (ms): median of the rounds, and their range."""
    fn = functools.partial(dec.LOOPS[name], model, prompts[length], TOKENS)
    t = split_rounds({name: fn}, TOKENS, rounds=ROUNDS, warmup=1).typical[name]
    return f"{t.median:7.3f} ms ({t.min:.3f}-{t.max:.3f})"


def measure(when: str) -> None:
    cost = launch_us(rounds=30)
    print(f"--- {when}: launch {cost}", flush=True)
    for name in ("lean", "naive"):
        for length in (32, 4096):
            print(f"{when:7} {name:6} prompt {length:5}: {typical(name, length)}",
                  flush=True)


measure("before")
for name in ("naive", "lean"):  # as Chapter 2 counts each loop's kernels
    profile_decode(dec.LOOPS[name], model, prompts[32], 8, keep_steps=3)
measure("after 2")
# Chapter 2 counts the kernels of the 4-layer model too: four profiled runs in all
tiny = build_model(model_config("tiny"), seed=0, device=dev, attn_implementation="eager")
tiny_prompt = random_prompt(tiny.config, 32, device=dev)
for name in ("naive", "lean"):
    profile_decode(dec.LOOPS[name], tiny, tiny_prompt, 8, keep_steps=3)
measure("after 4")
