"""Probe (issue 58), on the H200: the whole 1B step with the eight-bit kernels
(`decode.triton_step8.EightBitDecoder`: o, gate/up and down in int8 folded, fp8_cvt,
fp8_bits, dp4a) against today's BF16 and int8 `TritonDecoder`s, as Chapter 5 measures
its int8 step; then the teacher-forced top-1 agreement with FP32 on the model Chapter 5
trains ("On a trained model"), over 1,024 held-out positions.

1. Checks first: each decoder's teacher-forced logits (16 steps, BF16) against the
   book's PyTorch forward on the decoder's own matrices (`model.llama.forward` on
   `decoder.model_weights`); a variant more than 4x the BF16 decoder's own difference
   and 10 % of the logit scale off (or failing to build or compile) is printed as
   WRONG/FAILED and left out.
2. Timing as Chapter 5's "The int8 step" cell: each decoder prefilled with the
   chapter's prompt (128 tokens), its step captured in a CUDA graph with PDL
   (`step_function()`), all timed in the same interleaved rounds of 20 replays from
   the prompt's end (`triton_bench.replays_from`, CUDA events). Printed: step µs
   (median, min-max), the BF16 step's time over it (median ratio, per-round low-high),
   MBU = `step_bytes` at the chapter's mean context over the copy rate measured here.
   Unless --no-sweep: 4 more tilings of the folded int8 path (--sweep-format F: of
   another format's).
3. Chapter 5's trained model (its config, corpus, 450 steps, seed 0: the same model,
   ~20 s of training on the H200; --train-steps to shorten), rounded to BF16, each
   decoder fed its 8 held-out prompts x 128 tokens; top-1 and largest difference
   against the FP32 model, and top-1 against the BF16 decoder.

    PYTHONPATH=code python scripts/probes/step8.py [--rounds 30] [--no-sweep]
        [--sweep-format fp8_cvt] [--train-steps 450]
    (~3-4 min on a fresh H200; numbers also written to $OUT/step8.json if OUT is set)
    PYTHONPATH=code python scripts/probes/step8.py --smoke --rounds 2 --train-steps 30
    (the code path on a CPU, interpreted and shrunk: no measurement)
"""

import argparse
import copy
import dataclasses
import json
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=30)  # the chapter: 40
ap.add_argument("--no-sweep", action="store_true")
ap.add_argument("--sweep-format", default="int8")  # the format the tilings are tried on
ap.add_argument("--train-steps", type=int, default=450)  # the chapter's
ap.add_argument("--smoke", action="store_true",
                help="the code path on a CPU, shrunk and interpreted (no measurement)")
args = ap.parse_args()
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # train's, before cuBLAS
if args.smoke:
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported

import torch  # noqa: E402

from gpuinfer.decode.static import capacity_for  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.decode.triton_step8 import EightBitDecoder  # noqa: E402
from gpuinfer.experiments import triton_bench as tb  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig as C  # noqa: E402
from gpuinfer.measure import ceilings, quality  # noqa: E402
from gpuinfer.measure.rounds import interleaved_rounds  # noqa: E402
from gpuinfer.model import corpus  # noqa: E402
from gpuinfer.model.configs import (build_model, model_config,  # noqa: E402
                                    random_prompt)
from gpuinfer.model.llama import INT8, KVCache, forward  # noqa: E402
from gpuinfer.model.train import heldout_loss, train  # noqa: E402

RECORDED_BF16_US, TARGET = 724.4, 1.5  # the recording; issue 58's ratio
BF16 = torch.bfloat16
if args.smoke:  # Chapter 5's smoke sizes
    dev, SHAPE, COPY_BYTES = torch.device("cpu"), "reduced", 2**22
    PROMPT_LEN, NEW_TOKENS, REPLAYS, CHECK = 16, 8, 2, (8, 4)
else:
    dev, SHAPE, COPY_BYTES = torch.device("cuda"), "1b", 2**30
    PROMPT_LEN, NEW_TOKENS, REPLAYS, CHECK = 128, 128, 20, (64, 16)  # Chapter 5's
MEAN_CONTEXT = PROMPT_LEN + NEW_TOKENS // 2  # its floor's context (decode_cost)
t0 = time.perf_counter()
out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
       "rounds": args.rounds}


def log(*a):
    print(f"[{time.perf_counter() - t0:5.0f} s]", *a, flush=True)


