"""Probe (issue 57, `best_tokens_per_pass`): does a wider draft, or one started from the
target's own embedding and layers, agree with Chapter 6's target more, and what do its k
steps cost on the chapter's kernels?

Trains the chapter's target exactly as Chapter 6 does (494 steps of 32 windows, seed 0),
then, for each draft variant, distils it from the target as the chapter distils its draft
(mix 0: the KL alone, 247 steps of 64 windows, seed 1, the chapter's learning rate unless
the variant says otherwise). For each variant it prints:
* the KL held out / its final training KL (the issue's "within 15 %");
* a: the chapter's teacher-forced agreement, on the BF16 kernels, on the chapter's 6
  held-out prompts and on 16 (prompts spread evenly over the held-out stream);
* tokens per pass of speculative decoding on the kernels (graphed), k = 2, 3, 4, 6, on
  the 16 prompts (96 new tokens each), as the chapter counts them;
* the draft's k steps of a pass, µs (interleaved rounds, median), and the predicted
  speed-up E_measured(k) x step / (draft(k) + pass(k + 1)) with the target's step and
  passes timed in the same rounds.

Variants (--variants, comma-separated): base (the chapter's 2 x 384), w512, w768, w1024
(2 layers of the target's width, from scratch), t1024 (the target's embedding, its first
two layers and final norm copied, then distilled at the target's learning rate), t1024x1
(one layer, likewise).

    PYTHONPATH=code python scripts/probes/draft_width.py --variants base,w768,w1024,t1024
"""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import copy
import gc
import sys
import time

import torch
import transformers

if "--smoke" in sys.argv:  # before the kernels are imported
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()

from gpuinfer.decode import speculative
from gpuinfer.decode.triton_pass import MmaPassDecoder
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.measure import quality
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.model import corpus, stdlib_corpus, train as tr
from gpuinfer.model.configs import build_model, model_config
from gpuinfer.decode.static import capacity_for

VOCAB, SEQ, WARMUP = 8192, 512, 60
TARGET = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4)
BASE = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2)
WIDE = dict(TARGET, num_hidden_layers=2)
VARIANTS = {  # name: (shape, copy the target's first layers?, learning rate[, frozen
    # embedding (the tied LM head with it)?, steps])
    "base": (BASE, False, 2e-3),
    "w512": (dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2), False, 2e-3),
    "w768": (dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=2,
                  num_attention_heads=12, num_key_value_heads=4), False, 2e-3),
    "w1024": (WIDE, False, 2e-3),
    "t1024": (WIDE, True, 6e-4),
    "t1024x1": (dict(WIDE, num_hidden_layers=1), True, 6e-4),
    "t1024-lr3": (WIDE, True, 3e-4),
    "t1024-frozen": (WIDE, True, 6e-4, True),
    "t1024-frozen-lr3": (WIDE, True, 3e-4, True),
    "t1024-160": (WIDE, True, 6e-4, False, 160),
    "t1024-frozen-lr45": (WIDE, True, 4.5e-4, True),
    "ends-frozen-lr3": (WIDE, "ends", 3e-4, True),
    "ends-frozen": (WIDE, "ends", 6e-4, True),
    "ends-frozen-lr45": (WIDE, "ends", 4.5e-4, True),
}
STEPS, BATCH, LR = dict(target=494, draft=247), dict(target=32, draft=64), 6e-4
PROMPT_LEN, NEW, KS, ROUNDS, REPLAYS = 128, 96, [2, 3, 4, 6], 5, 20
BF16 = torch.bfloat16


def config(sizes, vocab):
    return model_config("tiny", vocab_size=vocab, tie_word_embeddings=True,
                        max_position_embeddings=2048, **sizes)


def prompts_of(heldout, n, dev):
    spacing = heldout.numel() // n
    return [heldout[i * spacing: i * spacing + PROMPT_LEN][None].to(dev)
            for i in range(n)]


def from_target(draft, target, ends=False):
    """The draft's embedding, layers and final norm copied from the target's: its first
    layers, or (ends) its first and its last."""
    layers = list(target.model.layers)
    if ends:
        layers = layers[:len(draft.model.layers) - 1] + layers[-1:]
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
        for mine, theirs in zip(draft.model.layers, layers):
            mine.load_state_dict(theirs.state_dict())


