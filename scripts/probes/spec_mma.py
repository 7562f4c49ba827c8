"""Probe (issue 57): verify passes on the tensor cores (`decode.triton_pass.
MmaPassDecoder`) against today's passes (`TritonDecoder` with `pass_configs`, as
Chapter 6 builds its target), at Chapter 6's target shape and at the 1B shape, BF16.

    PYTHONPATH=code python scripts/probes/spec_mma.py [--rounds 7] [--quick]

1. Checks on the GPU, first: the MMA pass's logits against the same decoder's
   one-token steps (teacher-forced, the same tokens), T = 2, 5, 8: the largest
   difference and the top-1 agreement (BF16 at both shapes, FP32 at the target's);
   today's rows pass against the steps, for comparison (equal to the bit). Then, in
   FP32, a Speculative pair on the MMA target gives the target alone's tokens (k = 2
   and 4, with a random draft: rejections; with the target as its own draft: every
   proposal accepted if the passes agree with the steps).
2. Timing: the step of the target alone (Chapter 5's tiling), and verify passes of
   T = 2 ... 8 of today's pass decoder (`rows`) and of the MMA one (`mma`), with the
   MMA decoder's own step (`mma` T = 1, which must equal the step), all in the same
   interleaved rounds; at the target's shape also the draft's step and its first step
   of a pass (`refresh`, 2 tokens). Each a CUDA graph of a reset and the call
   (`speculative.repeatable`), REPLAYS replays a call. A line per variant: µs a replay,
   median (min-max), and its ratio to the step, median of the rounds' ratios
   (min-max). The issue's target: mma T = 5 <= 1.2 steps.
3. The speed-up predicted from the measured parts, at acceptance a = 0.6, 0.7, 0.75
   and k = 1 ... 6:

       tokens a pass  E(k) = 1 + a + ... + a^k        (speculative.expected_tokens)
       time a pass    P(k) = refresh + (k - 1) step_draft + pass(k + 1)
       speed-up       E(k) step / P(k)

   (the draft's first step of a pass is its 2-token refresh; the others are steps),
   for today's passes and the MMA passes.
"""

import argparse
import statistics
import time

import torch

from gpuinfer.decode.speculative import Speculative, expected_tokens, repeatable
from gpuinfer.decode.triton_pass import MmaPassDecoder
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.kernels.tiling import pass_configs
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.model.configs import build_model, model_config

TARGET = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4)
DRAFT = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2)
BF16, FP32 = torch.bfloat16, torch.float32
REPLAYS, START, CAPACITY, PROMPT = 20, 150, 256, 128
VOCAB, NEW, DEVICE = 8192, 64, "cuda"  # a dry run on a CPU patches these
T0 = time.time()


def say(*args):
    print(f"[{time.time() - T0:6.1f} s]", *args, flush=True)


def config(sizes):
    return model_config("tiny", vocab_size=VOCAB, tie_word_embeddings=True,
                        max_position_embeddings=2048, **sizes)


def prompt(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g).to(DEVICE)


def forced(decoder, p, ids, queries):
    """(steps (T, V), {T: pass (T, V)}): one-token steps, then passes from the same
    prefill, over the same tokens."""
    with torch.no_grad():
        decoder.prefill(p)
        steps = torch.cat([decoder.step_logits(ids[:, i: i + 1])
                           for i in range(ids.shape[1])]).float()
        out = {}
        for t in queries:  # each pass's kernels compiled at once, in parallel
            compile_ahead(lambda t=t: decoder.device_pass(t))
            decoder.prefill(p)
            out[t] = decoder.pass_logits(ids[:, :t])[0].float()
    return steps, out


def check_logits(label, model, vocab, queries=(2, 5, 8)):
    """The MMA pass and today's rows pass against the steps, teacher-forced."""
    p, ids = prompt(PROMPT, vocab), prompt(max(queries), vocab, seed=5)
    mma = MmaPassDecoder(model, capacity=CAPACITY, max_query=max(queries))
    rows = TritonDecoder(model, capacity=CAPACITY, max_query=max(queries),
                         configs=pass_configs(model.config, True))
    for name, dec in (("mma", mma), ("rows", rows)):
        steps, passes = forced(dec, p, ids, queries)
        for t, got in passes.items():
            ref = steps[:t]
            diff = (ref - got).abs().max().item()
            top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
            rel = diff / ref.abs().max().item()
            say(f"check {label} {name} T={t}: max |diff| {diff:.3g} (rel {rel:.2g}), "
                f"top-1 agreement {top1:.3f}, bit-equal {torch.equal(ref, got)}")
    del mma, rows


