"""Probe (issue 57): where the speculative loop's own time goes.

Chapter 6 (H200, 2026-12-05 19:14 UTC) measured a pass inside a generation at 456 µs,
against 438 µs for its parts timed apart (the draft's k steps and the verify pass, each
a graph replay from a reset position): the loop adds 18 µs a pass (4.1 %), about the
gap between the measured 1.69x and the predicted 1.77x. A generation differs from the
parts by (1) one graph a pass instead of two, (2) the position copied to pinned memory
and an event recorded behind every pass, (3) the host's wait for the oldest of two
positions in flight, and near the end for each one, the GPU idle meanwhile.

At Chapter 6's shapes, k = 4, random weights (a random draft agrees by chance, so a pass
commits one token; the loop's costs do not depend on how many), µs a pass, interleaved:

a. "parts": the draft's k steps and the verify pass, each replayed from a reset position;
b. "graphs": the whole pass's graph (`Speculative.one_pass`) replayed N times back to back;
c. "graphs + copies": as b, each pass followed by the position's copy and an event, as
   `PositionReads.queue` does, never waited for;
d. "generate": `Speculative.generate` of N tokens, less a generation of one (the
   prefill), over its passes;
e. "generate, 4 in flight": d's loop with four positions in flight, not two;
f. "generate, read every 2nd": d's loop with a copy after every second pass only.

b - a/N says what one graph a pass saves or costs, c - b what the copies cost, d - c
what the reads and the serial end cost, e and f what two cheaper loops would give.

H100, 2026-12-05 22:12 UTC (spec_loop-2026-12-05n-H100.txt), µs a pass over the parts'
517.9: graphs -0.6, graphs + copies +8.3, generate (two in flight) +11.5, four in flight
-4.4, a read every 2nd pass -7.3. The next recording's series (pending/next-recording)
keeps four in flight. Added since, to say why four beat two though the GPU always had a
pass queued:
g. "graphs + events": as b with an event after each pass and no copy;
h. "graphs + kernel": as b with the position stored into pinned host memory by a
   one-program Triton kernel after each pass (no copy engine), and an event;
i. "generate, 2 in flight" (the old loop), "3 in flight", "4, read every 2nd".

    PYTHONPATH=code timeout 300 python scripts/probes/spec_loop.py [--rounds 7] [--smoke]

About 1.5 minutes on an H100 (estimate: compiles and captures, then 7 rounds of 6
variants of ~30 ms).
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

if "--smoke" in sys.argv:  # before any kernel module is imported
    from gpuinfer.kernels.interpret import use_interpreter
    use_interpreter()
import spec_mma as sm  # noqa: E402  TARGET, DRAFT, config, prompt, say
from gpuinfer.decode.speculative import (PositionReads, Speculative,  # noqa: E402
                                         repeatable)
from gpuinfer.decode.triton_pass import MmaPassDecoder  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.kernels.common import compile_ahead  # noqa: E402
from gpuinfer.measure.rounds import interleaved_rounds  # noqa: E402
from gpuinfer.model.configs import build_model  # noqa: E402

K, PASSES, PROMPT = 4, 64, 128
CAPACITY = 512  # the prompt and 64 passes of up to k + 1 slots each, with room to spare
say = sm.say


@triton.jit
def publish_kernel(pos_ptr, host_ptr):
    tl.store(host_ptr, tl.load(pos_ptr))


def loop(spec, run, prompt_ids, new_tokens, most, every):
    """`Speculative.generate`'s loop with `most` positions in flight, a copy after every
    `every`-th pass only (the passes between are queued without one)."""
    start = prompt_ids.shape[1]
    spec.prefill(prompt_ids)
    last, known, passes = start + new_tokens - 1, start, 0
    reads = PositionReads(spec.pos, most=most)
    while known < last:
        while reads.in_flight < most and \
                known + (reads.in_flight * every + every - 1) * (K + 1) < last:
            for _ in range(every):
                run()
                passes += 1
            reads.queue()
        if reads.in_flight == 0:  # near the end: one pass at a time, each read
            run()
            passes += 1
            reads.queue()
        known = reads.oldest()
    return passes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="tiny, CPU, interpreted")
    a = ap.parse_args()
    global PASSES, PROMPT, CAPACITY
    target_sizes, draft_sizes = sm.TARGET, sm.DRAFT
    if a.smoke:
        sm.DEVICE, sm.VOCAB = "cpu", 256
        PASSES, PROMPT, CAPACITY, a.rounds = 3, 8, 64, 1
        target_sizes = draft_sizes = dict(hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2)
    tm = build_model(sm.config(target_sizes), seed=0, dtype=sm.BF16, device=sm.DEVICE)
    dm = build_model(sm.config(draft_sizes), seed=1, dtype=sm.BF16, device=sm.DEVICE)
    target = MmaPassDecoder(tm, capacity=CAPACITY, max_query=K + 1)
    draft = TritonDecoder(dm, capacity=CAPACITY, max_query=2)
    spec = Speculative(target, draft, k=K)
    p = sm.prompt(PROMPT, sm.VOCAB)
    with torch.no_grad():
        spec.generate(p, PASSES)  # compiles and captures the pass of k
        run = spec.one_pass(K)
        say(f"a random pair: {spec.passes} passes for {PASSES} tokens")
        # the parts, as Chapter 6 times them: each from a reset position
        compile_ahead(draft.refresh_step)
        compile_ahead(draft.device_step)
        compile_ahead(lambda: target.verify_step(K + 1))
        start = PROMPT + K
        parts = {
            "draft refresh": repeatable(spec.pos, PROMPT, draft.refresh_step),
            "draft step": repeatable(spec.pos, PROMPT + 1, draft.device_step),
            "verify": repeatable(spec.pos, start, lambda: target.verify_step(K + 1)),
        }
    cuda = spec.pos.is_cuda

    def graphs(after=None):
        """The pass's graph PASSES times from the prompt's end, each replay followed by
        `after`: nothing, "copy" (the position's copy and an event, as `generate`),
        "events" (an event only) or "kernel" (a kernel storing the position into pinned
        memory, and an event)."""
        reads = PositionReads(spec.pos, most=PASSES)  # its events made once, reused
        host = torch.empty(PASSES, dtype=spec.pos.dtype, pin_memory=cuda)

        def fn():
            spec.pos.fill_(PROMPT)
            reads.slots.clear()  # never read: only the copies and events are timed
            for i in range(PASSES):
                run()
                if after == "copy":
                    reads.queue()
                    continue
                if after == "kernel":  # no copy engine
                    publish_kernel[(1,)](spec.pos, host[i:])
                if after and cuda:
                    reads.events[i].record()
        return fn

    def gen(most=None, every=1, tokens=PASSES):
        def fn():
            if most is None:
                return spec.generate(p, tokens)
            return loop(spec, run, p, tokens, most, every)
        return fn

    fns = {name: (lambda f=f: [f() for _ in range(PASSES)]) for name, f in parts.items()}
    fns |= {"graphs": graphs(), "graphs + copies": graphs("copy"),
            "graphs + events": graphs("events"), "graphs + kernel": graphs("kernel"),
            "generate": gen(), "generate, 2 in flight": gen(2),
            "generate, 3 in flight": gen(3), "generate, 4, read every 2nd": gen(4, 2),
            "generate, 2, read every 2nd": gen(2, 2), "prefill": gen(tokens=1)}
    looped = [n for n in fns if n.startswith("generate,")]
    passes = {n: PASSES for n in fns if n.startswith("graphs")}
    with torch.no_grad():
        try:  # a pinned host pointer handed to a Triton kernel
            fns["graphs + kernel"]()
        except Exception as e:  # noqa: BLE001  the probe says so and goes on
            say(f"graphs + kernel refused: {type(e).__name__}: {e}")
            del fns["graphs + kernel"], passes["graphs + kernel"]
        fns["generate"]()
        passes["generate"] = spec.passes
        for name in looped:
            passes[name] = fns[name]()
            say(f"{name}: {passes[name]} passes for {PASSES} tokens")
            assert 1 <= passes[name] <= PASSES, passes[name]
        timed = interleaved_rounds(fns, rounds=a.rounds)
    med = {n: 1e3 * timed[n].median for n in fns}  # µs a call
    span = {n: (1e3 * timed[n].min, 1e3 * timed[n].max) for n in fns}
    part = (med["draft refresh"] + (K - 1) * med["draft step"] + med["verify"]) / PASSES
    say(f"parts: refresh {med['draft refresh'] / PASSES:.1f}, draft step "
        f"{med['draft step'] / PASSES:.1f}, verify {med['verify'] / PASSES:.1f} µs; "
        f"a pass by its parts {part:.1f} µs")
    for name in [n for n in fns if n.startswith(("graphs", "generate"))]:
        total = med[name] - (med["prefill"] if name.startswith("generate") else 0)
        lo, hi = span[name]
        each = total / passes[name]
        say(f"{name:26s} {each:7.1f} µs a pass ({passes[name]} passes; calls "
            f"{lo:.0f}-{hi:.0f} µs), {each - part:+6.1f} over the parts")
    if not cuda:
        say("(CPU: host clock, not a GPU measurement)")
    say("done")


if __name__ == "__main__":
    sys.exit(main())