def agreement(draft_dec, prompts, refs):
    with torch.no_grad():
        forced = [quality.forced_decoder_logits(draft_dec, p, r[None])
                  for p, r in zip(prompts, refs)]
    return float(torch.cat([f.argmax(-1) for f in forced], 1).eq(
        torch.cat(refs).view(1, -1)).double().mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="base,w768,w1024,t1024")
    parser.add_argument("--smoke", action="store_true", help="tiny, on the CPU")
    args = parser.parse_args()
    names = args.variants.split(",")
    transformers.logging.set_verbosity_error()
    torch._dynamo.config.automatic_dynamic_shapes = False
    global TARGET, SEQ, WARMUP, PROMPT_LEN, NEW, ROUNDS, REPLAYS
    files = stdlib_corpus.stdlib_files()
    if args.smoke:  # a test of the code path
        dev, files, SEQ, WARMUP, PROMPT_LEN, NEW, ROUNDS, REPLAYS = \
            torch.device("cpu"), files[:100], 64, 2, 16, 8, 1, 1
        TARGET = dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
        small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
        VARIANTS.update(base=(small, False, 3e-3), w1024=(TARGET, False, 3e-3),
                        t1024=(TARGET, True, 1e-3))
        STEPS.update(target=4, draft=3)
        BATCH.update(target=2, draft=2)
    else:
        dev = torch.device("cuda")
        print(torch.cuda.get_device_name(), flush=True)
    data = corpus.build(files, vocab_size=512 if args.smoke else VOCAB)
    target_model = build_model(config(TARGET, data.vocab_size), seed=0, device=dev)
    log = tr.train(target_model, data.train, steps=STEPS["target"],
                   batch=BATCH["target"], seq_len=SEQ, lr=LR, warmup=WARMUP, seed=0,
                   log_every=STEPS["target"], name="target")
    held = tr.heldout_loss(target_model, data.heldout, seq_len=SEQ)
    print(f"target: train {log.final_loss:.3f} held {held:.3f} "
          f"x{held / log.final_loss:.3f} ({log.seconds:.0f} s)", flush=True)
    capacity = capacity_for(PROMPT_LEN, NEW + max(KS) + 1)
    rounded_target = copy.deepcopy(target_model).to(BF16)
    alone = TritonDecoder(rounded_target, capacity=capacity)
    p6, p16 = prompts_of(data.heldout, 6, dev), prompts_of(data.heldout, 16, dev)
    refs6 = [alone.generate(p, NEW)[0] for p in p6]
    refs16 = [alone.generate(p, NEW)[0] for p in p16]
    start = PROMPT_LEN + 9
    for name in names:
        v = VARIANTS[name]
        shape, init, lr, frozen, steps = v + (False, STEPS["draft"])[len(v) - 3:]
        t0 = time.perf_counter()
        draft_model = build_model(config(shape, data.vocab_size), seed=1, device=dev)
        if init:
            from_target(draft_model, target_model, ends=init == "ends")
        draft_model.model.embed_tokens.weight.requires_grad_(not frozen)
        dlog = tr.train(draft_model, data.train, steps=steps,
                        batch=BATCH["draft"], seq_len=SEQ, lr=lr, warmup=WARMUP,
                        seed=1, log_every=steps, name=name,
                        teacher=target_model, mix=0.0)
        kl = tr.heldout_loss(draft_model, data.heldout, seq_len=SEQ,
                             teacher=target_model)
        ce = tr.heldout_loss(draft_model, data.heldout, seq_len=SEQ)
        params = sum(p.numel() for p in draft_model.parameters()) / 1e6
        target = MmaPassDecoder(rounded_target, capacity=capacity, max_query=9)
        draft = TritonDecoder(copy.deepcopy(draft_model).to(BF16), capacity=capacity,
                              max_query=2)
        a6, a16 = agreement(draft, p6, refs6), agreement(draft, p16, refs16)
        spec = speculative.Speculative(target, draft)
        tpp, same = {}, {}
        for k in KS:
            out = [(spec.generate(p, NEW, k), spec.passes) for p in p16]
            same[k] = float(torch.cat([o for o, _ in out]).eq(
                torch.stack(refs16)).double().mean())
            tpp[k] = (NEW - 1) * len(p16) / sum(n for _, n in out)
        with torch.no_grad():
            target.prefill(p16[0])
            fns = {("draft", k): speculative.repeatable(target.pos, start,
                                                        spec.draft_fn(k)) for k in KS}
            step = alone.device_step
            compile_ahead(step)
            alone.prefill(p16[0])
            fns["step"] = speculative.repeatable(alone.pos, start, step)
            for k in KS:
                fn = (lambda q=k + 1: target.verify_step(q))
                compile_ahead(fn)
                fns[("pass", k + 1)] = speculative.repeatable(target.pos, start + k, fn)
            timed = interleaved_rounds({n: lambda f=f: [f() for _ in range(REPLAYS)]
                                        for n, f in fns.items()},
                                       rounds=ROUNDS, per_call=REPLAYS / 1e3)
        step_us = timed["step"].median
        print(f"{name}: {params:.1f} M params; KL train {dlog.final_loss:.3f} held "
              f"{kl:.3f} x{kl / dlog.final_loss:.3f}; CE held {ce:.3f}; a6 {a6:.3f} "
              f"a16 {a16:.3f}; {dlog.seconds:.0f} s training; step {step_us:.1f} us",
              flush=True)
        for k in KS:
            d, v = timed[("draft", k)].median, timed[("pass", k + 1)].median
            print(f"  k {k}: tokens/pass {tpp[k]:.2f} (E(a16) "
                  f"{speculative.expected_tokens(a16, k):.2f}); draft {d:.1f} us, "
                  f"pass({k + 1}) {v:.1f} us = {v / step_us:.3f} steps; predicted "
                  f"speed-up {tpp[k] * step_us / (d + v):.2f}; tokens as the target "
                  f"alone's {same[k]:.3f}", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        del spec, target, draft, draft_model
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t:.0f} s")
