"""Probe (issue 47): Chapter 6's target and draft shapes, and the 1B shape, on the Triton
kernels with passes of T tokens: the step against verify passes, the draft's steps, and
whether a pass's logits equal the steps' to the bit on the GPU.

    PYTHONPATH=code python scripts/probes/spec_rows.py [--big] [--exact]
"""

import argparse
import time

import torch

from gpuinfer.decode.speculative import Speculative, repeatable
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.kernels.gemv import GemvConfig
from gpuinfer.kernels.tiling import pass_configs
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.model.configs import build_model, model_config

TARGET = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4)
DRAFT = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2)
BF16 = torch.bfloat16
REPLAYS, ROUNDS, START = 20, 7, 150


def config(sizes):
    return model_config("tiny", vocab_size=8192, tie_word_embeddings=True,
                        max_position_embeddings=2048, **sizes)


def passes(decoder, queries, label, extra=None):
    """µs per replay of the step (T = 1) and of verify passes of T tokens."""
    fns = dict(extra or {})
    for q in queries:
        fn = decoder.device_step if q == 1 else (lambda q=q: decoder.verify_step(q))
        t0 = time.time()
        compile_ahead(fn)
        fns[q] = repeatable(decoder.pos, START + q - 1, fn)
        print(f"  {label} T={q} ready in {time.time() - t0:.1f} s", flush=True)
    timed = interleaved_rounds({q: lambda f=f: [f() for _ in range(REPLAYS)]
                                for q, f in fns.items()},
                               rounds=ROUNDS, per_call=REPLAYS / 1e3)
    step = timed[1].median
    for name in extra or {}:
        print(f"{label} {name}: {timed[name].median:7.1f} µs ({timed[name].min:.1f}-"
              f"{timed[name].max:.1f})")
    for q in queries:
        t = timed[q]
        print(f"{label} T={q:2d}: {t.median:7.1f} µs ({t.min:.1f}-{t.max:.1f}) "
              f"= {t.median / step:.3f} steps", flush=True)
    return timed


ONE_TILE = {"gate_up": GemvConfig(4, 1024, 1, 4), "down": GemvConfig(4, 4096, 1, 4)}
VARIANTS = {
    "base": {},
    "one tile": ONE_TILE,
    "one tile w8": {"gate_up": GemvConfig(8, 1024, 1, 8),
                    "down": GemvConfig(8, 4096, 1, 8)},
    "one tile gu2": {"gate_up": GemvConfig(2, 1024, 1, 4),
                     "down": GemvConfig(4, 4096, 1, 4)},
    "one tile dn2": {"gate_up": GemvConfig(4, 1024, 1, 4),
                     "down": GemvConfig(2, 4096, 1, 4)},
}


def variants(model, queries):
    """The step and passes with other tilings of gate/up and down, interleaved."""
    fns = {}
    for name, cfg in VARIANTS.items():
        dec = TritonDecoder(model, capacity=256, max_query=max(queries), configs=cfg)
        dec.prefill(prompt(128, 8192))
        for q in queries:
            fn = dec.device_step if q == 1 else (lambda q=q, d=dec: d.verify_step(q))
            compile_ahead(fn)
            fns[name, q] = repeatable(dec.pos, START + q - 1, fn)
    timed = interleaved_rounds({n: lambda f=f: [f() for _ in range(REPLAYS)]
                                for n, f in fns.items()},
                               rounds=ROUNDS, per_call=REPLAYS / 1e3)
    for name in VARIANTS:
        step = timed[name, 1].median
        print(f"{name:18s} " + "  ".join(
            f"T={q}: {timed[name, q].median:6.1f} ({timed[name, q].min:.1f}-"
            f"{timed[name, q].max:.1f}) {timed[name, q].median / step:.3f}"
            for q in queries), flush=True)


def prompt(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g).cuda()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--queries", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--variants", action="store_true")
    a = ap.parse_args()
    queries = [int(q) for q in a.queries.split(",")]
    torch.manual_seed(0)
    tm = build_model(config(TARGET), seed=0, dtype=BF16, device="cuda")
    dm = build_model(config(DRAFT), seed=1, dtype=BF16, device="cuda")
    if a.variants:
        variants(tm, [1, 2, 3, 5])
        return
    target = TritonDecoder(tm, capacity=256, max_query=max(queries),
                           configs=pass_configs(tm.config, True))
    target.prefill(prompt(128, 8192))
    alone = TritonDecoder(tm, capacity=256)
    alone.prefill(prompt(128, 8192))
    compile_ahead(alone.device_step)
    passes(target, queries, "target (pass tiling)",
           {"step": repeatable(alone.pos, START, alone.device_step)})
    draft = TritonDecoder(dm, capacity=256, max_query=2)
    draft.prefill(prompt(128, 8192))
    compile_ahead(draft.refresh_step)
    fns = {name: repeatable(draft.pos, START, fn) for name, fn in
           (("step", draft.device_step), ("refresh", draft.refresh_step))}
    timed = interleaved_rounds({n: lambda f=f: [f() for _ in range(REPLAYS)]
                                for n, f in fns.items()}, rounds=ROUNDS,
                               per_call=REPLAYS / 1e3)
    for n in fns:
        print(f"draft {n}: {timed[n].median:.1f} µs ({timed[n].min:.1f}-{timed[n].max:.1f})")
    # a self-draft pass (every proposal accepted) and a random-draft pass, k = 4
    for name, dr in (("random draft", draft),):
        spec = Speculative(target, dr, k=4)
        p = prompt(128, 8192, seed=3)
        out = spec.generate(p, 64)
        alone_tokens = TritonDecoder(tm, capacity=256).generate(p, 64)
        print(f"spec ({name}) equal to alone: {torch.equal(out, alone_tokens)}, "
              f"passes {spec.passes}", flush=True)
    if a.exact:
        for dtype in (BF16, torch.float32):
            m = build_model(config(TARGET), seed=0, dtype=dtype, device="cuda")
            d = TritonDecoder(m, capacity=256, max_query=5,
                              configs=pass_configs(m.config, True))
            p, ids = prompt(128, 8192), prompt(5, 8192, seed=5)
            d.prefill(p)
            steps = torch.cat([d.step_logits(ids[:, i: i + 1]) for i in range(5)])
            d.prefill(p)
            rows = d.pass_logits(ids)[0]
            diff = (steps.float() - rows.float()).abs().max().item()
            print(f"{dtype}: pass logits equal steps' to the bit: "
                  f"{torch.equal(steps, rows)} (max diff {diff:.3g})", flush=True)
    if a.big:
        del target, tm
        bm = build_model(model_config("1b"), seed=0, dtype=BF16, device="cuda")
        big = TritonDecoder(bm, capacity=256, max_query=5,
                            configs=pass_configs(bm.config, True))
        big.prefill(prompt(128, bm.config.vocab_size))
        alone = TritonDecoder(bm, capacity=256)
        alone.prefill(prompt(128, bm.config.vocab_size))
        compile_ahead(alone.device_step)
        passes(big, [1, 2, 3, 5], "1B (pass tiling)",
               {"step": repeatable(alone.pos, START, alone.device_step)})


if __name__ == "__main__":
    main()
