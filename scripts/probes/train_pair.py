"""Probe (issue 57, item 2): does Chapter 6's pair, trained on the standard-library
corpus (gpuinfer.model.stdlib_corpus), predict held-out text rather than recite its
training text?

Builds the corpus as Chapter 6 builds its own (`corpus.build`, vocabulary 8192, every
20th file held out), then trains the chapter's target and draft, with the chapter's
shapes, learning rates, warmup and seeds, through `gpuinfer.model.train.train`, at each
step count asked for. For each model it prints the final training loss
(`TrainLog.final_loss`, the mean of the last 5 % of steps, as the chapter's table shows
it), the held-out loss (`train.heldout_loss` on `data.heldout`, as the chapter's
`target_loss`/`draft_loss`), the same function on the training stream (the trained
weights' loss on text they saw), the ratio held-out / final training loss (the issue
asks for at most 1.15) and the seconds.

For each (target, draft) pair, on held-out text only:
* "forced": the chapter's agreement. The target continues PROMPTS held-out prompts of
  128 tokens greedily by NEW tokens; the draft, fed the prompt and the target's tokens,
  picks its greedy token at each of those PROMPTS x NEW positions; a = the share equal
  to the target's (the chapter uses 6 prompts; here 16, 1,536 positions);
* "text": both models read held-out windows of real text; a = the share of positions at
  which their greedy next tokens are equal (WINDOWS x 512 positions);
and the expected tokens a pass commits, E(k, a) = 1 + a + ... + a^k, k = 1 ... 6.

Draft variants (issue 57, distillation; any of the flags below replaces the pair lines
with variant lines). --draft-layers trains drafts of those layer counts (default: the
chapter's 2), each on the text at each draft step count. --distill also distils a draft
of each layer count and step count from each trained target, once per --mix (the text
loss's weight; `train.train(teacher=...)`), at --temperature, from the same initial
weights and windows as the draft trained on the text. For each (target, draft variant):
the forced and text agreements, E(k) for k = 1 ... 8, the draft's text cross-entropy on
training and held-out text (`train.heldout_loss`), its KL(target || draft) on both
(`train.heldout_loss(teacher=...)`), each ratio held-out / training, the ratio of the
held-out objective to the final training objective (`TrainLog.final_loss`: the text
loss, or the mix the draft trained on; at most 1.15 wanted), the seconds, and the
speed-up E(k) / (v + d(k)) at the best k for v = 1.0 and 1.2, d(k) = (8 + 24 k) / 267
(the 2-layer draft's k steps against the target's step, Chapter 6's H200 recording).

    PYTHONPATH=code python scripts/probes/train_pair.py [--target-steps 560,494]
        [--draft-steps 800,400,247] [--draft-layers 2] [--distill] [--mix 0,0.5]
        [--temperature 1] [--json PATH] [--smoke]

On the H200 the defaults take about 3 minutes (the target trains at about 9 steps per
second, the draft at about 70). A distillation step adds the target's forward over the
draft's 64 windows of 512, about two thirds of a target training step (a third of one
per window, the target's batch being 32): ~7-9 steps per second. So
`--target-steps 494 --draft-steps 247,494 --distill --mix 0,0.5` takes 4.3-5.2 minutes
(see NOTES-57-corpus.md). --smoke runs tiny models for a few steps on the CPU on a slice
of the corpus: a test of the code path, not a measurement.
"""

import os

# deterministic training (gpuinfer.model.train.deterministic): before cuBLAS starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import json
import time
from dataclasses import dataclass

import torch
import transformers

from gpuinfer.decode.speculative import expected_tokens
from gpuinfer.model import corpus, distill as ds, stdlib_corpus, train as tr
from gpuinfer.model.configs import build_model, model_config

# Chapter 6's models and training settings (book/06_speculative.md, its setup cell)
VOCAB, SEQ, WARMUP = 8192, 512, 60
TARGET = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4)
DRAFT = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2)
BATCH, LR, SEEDS = dict(target=32, draft=64), dict(target=6e-4, draft=2e-3), \
    dict(target=0, draft=1)
TOKENIZER_EVERY = 4  # the tokenizer trains on every 4th training file: ~2 s
PROMPTS, PROMPT_LEN, NEW, WINDOWS, KS = 16, 128, 96, 8, range(1, 7)
VARIANT_KS, VERIFY = range(1, 9), (1.0, 1.2)  # the variant lines' k and verify costs