# name -> (class, keyword arguments); the first two are Chapter 5's decoders
VARIANTS = {
    "BF16": (TritonDecoder, {}),
    "int8 today": (TritonDecoder, {"weights": INT8}),
    "int8 fold": (EightBitDecoder, {"format": "int8"}),
    "fp8_cvt": (EightBitDecoder, {"format": "fp8_cvt"}),
    "fp8_bits": (EightBitDecoder, {"format": "fp8_bits"}),
    "dp4a": (EightBitDecoder, {"format": "dp4a"}),
    # step8_trace.py (H100): the folded gate/up at 8x1024 w4 beat today's in the step,
    # the folded o and down did not; so gate/up alone on the eight-bit kernels
    "int8, gate/up 8x1024 only": (EightBitDecoder, {
        "format": "int8", "matrices": ("gate_up",),
        "eight_bit": {"gate_up": (C(8, 1024, 1, 4), 16)}}),
    "fp8_cvt, gate/up 8x1024 only": (EightBitDecoder, {
        "format": "fp8_cvt", "matrices": ("gate_up",),
        "eight_bit": {"gate_up": (C(8, 1024, 1, 4), 16)}}),
}
# Folded, these tilings keep <= 80 registers on sm_90 (aot.compile_only, 2026-12-05:
# gate_up 8x1024 4w needs 128, left out); today's int8 tiling held 128
SWEEP = {"gate_up 8x1024 8w": {"gate_up": (C(8, 1024, 1, 8), 16)},  # 80 regs
         "gate_up 4x2048": {"gate_up": (C(4, 2048, 1, 4), 16)},  # 80: K in one tile
         "gate_up 8x2048 8w": {"gate_up": (C(8, 2048, 1, 8), 16)},  # 64, 32 KB a tile
         "o/down 4 warps": {"o": (C(8, 2048, 1, 4), 16),  # 64 and 72
                            "down": (C(8, 2048, 1, 4), 16)}}
if not args.no_sweep:
    for name, tiling in SWEEP.items():
        VARIANTS[f"{args.sweep_format}, {name}"] = (
            EightBitDecoder, {"format": args.sweep_format, "eight_bit": tiling})


@torch.no_grad()
def torch_forced(decoder, prompt_ids, follow):
    """What `quality.forced_decoder_logits` gives, from the book's PyTorch forward on
    the decoder's own matrices and a cache of its own: the reference for a check."""
    w, cap = decoder.model_weights, decoder.capacity
    shape = (1, w.n_kv_heads, cap, w.head_dim)
    cache = KVCache([torch.zeros(shape, device=dev, dtype=BF16) for _ in w.layers],
                    [torch.zeros(shape, device=dev, dtype=BF16) for _ in w.layers],
                    decoder.cos, decoder.sin, torch.arange(cap, device=dev))
    n = prompt_ids.shape[1]
    steps = [forward(w, cache, prompt_ids, cache.slots[:n])]
    for k in range(follow.shape[1] - 1):
        slot = cache.slots[n + k: n + k + 1]
        steps.append(forward(w, cache, follow[:, k: k + 1], slot))
    return torch.stack(steps, dim=1).float().cpu()


# --- 1. build and check at the 1B shape ---------------------------------------------
config = model_config(SHAPE)
model = build_model(config, seed=0, device=dev).to(BF16)
prompt = random_prompt(config, PROMPT_LEN, seed=1, device=dev)
cap = capacity_for(PROMPT_LEN, NEW_TOKENS)
bandwidth, _ = ceilings.copy_bandwidth(COPY_BYTES, device=dev)
log(f"{out['device']}: copy rate {bandwidth / 1e12:.3f} TB/s")
check_prompt, follow = prompt[:, :CHECK[0]], prompt[:, CHECK[0]: sum(CHECK)]
decoders, checks, failed = {}, {}, {}
for name, (cls, kw) in VARIANTS.items():
    try:
        d = cls(model, capacity=cap, **kw)
        ours = quality.forced_decoder_logits(d, check_prompt, follow)
        checks[name] = quality.compare_logits(torch_forced(d, check_prompt, follow),
                                              ours)
        decoders[name] = d
        log(f"{name}: built, compiled; vs its PyTorch forward: rel "
            f"{checks[name].rel:.2e}, top-1 {100 * checks[name].top1:.0f} %")
    except Exception as err:  # noqa: BLE001 - one variant's failure is a result
        failed[name] = f"{type(err).__name__}: {err}"
        log(f"FAILED {name}: {failed[name][:300]}")
# A wrong kernel is off by the logits' whole scale; two right BF16 ones by a few %
limit = max(4 * checks["BF16"].rel, 0.1)  # dp4a's x rounding stays well inside
for name in [n for n in decoders if n != "BF16"]:
    if checks[name].rel > limit:
        failed[name] = f"WRONG: rel {checks[name].rel:.2e} > {limit:.2e}"
        log(f"WRONG {name}: {failed[name]}")
        del decoders[name]
out["checks"] = {n: dataclasses.asdict(c) for n, c in checks.items()}
out["failed"] = failed

# --- 2. the graphed steps in the same interleaved rounds ------------------------------
for name, d in decoders.items():
    d.prefill(prompt)
    d.step_function()  # captured after the prefill, as the chapter's cell
log(f"captured {len(decoders)} graphs; timing {args.rounds} rounds")
rounds = interleaved_rounds({n: tb.replays_from(d, PROMPT_LEN, REPLAYS)
                             for n, d in decoders.items()},
                            rounds=args.rounds, warmup=2, per_call=REPLAYS)
print(f"\n{'step':30s} {'µs':>7s} {'min-max':>15s} {'BF16/it':>7s} {'low-high':>11s} "
      f"{'MBU':>5s} {'GB':>6s}")