def check_speculative():
    """FP32: the pair on the MMA target gives the target alone's greedy tokens."""
    tm = build_model(config(TARGET), seed=0, dtype=FP32, device=DEVICE)
    dm = build_model(config(DRAFT), seed=1, dtype=FP32, device=DEVICE)
    check_logits("target fp32", tm, VOCAB)
    p = prompt(PROMPT, VOCAB, seed=3)
    alone = TritonDecoder(tm, capacity=CAPACITY).generate(p, NEW)
    for k in (2, 4):
        for name, draft_model in (("random draft", dm), ("self draft", tm)):
            target = MmaPassDecoder(tm, capacity=CAPACITY, max_query=k + 1)
            draft = TritonDecoder(draft_model, capacity=CAPACITY, max_query=2)
            spec = Speculative(target, draft, k=k)
            out = spec.generate(p, NEW)
            same = out.eq(alone).double().mean().item()
            say(f"check fp32 speculative k={k} ({name}): equal to alone "
                f"{torch.equal(out, alone)} ({same:.3f} of tokens), passes "
                f"{spec.passes} (all accepted: {-(-(NEW - 1) // (k + 1))})")


def ready(decoder, q):
    fn = decoder.device_step if q == 1 else (lambda: decoder.verify_step(q))
    compile_ahead(fn)
    return repeatable(decoder.pos, START + q - 1, fn)


def ratio(timed, name, base):
    r = [a / b for a, b in zip(timed.times_ms[name], timed.times_ms[base])]
    return statistics.median(r), min(r), max(r)


def time_shape(label, model, queries, draft_model=None, rounds=7):
    """The step, rows and mma passes, (the draft's step and refresh), interleaved."""
    vocab = model.config.vocab_size
    alone = TritonDecoder(model, capacity=CAPACITY)
    rows = TritonDecoder(model, capacity=CAPACITY, max_query=max(queries),
                         configs=pass_configs(model.config, True))
    mma = MmaPassDecoder(model, capacity=CAPACITY, max_query=max(queries))
    say(f"{label}: mma tiling {mma.pass_tiling}")
    fns = {}
    with torch.no_grad():
        for dec in (alone, rows, mma):
            dec.prefill(prompt(PROMPT, vocab))
        fns["step"] = ready(alone, 1)
        fns["mma", 1] = ready(mma, 1)
        for q in queries:
            fns["rows", q] = ready(rows, q)
            fns["mma", q] = ready(mma, q)
        if draft_model is not None:
            draft = TritonDecoder(draft_model, capacity=CAPACITY, max_query=2)
            draft.prefill(prompt(PROMPT, vocab))
            fns["draft step"] = ready(draft, 1)
            compile_ahead(draft.refresh_step)
            fns["draft refresh"] = repeatable(draft.pos, START, draft.refresh_step)
    say(f"{label}: {len(fns)} variants compiled and captured")
    timed = interleaved_rounds({n: lambda f=f: [f() for _ in range(REPLAYS)]
                                for n, f in fns.items()},
                               rounds=rounds, per_call=REPLAYS / 1e3)
    for name in fns:
        t = timed[name]
        med, lo, hi = ratio(timed, name, "step")
        say(f"{label} {str(name):18s} {t.median:8.1f} µs ({t.min:.1f}-{t.max:.1f}) "
            f"= {med:.3f} steps ({lo:.3f}-{hi:.3f})")
    return {name: timed[name].median for name in fns}


def predict(us, queries):
    """Speed-up over the target alone's step, from the measured parts."""
    step, refresh, draft = us["step"], us["draft refresh"], us["draft step"]
    say("prediction: E(k) = 1 + a + ... + a^k tokens a pass; P(k) = refresh "
        f"({refresh:.1f} µs) + (k - 1) draft step ({draft:.1f}) + pass(k + 1); "
        f"speed-up E(k) step ({step:.1f}) / P(k)")
    for way in ("rows", "mma"):
        for a in (0.6, 0.7, 0.75):
            cells = []
            for k in range(1, 7):
                if k + 1 not in queries:
                    continue
                time_k = refresh + (k - 1) * draft + us[way, k + 1]
                cells.append(f"k={k}: {expected_tokens(a, k) * step / time_k:.2f}")
            say(f"predict {way:4s} a={a}: " + "  ".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="T = 2, 5, 7; no 1B")
    a = ap.parse_args()
    queries = [2, 5, 7] if a.quick else list(range(2, 9))
    torch.manual_seed(0)
    tm = build_model(config(TARGET), seed=0, dtype=BF16, device=DEVICE)
    dm = build_model(config(DRAFT), seed=1, dtype=BF16, device=DEVICE)
    check_logits("target bf16", tm, VOCAB)
    check_speculative()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    us = time_shape("target", tm, queries, dm, a.rounds)
    predict(us, queries)
    if a.quick:
        return
    del tm, dm
    torch.cuda.empty_cache()
    bm = build_model(model_config("1b"), seed=0, dtype=BF16, device=DEVICE)
    check_logits("1b bf16", bm, bm.config.vocab_size, queries=(2, 5))
    time_shape("1b", bm, queries, None, a.rounds)
    say("done")


if __name__ == "__main__":
    main()