def config(sizes, vocab):
    return model_config("tiny", vocab_size=vocab, tie_word_embeddings=True,
                        max_position_embeddings=2048, **sizes)


def steps_list(text, kind=int):
    return [kind(s) for s in text.split(",") if s]


def draft_step_cost(k):
    """d(k): the 2-layer draft's k steps in target steps, Chapter 6's H200 recording of
    2026-12-05 (draft_us about 8 + 24 k us, step_us 266.9)."""
    return (8 + 24 * k) / 267


def best_speedup(a, v):
    """The best E(k) / (v + d(k)) over VARIANT_KS, and its k."""
    return max((expected_tokens(a, k) / (v + draft_step_cost(k)), k)
               for k in VARIANT_KS)


@torch.no_grad()
def greedy_ids(model, prompts):
    """The target's greedy continuation after each prompt: (PROMPTS, NEW)."""
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                         max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[:, prompts.shape[1]:]


@torch.no_grad()
def forced_agreement(draft, prompts, reference):
    """The chapter's a: the draft's greedy token, given the prompt and the target's
    tokens before it, against the target's token; over every (prompt, position)."""
    ids = torch.cat([prompts, reference], 1)
    logits = draft(input_ids=ids[:, :-1]).logits[:, prompts.shape[1] - 1:]
    return float(logits.argmax(-1).eq(reference).double().mean()), reference.numel()


@torch.no_grad()
def text_agreement(target, draft, windows):
    """The share of positions of held-out text where both greedy next tokens agree."""
    with tr._autocast(windows.device):
        picks = [m(input_ids=windows).logits.argmax(-1) for m in (target, draft)]
    return float(picks[0].eq(picks[1]).double().mean()), windows.numel()


def draft_name(layers):
    return "draft" if layers == DRAFT["num_hidden_layers"] else f"draft-{layers}L"


def device_name(dev):
    return str(dev) if dev.type == "cpu" else torch.cuda.get_device_name()


def report_run(name, steps, model, log, data, batch):
    """A trained model's losses (printed, and returned as a row for the JSON)."""
    heldout = tr.heldout_loss(model, data.heldout, seq_len=SEQ)
    seen = tr.heldout_loss(model, data.train, seq_len=SEQ)
    run = dict(model=name, steps=steps, batch=batch,
               layers=model.config.num_hidden_layers,
               params_m=sum(p.numel() for p in model.parameters()) / 1e6,
               epochs=log.tokens / data.train.numel(), seconds=log.seconds,
               first_loss=log.losses[0], train_loss=log.final_loss,
               train_eval_loss=seen, heldout_loss=heldout,
               ratio=heldout / log.final_loss)
    print(f"{name:6s} {steps:4d} steps x {batch} ({run['epochs']:.2f} "
          f"epochs, {log.seconds:5.1f} s): training loss {log.final_loss:.3f}, "
          f"on training text {seen:.3f}, held out {heldout:.3f}, ratio "
          f"{run['ratio']:.3f} {'ok' if run['ratio'] <= 1.15 else 'ABOVE 1.15'}",
          flush=True)
    return run


def variant_rows(args, data, dev, shapes, layers, models, logs, runs, prompts, windows):
    """Each target against each draft trained on the text and, with --distill, each
    draft distilled from it; one printed line and one JSON row per pair."""
    text_runs = {(r["model"], r["steps"]): r for r in runs}
    rows = []
    for t_steps in args.target_steps:
        target = models["target", t_steps]
        pair = Pair(target, t_steps, data, prompts, greedy_ids(target, prompts),
                    windows, args.temperature)
        for L in layers:
            name = draft_name(L)
            for d_steps in args.draft_steps:
                run = text_runs[name, d_steps]
                rows.append(pair.row(models[name, d_steps], name, d_steps,
                                     logs[name, d_steps], None,
                                     (run["train_eval_loss"], run["heldout_loss"])))
                for mix in args.mix if args.distill else ():
                    # the text draft's initial weights and windows: the loss differs
                    draft = build_model(config(shapes[name], data.vocab_size),
                                        seed=SEEDS["draft"], device=dev)
                    log = tr.train(draft, data.train, steps=d_steps,
                                   batch=BATCH["draft"], seq_len=SEQ, lr=LR["draft"],
                                   warmup=WARMUP, seed=SEEDS["draft"], teacher=target,
                                   temperature=args.temperature, mix=mix,
                                   log_every=d_steps,
                                   name=f"{name} {d_steps} from target {t_steps}, "
                                        f"mix {mix:g}")
                    rows.append(pair.row(draft, name, d_steps, log, mix))
    return rows


