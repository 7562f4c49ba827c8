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

2026-12-06 (spec_loop-2026-12-06d-H200.txt), µs a pass: graphs 508.6, graphs + copies
518.6, graphs + events 508.7, graphs + kernel 512.8: the copy node costs ~10 µs a pass,
an event nothing, a kernel's store into pinned memory ~4. So the position is now stored by
the pass itself, its last kernel captured into its graph (`PositionReads.publish`,
`kernels.position_ring`), and `PositionReads.queue` records an event only. The variants
since:

a. "parts", as above;
b. "graphs, bare": a graph of the pass without the position's store, back to back;
c. "graphs + copies": b, each replay followed by the old copy and event (`copy_behind`);
d. "graphs": the pass's graph (`Speculative.one_pass`, the store its last kernel);
e. "graphs + events": d with an event after each replay, as `generate` records;
f. "generate": `Speculative.generate`, `IN_FLIGHT` passes in flight;
g. "generate, 2 in flight": f's loop (`loop`) with two.

d - b is the store's cost, e - d the events', f - e the reads' and the serial end's. Each
generation subtracts its own one-token run (`_start`'s checks and the prefill):
the loop variants up to 2026-12-06 called the prefill alone yet had generate's one-token
run subtracted, which made them look ~15 µs a pass faster than `generate`.

    PYTHONPATH=code timeout 300 python scripts/probes/spec_loop.py [--rounds 7] [--smoke]

About 1.5 minutes on an H100 (estimate: compiles and captures, then 7 rounds of 11
calls of ~30 ms).
"""

import argparse
import sys

import torch

if "--smoke" in sys.argv:  # before any kernel module is imported
    from gpuinfer.kernels.interpret import use_interpreter
    use_interpreter()
import spec_mma as sm  # noqa: E402  TARGET, DRAFT, config, prompt, say
from gpuinfer.decode.interface import graphed_step  # noqa: E402
from gpuinfer.decode.speculative import Speculative, repeatable  # noqa: E402
from gpuinfer.decode.triton_pass import MmaPassDecoder  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.kernels.common import compile_ahead  # noqa: E402
from gpuinfer.measure.rounds import interleaved_rounds  # noqa: E402
from gpuinfer.model.configs import build_model  # noqa: E402

K, PASSES, PROMPT = 4, 64, 128
CAPACITY = 512  # the prompt and 64 passes of up to k + 1 slots each, with room to spare
say = sm.say


def copy_behind(pos, slot, event):
    """The position's way to the host up to 2026-12-06 (`PositionReads.queue` then): a
    copy behind the pass into a pinned slot, and an event (None on a CPU)."""
    slot.copy_(pos, non_blocking=True)
    if event is not None:
        event.record()


def loop(spec, prompt_ids, new_tokens, most):
    """`Speculative.generate` with at most `most` passes in flight, not `IN_FLIGHT`: its
    checks, capture and prefill (`_start`) and its copy of the tokens too, so that only
    the loop differs. Returns the number of passes."""
    run, k, start = spec._start(prompt_ids, new_tokens, K)
    reads = spec.reads
    reads.reset()
    last, known, passes = start + new_tokens - 1, start, 0
    while known < last:
        while reads.in_flight < most and known + reads.in_flight * (k + 1) < last:
            run()
            reads.queue()
            passes += 1
        known = reads.oldest()
    spec.passes, spec.host_pos = passes, known
    spec._tokens(start, new_tokens)
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
    cuda = spec.pos.is_cuda
    with torch.no_grad():
        spec.generate(p, PASSES)  # compiles and captures the pass of k
        run = spec.one_pass(K)
        say(f"a random pair: {spec.passes} passes for {PASSES} tokens")
        # the pass without the position's store: its own graph
        steps, check = spec.draft_fn(K), spec.verifier.fn(K + 1)

        def bare_pass():
            steps()
            check()

        bare = bare_pass
        if cuda:
            bare = graphed_step(spec, bare_pass, warmup=2, span=K + 1, first_slot=1)
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
    # made once, reused by every call: only the copies and the events are timed
    events = [torch.cuda.Event() if cuda else None for _ in range(PASSES)]
    host = torch.empty(PASSES, dtype=spec.pos.dtype, pin_memory=cuda)

    def graphs(replay, after=None):
        """`replay` PASSES times from the prompt's end, each followed by `after`:
        nothing, "copy" (`copy_behind`) or "event" (an event only, as `generate`)."""
        def fn():
            spec.pos.fill_(PROMPT)
            for i in range(PASSES):
                replay()
                if after == "copy":
                    copy_behind(spec.pos, host[i: i + 1], events[i])
                elif after == "event" and cuda:
                    events[i].record()
        return fn

    def gen(most=None, tokens=PASSES):
        def fn():
            if most is None:
                spec.generate(p, tokens)
                return spec.passes
            return loop(spec, p, tokens, most)
        return fn

    gens = {"generate": None, "generate, 2 in flight": 2}
    fns = {name: (lambda f=f: [f() for _ in range(PASSES)]) for name, f in parts.items()}
    fns |= {"graphs, bare": graphs(bare), "graphs + copies": graphs(bare, "copy"),
            "graphs": graphs(run), "graphs + events": graphs(run, "event")}
    fns |= {name: gen(most) for name, most in gens.items()}
    fns |= {f"{name} (1 token)": gen(most, tokens=1) for name, most in gens.items()}
    passes = {n: PASSES for n in fns if n.startswith("graphs")}
    with torch.no_grad():
        for name in gens:
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
    each = {}
    for name in passes:
        one = med[f"{name} (1 token)"] if name in gens else 0  # its own one-token run
        lo, hi = span[name]
        each[name] = (med[name] - one) / passes[name]
        say(f"{name:26s} {each[name]:7.1f} µs a pass ({passes[name]} passes; calls "
            f"{lo:.0f}-{hi:.0f} µs), {each[name] - part:+6.1f} over the parts")
    say(f"the store in the graph {each['graphs'] - each['graphs, bare']:+.1f}, the old "
        f"copy and event {each['graphs + copies'] - each['graphs, bare']:+.1f}, the "
        f"events {each['graphs + events'] - each['graphs']:+.1f}, the reads and the "
        f"serial end {each['generate'] - each['graphs + events']:+.1f} µs a pass")
    if not cuda:
        say("(CPU: host clock, not a GPU measurement)")
    say("done")


if __name__ == "__main__":
    sys.exit(main())