out["steps"] = {}
for name, d in decoders.items():
    t, vs = rounds[name], rounds.compare(name, "BF16")
    gb = d.step_bytes(MEAN_CONTEXT - 1)  # = cost's bytes at the chapter's context
    mbu = gb / bandwidth / (t.median / 1e3)
    out["steps"][name] = dict(us=1e3 * t.median, min_us=1e3 * t.min, max_us=1e3 * t.max,
                              vs_bf16=vs.ratio, vs_bf16_low=vs.low,
                              vs_bf16_high=vs.high,
                              mbu=mbu, bytes=gb)
    print(f"{name:30s} {1e3 * t.median:7.1f} {1e3 * t.min:7.1f}-{1e3 * t.max:<7.1f} "
          f"{vs.ratio:7.3f} {vs.low:5.3f}-{vs.high:<5.3f} {100 * mbu:4.0f}% "
          f"{gb / 1e9:6.3f}")
best = max((n for n in decoders if n not in ("BF16", "int8 today")),
           key=lambda n: out["steps"][n]["vs_bf16"], default=None)
if best:
    s = out["steps"][best]
    log(f"best eight-bit: {best}, {s['vs_bf16']:.3f}x the BF16 step (target "
        f"{TARGET}x; at the recorded BF16 {RECORDED_BF16_US} µs: "
        f"{RECORDED_BF16_US / s['vs_bf16']:.1f} µs, target "
        f"{RECORDED_BF16_US / TARGET:.1f})")
    print(rounds.compare(best, "int8 today").sentence(best, "int8 today"))
del decoders, rounds
torch.cuda.empty_cache()

# --- 3. Chapter 5's trained model: top-1 against FP32 ---------------------------------
if args.smoke:  # the chapter's smoke settings
    FILES, VOCAB = corpus.snapshot_files()[:60], 512
    TRAINED = model_config("reduced", num_hidden_layers=2)
    SEQ, BATCH, LR = 64, 4, 3e-3
    HELDOUT_LENS, TRAINED_STEPS = (16, 24, 32), 6
else:
    FILES, VOCAB = corpus.snapshot_files(), 8192  # Chapter 6's corpus
    TRAINED = model_config("1b", num_hidden_layers=2, max_position_embeddings=2048)
    SEQ, BATCH, LR = 512, 32, 6e-4
    HELDOUT_LENS, TRAINED_STEPS = (128, 192, 256, 320, 384, 448, 512, 700), 128
text = corpus.build(FILES, vocab_size=VOCAB, tokenizer_every=1)
TRAINED.vocab_size, TRAINED.tie_word_embeddings = text.vocab_size, True
trained = build_model(TRAINED, seed=0, device=dev)
log_ = train(trained, text.train, steps=args.train_steps, batch=BATCH, seq_len=SEQ,
             lr=LR, log_every=args.train_steps, name="trained")
log(f"trained {args.train_steps} steps ({log_.seconds:.0f} s; the chapter: 450), "
    f"held-out loss {heldout_loss(trained, text.heldout, seq_len=SEQ):.3f}")
spacing = text.heldout.numel() // len(HELDOUT_LENS)
pieces = [text.heldout[i * spacing: i * spacing + n + TRAINED_STEPS][None].to(dev)
          for i, n in enumerate(HELDOUT_LENS)]
trained_cap = capacity_for(max(HELDOUT_LENS), TRAINED_STEPS)
rounded = copy.deepcopy(trained).to(BF16)
fp32 = torch.cat([quality.forced_logits(trained, p[:, :n], p[:, n:])
                  for n, p in zip(HELDOUT_LENS, pieces)], 1)
forced = {}
for name, (cls, kw) in VARIANTS.items():
    if name in failed or ("," in name):  # the sweep's tilings compute the same
        continue
    d = cls(rounded, capacity=trained_cap, **kw)
    forced[name] = torch.cat([quality.forced_decoder_logits(d, p[:, :n], p[:, n:])
                              for n, p in zip(HELDOUT_LENS, pieces)], 1)
    del d
print(f"\n{'trained model, held-out text':24s} {'positions':>9s} "
      f"{'top-1 vs FP32':>13s} "
      f"{'max |diff|':>10s} {'of scale':>8s} {'top-1 vs BF16':>13s}")
out["trained"] = {"train_steps": args.train_steps, "seconds": log_.seconds}
for name, logits in forced.items():
    a, b = quality.compare_logits(fp32, logits), quality.compare_logits(forced["BF16"],
                                                                        logits)
    out["trained"][name] = dict(positions=a.steps, top1=a.top1, max_abs=a.max_abs,
                                rel=a.rel, top1_vs_bf16=b.top1)
    print(f"{name:24s} {a.steps:9,d} {100 * a.top1:12.1f}% {a.max_abs:10.3f} "
          f"{100 * a.rel:7.1f}% {100 * b.top1:12.1f}%")
if os.environ.get("OUT"):
    with open(f"{os.environ['OUT']}/step8.json", "w") as f:
        json.dump(out, f, indent=1, default=str)
log("done")