@dataclass
class Pair:
    """A trained target, what it is measured on, and its greedy reference tokens."""

    target: object
    steps: int
    data: object
    prompts: torch.Tensor
    reference: torch.Tensor
    windows: torch.Tensor
    temperature: float

    def row(self, draft, name, d_steps, log, mix, text_ce=None):
        """One (target, draft) row, printed; mix None: the draft trained on the text."""
        forced, n_forced = forced_agreement(draft, self.prompts, self.reference)
        text, n_text = text_agreement(self.target, draft, self.windows)
        streams = (self.data.train, self.data.heldout)
        ce = text_ce or tuple(tr.heldout_loss(draft, s, seq_len=SEQ) for s in streams)
        kl = tuple(tr.heldout_loss(draft, s, seq_len=SEQ, teacher=self.target,
                                   temperature=self.temperature) for s in streams)
        held = ce[1] if mix is None else ds.mixed(kl[1], ce[1], mix=mix)
        row = dict(target_steps=self.steps, draft=name,
                   layers=draft.config.num_hidden_layers, draft_steps=d_steps,
                   how="text" if mix is None else "distilled", mix=mix,
                   temperature=self.temperature, forced=forced,
                   forced_positions=n_forced, text=text, text_positions=n_text,
                   expected_forced={k: expected_tokens(forced, k) for k in VARIANT_KS},
                   expected_text={k: expected_tokens(text, k) for k in VARIANT_KS},
                   ce_train=ce[0], ce_heldout=ce[1], ce_ratio=ce[1] / ce[0],
                   kl_train=kl[0], kl_heldout=kl[1], kl_ratio=kl[1] / kl[0],
                   train_objective=log.final_loss, heldout_objective=held,
                   objective_ratio=held / log.final_loss, seconds=log.seconds,
                   speedup={v: best_speedup(forced, v) for v in VERIFY})
        how = "text" if mix is None else f"distilled, mix {mix:g}"
        ok = "ok" if row["objective_ratio"] <= 1.15 else "ABOVE 1.15"
        print(f"target {self.steps} / {name} {d_steps} ({how}): a = {forced:.3f} "
              f"forced, {text:.3f} text; E(k), k = 1..8, forced: "
              + " ".join(f"{e:.2f}" for e in row["expected_forced"].values())
              + f"; CE train {ce[0]:.3f} held {ce[1]:.3f} (x{row['ce_ratio']:.3f}); "
              f"KL train {kl[0]:.3f} held {kl[1]:.3f} (x{row['kl_ratio']:.3f}); "
              f"objective held / final {row['objective_ratio']:.3f} {ok}; "
              + "; ".join(f"speed-up {sp:.2f} at v {v:g} (k {k})"
                          for v, (sp, k) in row["speedup"].items())
              + f"; {log.seconds:.1f} s", flush=True)
        return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-steps", type=steps_list, default=[560, 494])
    parser.add_argument("--draft-steps", type=steps_list, default=[800, 400, 247])
    parser.add_argument("--draft-layers", type=steps_list, default=None,
                        help="draft layer counts (default: the chapter's 2)")
    parser.add_argument("--distill", action="store_true",
                        help="also distil each draft from each target")
    parser.add_argument("--mix", type=lambda t: steps_list(t, float), default=[0, 0.5],
                        help="with --distill: the text loss's weights")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="with --distill: the distillation temperature")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU")
    args = parser.parse_args()
    # refused before the targets train, not after minutes of GPU time
    if not all(0 <= m <= 1 for m in args.mix) or not 0 < args.temperature < 1e9:
        parser.error(f"--mix {args.mix} must lie in [0, 1] and --temperature "
                     f"{args.temperature} above 0")
    if args.draft_layers is not None and min(args.draft_layers, default=0) < 1:
        parser.error(f"--draft-layers {args.draft_layers}: at least one layer each")
    transformers.logging.set_verbosity_error()
    global VOCAB, SEQ, WARMUP, TARGET, DRAFT, PROMPTS, PROMPT_LEN, NEW, WINDOWS
    dev = torch.device("cpu" if args.smoke else "cuda")
    files = stdlib_corpus.stdlib_files()
    if args.smoke:
        VOCAB, SEQ, WARMUP = 512, 64, 3
        TARGET = dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
        DRAFT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
        PROMPTS, PROMPT_LEN, NEW, WINDOWS = 4, 16, 12, 2
        files = files[:400]
        BATCH.update(target=4, draft=8)
    else:
        print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)

    data = corpus.build(files, vocab_size=VOCAB, tokenizer_every=TOKENIZER_EVERY)
    n_train = data.train.numel()
    facts = dict(files=len(files), train_files=data.train_files,
                 heldout_files=data.heldout_files, megabytes=data.megabytes,
                 train_tokens=n_train, heldout_tokens=data.heldout.numel(),
                 build_s=data.seconds, digest=corpus.digest(files),
                 tokenizer_every=TOKENIZER_EVERY)
    print(f"corpus: {data} (every {TOKENIZER_EVERY}th training file for the "
          f"tokenizer), digest {facts['digest']}", flush=True)

    # held-out prompts and windows, spread evenly over the held-out stream
    spacing = data.heldout.numel() // PROMPTS
    prompts = torch.stack([data.heldout[i * spacing: i * spacing + PROMPT_LEN]
                           for i in range(PROMPTS)]).to(dev)
    full = (data.heldout.numel() - 1) // SEQ
    starts = torch.linspace(0, full - 1, WINDOWS).long()[:, None] * SEQ
    windows = data.heldout[starts + torch.arange(SEQ)].to(dev)

    # the chapter's draft keeps its name "draft"; other layer counts are "draft-<L>L"
    layers = args.draft_layers or [DRAFT["num_hidden_layers"]]
    variants = args.distill or layers != [DRAFT["num_hidden_layers"]]
    shapes = dict(target=TARGET, **{draft_name(L): dict(DRAFT, num_hidden_layers=L)
                                    for L in layers})
    runs, models, logs = [], {}, {}
    for name, counts in (("target", args.target_steps),
                         *((draft_name(L), args.draft_steps) for L in layers)):
        role = "target" if name == "target" else "draft"
        for steps in counts:
            model = build_model(config(shapes[name], data.vocab_size), seed=SEEDS[role],
                                device=dev)
            log = tr.train(model, data.train, steps=steps, batch=BATCH[role],
                           seq_len=SEQ, lr=LR[role], warmup=WARMUP, seed=SEEDS[role],
                           log_every=steps, name=f"{name} {steps}")
            runs.append(report_run(name, steps, model, log, data, BATCH[role]))
            models[name, steps], logs[name, steps] = model, log

    if variants:
        rows = variant_rows(args, data, dev, shapes, layers, models, logs, runs,
                            prompts, windows)
        if args.json:
            with open(args.json, "w", encoding="utf8") as f:
                json.dump(dict(device=device_name(dev), corpus=facts, runs=runs,
                               variants=rows, mix=args.mix,
                               temperature=args.temperature), f, indent=1)
        return

    pairs = []
    for t_steps in args.target_steps:
        target = models["target", t_steps]
        reference = greedy_ids(target, prompts)
        for d_steps in args.draft_steps:
            draft = models["draft", d_steps]
            forced, n_forced = forced_agreement(draft, prompts, reference)
            text, n_text = text_agreement(target, draft, windows)
            pair = dict(target_steps=t_steps, draft_steps=d_steps,
                        forced=forced, forced_positions=n_forced,
                        text=text, text_positions=n_text,
                        expected_forced={k: expected_tokens(forced, k) for k in KS},
                        expected_text={k: expected_tokens(text, k) for k in KS})
            pairs.append(pair)
            print(f"target {t_steps} / draft {d_steps}: a = {forced:.3f} forced "
                  f"({n_forced} positions), {text:.3f} on text ({n_text}); E(k, a) for "
                  "k = 1..6: "
                  + " ".join(f"{e:.2f}" for e in pair["expected_forced"].values())
                  + " (forced), "
                  + " ".join(f"{e:.2f}" for e in pair["expected_text"].values())
                  + " (text)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf8") as f:
            json.dump(dict(device=device_name(dev), corpus=facts, runs=runs,
                           pairs=pairs), f, indent=1)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - start:.0f} s")
