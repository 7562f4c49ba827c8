"""Probe (not book code): the Triton decode step of a Llama-3.2-1B-shaped model in BF16
on one H200, in four sections, each guarded so that one failure loses only itself:

1. per matrix of the step, the bandwidth of our GEMV over a grid of tilings (PDL on)
   against cuBLAS, weights rotated over copies past the L2, in CUDA-graph replays;
2. the step's 65 GEMVs chained in one graph: cuBLAS, ours without PDL, with PDL, with
   the best tiling of section 1 per matrix;
3. decode attention (32 q / 8 kv heads of 64): our split-KV kernel against
   F.scaled_dot_product_attention (enable_gqa) at contexts 128 to 32k;
4. the whole TritonDecoder step captured in a graph: ms per step, the fraction of the
   copy rate for its bytes, and teacher-forced logits against the model;
5. int8 weights: per matrix, our GEMV over a grid of tilings against Inductor's
   compilation of the int8 weight-only linear (`quant.linear`), then the int8 decoder's
   step with the default tiling and with the best of the grid.

    PYTHONPATH=code python3 scripts/probes/probe_triton.py

Prints a table at the end; with OUT set, also writes JSON lines to
$OUT/probe_triton.jsonl. Meant to finish in under 4 minutes (each section stops
sweeping past its time budget; the whole probe took about 35 s on an H200).
"""

import copy
import dataclasses
import json
import os
import statistics
import time
import traceback

import torch
import torch.nn.functional as F

from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.attention import AttentionWorkspace, decode_attention
from gpuinfer.kernels.common import Workspace, pdl_supported
from gpuinfer.kernels.gemv import GemvConfig, gemv
from gpuinfer.kernels.quant import linear, quantize_int8
from gpuinfer.kernels.tiling import default_configs

T0 = time.time()
COPY_RATE = 4.23e12  # B/s, the H200's measured device-to-device copy rate
BUDGET = {1: 75, 2: 115, 3: 140, 4: 225, 5: 330}  # seconds since start by which a section stops
OUT = os.environ.get("OUT")
LOG = open(os.path.join(OUT, "probe_triton.jsonl"), "a") if OUT else None
PDL = pdl_supported("cuda")
ROWS: list[dict] = []
SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
          "down": (2048, 8192), "lm_head": (128256, 2048)}
BF16 = torch.bfloat16


def emit(**rec):
    rec["t"] = round(time.time() - T0, 1)
    ROWS.append(rec)
    print(json.dumps(rec), flush=True)
    if LOG:
        LOG.write(json.dumps(rec) + "\n")
        LOG.flush()


def over(section: int) -> bool:
    return time.time() - T0 > BUDGET[section]


def graph_seconds(fn, calls: int, replays: int = 10) -> float:
    """Seconds per call: `fn` launches `calls` calls; captured once, replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, load modules, allocate: not in the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = events()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del graph
    return statistics.median(times) / calls


def events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def copies_of(n, k, total=2**28, most=64):
    count = max(2, min(most, -(-total // (n * k * 2))))
    return [torch.randn(n, k, device="cuda", dtype=BF16) * 0.02 for _ in range(count)]


def cfg_str(c: GemvConfig) -> str:
    return f"n{c.block_n}k{c.block_k}s{c.split_k}w{c.num_warps}st{c.num_stages}"


def grid_for(k: int) -> list[GemvConfig]:
    if k == 8192:
        return [GemvConfig(8, 2048, 4, 8), GemvConfig(8, 2048, 1, 8),
                GemvConfig(8, 2048, 2, 8), GemvConfig(4, 2048, 4, 4),
                GemvConfig(16, 1024, 8, 8), GemvConfig(8, 1024, 1, 4, 3),
                GemvConfig(8, 4096, 2, 16), GemvConfig(16, 2048, 4, 16),
                GemvConfig(4, 2048, 8, 4)]
    return [GemvConfig(8, 2048, 1, 8), GemvConfig(4, 2048, 1, 4),
            GemvConfig(16, 2048, 1, 16), GemvConfig(8, 1024, 2, 4),
            GemvConfig(4, 1024, 2, 4), GemvConfig(8, 512, 4, 4),
            GemvConfig(16, 1024, 1, 8), GemvConfig(8, 1024, 1, 4, 3),
            GemvConfig(2, 2048, 1, 4), GemvConfig(4, 2048, 1, 8),
            GemvConfig(8, 1024, 2, 8)]


BEST: dict[str, GemvConfig] = {}  # per matrix, in rows (as the plain gemv tiles)
PAIRED = {"qkv", "gate_up"}  # their fused kernels tile (row, row) pairs: block_n / 2


def rows(name: str, config: GemvConfig) -> GemvConfig:
    """A decoder tiling in the plain gemv's terms (pairs -> rows)."""
    if name not in PAIRED:
        return config
    return dataclasses.replace(config, block_n=2 * config.block_n)


def pairs(name: str, config: GemvConfig) -> GemvConfig:
    if name not in PAIRED:
        return config
    return dataclasses.replace(config, block_n=max(1, config.block_n // 2))


def section1():
    ws = Workspace("cuda", 1 << 22, 1 << 16)
    for name, (n, k) in SHAPES.items():
        weights = copies_of(n, k)
        x = torch.randn(k, device="cuda", dtype=BF16)
        out = torch.empty(n, device="cuda", dtype=BF16)
        x2 = x[None]
        nbytes = n * k * 2
        sec = graph_seconds(lambda: [F.linear(x2, w) for w in weights], len(weights))
        emit(section=1, shape=name, impl="cublas", us=sec * 1e6,
             tbs=nbytes / sec / 1e12)
        best = (0.0, None)
        default = default_configs(True)["o" if k == 2048 else "down"]
        runs = [(c, PDL) for c in grid_for(k)] + [(default, False)]
        for config, pdl in runs:
            if over(1) and best[1] is not None:
                break
            try:
                sec = graph_seconds(lambda: [gemv(w, x, out, config=config, pdl=pdl,
                                                  workspace=ws) for w in weights],
                                    len(weights))
            except Exception as e:  # a tiling that does not compile: note it, go on
                emit(section=1, shape=name, impl="triton", config=cfg_str(config),
                     error=repr(e)[:200])
                continue
            tbs = nbytes / sec / 1e12
            emit(section=1, shape=name, impl="triton", config=cfg_str(config), pdl=pdl,
                 us=sec * 1e6, tbs=tbs)
            if pdl == PDL and tbs > best[0]:
                best = (tbs, config)
        BEST[name] = best[1]
        emit(section=1, shape=name, impl="best", config=cfg_str(best[1]), tbs=best[0])
        del weights


def chain_weights():
    layers = [{m: torch.randn(*SHAPES[m], device="cuda", dtype=BF16) * 0.02
               for m in ("qkv", "o", "gate_up", "down")} for _ in range(16)]
    return layers, torch.randn(*SHAPES["lm_head"], device="cuda", dtype=BF16) * 0.02


def section2():
    layers, lm_head = chain_weights()
    mats = [(m, layer[m]) for layer in layers for m in layer] + [("lm_head", lm_head)]
    nbytes = sum(w.numel() * 2 for _, w in mats)
    xs = {k: torch.randn(k, device="cuda", dtype=BF16) for k in (2048, 8192)}
    outs = {m: torch.empty(SHAPES[m][0], device="cuda", dtype=BF16) for m in SHAPES}
    ws = Workspace("cuda", 1 << 22, 1 << 16)

    def ours(configs, pdl):
        return lambda: [gemv(w, xs[w.shape[1]], outs[m], config=configs[m], pdl=pdl,
                             workspace=ws) for m, w in mats]

    default = {m: rows(m, c) for m, c in default_configs(True).items()}
    uniform = {m: GemvConfig(8, 2048, 1, 8) for m in SHAPES}
    variants = {"cublas": lambda: [F.linear(xs[w.shape[1]][None], w) for _, w in mats],
                "triton default, no PDL": ours(default, False),
                "triton default, PDL": ours(default, PDL),
                "triton 8x2048 all, PDL": ours(uniform, PDL)}
    if all(BEST.get(m) for m in SHAPES):
        variants["triton best per shape, PDL"] = ours(BEST, PDL)
    for label, fn in variants.items():
        if over(2):
            break
        sec = graph_seconds(fn, 1, replays=10)
        emit(section=2, variant=label, ms=sec * 1e3, tbs=nbytes / sec / 1e12,
             of_copy=nbytes / sec / COPY_RATE, gemvs=len(mats), bytes=nbytes)


def section3():
    heads, kv, d, layers = 32, 8, 64, 16
    for ctx in (128, 1024, 4096, 32768):
        if over(3):
            break
        n = max(2, min(layers, -(-2**28 // (kv * ctx * d * 4))))
        caches = [tuple(torch.randn(kv, ctx, d, device="cuda", dtype=BF16)
                        for _ in range(2)) for _ in range(n)]
        q = torch.randn(heads * d, device="cuda", dtype=BF16)
        out = torch.empty_like(q)
        pos = torch.tensor([ctx - 1], device="cuda")
        nbytes = 2 * kv * ctx * d * 2
        q4 = q.view(1, heads, 1, d)
        sdpa = [(k[None], v[None]) for k, v in caches]
        sec = graph_seconds(lambda: [F.scaled_dot_product_attention(
            q4, k, v, enable_gqa=True) for k, v in sdpa], n)
        emit(section=3, ctx=ctx, impl="sdpa", us=sec * 1e6, tbs=nbytes / sec / 1e12)
        for split in (16, 32, 64):
            for block in (32, 64):
                ws = AttentionWorkspace("cuda", kv, heads // kv, d, split)
                sec = graph_seconds(lambda: [decode_attention(
                    q, k, v, pos, out, n_split=split, block_s=block, pdl=PDL,
                    workspace=ws) for k, v in caches], n)
                emit(section=3, ctx=ctx, impl=f"split{split} block{block}",
                     us=sec * 1e6, tbs=nbytes / sec / 1e12)
        ref = decode_attention(q, *caches[0], pos, n_split=16, block_s=32)
        k0, v0 = caches[0]
        expect = F.scaled_dot_product_attention(q4, k0[None], v0[None],
                                                enable_gqa=True).reshape(-1)
        err = (ref.float() - expect.float()).norm() / expect.float().norm()
        emit(section=3, ctx=ctx, check_rel_err=float(err))
        del caches, sdpa


def llama_1b():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=500000.0, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    return model.to(BF16).eval()


def time_steps(decoder, prompt, steps=100):
    step = decoder.step_function(graph=True)
    decoder.prefill(prompt)
    for _ in range(3):
        step()
    decoder.prefill(prompt)
    start, end = events()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / steps


def section4():
    model = llama_1b()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(0, vocab, (1, 140), generator=gen).cuda()
    prompt = seq[:, :128]
    best = {m: pairs(m, c) for m, c in BEST.items() if c is not None}
    if "lm_head" in best and best["lm_head"].split_k != 1:
        best.pop("lm_head")
    long_prompt = torch.randint(0, vocab, (1, 4096), generator=gen).cuda()
    variants = [("default (PDL, inline combine)", {}, prompt),
                ("no PDL", {"pdl": False}, prompt),
                ("inline argmax too", {"inline_argmax": True}, prompt),
                ("separate combine kernels", {"inline_reduce": False}, prompt),
                ("best section-1 tiling", {"configs": best}, prompt),
                ("default, context 4096", {}, long_prompt)]
    for label, options, start in variants:
        if over(4):
            break
        try:
            length = start.shape[1]
            decoder = TritonDecoder(model, capacity=length + 128, **options)
            sec = time_steps(decoder, start)
            nbytes = decoder.step_bytes(length + 50)
            emit(section=4, variant=label, ms=sec * 1e3, tbs=nbytes / sec / 1e12,
                 of_copy=nbytes / sec / COPY_RATE, bytes=nbytes)
            if label.startswith("default (") or label == "no PDL":
                kernel_breakdown(decoder, start, label)
            if label.startswith("default ("):
                check_logits(model, decoder, seq)
            del decoder
        except Exception:
            emit(section=4, variant=label, error=traceback.format_exc(limit=4)[-600:])
        torch.cuda.empty_cache()


def kernel_breakdown(decoder, prompt, label, steps=5):
    """Device time per step of each kernel, from the profiler, over graph replays.
    Under PDL a kernel starts early and waits, so these overlap: read them as shares."""
    step = decoder.step_function(graph=True)
    decoder.prefill(prompt)
    step()
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[cuda]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for item in prof.key_averages():
        total = (getattr(item, "device_time_total", 0)
                 or getattr(item, "cuda_time_total", 0))
        if total and item.count:
            rows.append((item.key, total / steps, item.count / steps))
    rows.sort(key=lambda r: -r[1])
    emit(section=4, breakdown=label,
         us_per_step={k[:40]: round(us, 1) for k, us, _ in rows},
         calls_per_step={k[:40]: c for k, _, c in rows})


def check_logits(model, decoder, seq):
    """Teacher-forced logits against the BF16 model, and for scale the BF16 model
    against its FP32 self (BF16's own noise)."""
    exact = copy.deepcopy(model).float()
    decoder.prefill(seq[:, :128])
    errs, noise, agree, agree_noise = [], [], 0, 0
    for pos in range(128, 134):
        ours = decoder.step_logits(seq[0, pos], graph=True).float()
        with torch.no_grad():
            ref = model(input_ids=seq[:, : pos + 1]).logits[0, -1].float()
            ref32 = exact(input_ids=seq[:, : pos + 1]).logits[0, -1].float()
        errs.append(float((ours - ref).norm() / ref.norm()))
        noise.append(float((ref - ref32).norm() / ref32.norm()))
        agree += int(ours.argmax()) == int(ref.argmax())
        agree_noise += int(ref.argmax()) == int(ref32.argmax())
    emit(section=4, check="teacher-forced logits vs model", max_rel_err=max(errs),
         top1_agree=f"{agree}/{len(errs)}", bf16_vs_fp32_max_rel_err=max(noise),
         bf16_vs_fp32_top1_agree=f"{agree_noise}/{len(noise)}")
    del exact


INT8_GRID = [GemvConfig(8, 2048, 1, 8), GemvConfig(16, 2048, 1, 8),
             GemvConfig(16, 2048, 1, 16), GemvConfig(32, 1024, 1, 16),
             GemvConfig(8, 4096, 1, 8), GemvConfig(16, 1024, 1, 8),
             GemvConfig(4, 2048, 1, 4), GemvConfig(8, 2048, 1, 4)]
BEST8: dict[str, GemvConfig] = {}


def section5():
    ws = Workspace("cuda", 1 << 22, 1 << 16)
    for name, (n, k) in SHAPES.items():
        count = max(2, min(64, -(-2**28 // (n * k))))
        weights = [quantize_int8(torch.randn(n, k, device="cuda", dtype=BF16) * 0.02)
                   for _ in range(count)]
        x = torch.randn(k, device="cuda", dtype=BF16)
        out = torch.empty(n, device="cuda", dtype=BF16)
        nbytes = weights[0].nbytes
        try:
            compiled = torch.compile(linear, options={"coordinate_descent_tuning": True})
            sec = graph_seconds(lambda: [compiled(x[None], w) for w in weights], count)
            emit(section=5, shape=name, impl="inductor int8", us=sec * 1e6,
                 tbs=nbytes / sec / 1e12)
        except Exception as e:
            emit(section=5, shape=name, impl="inductor int8", error=repr(e)[:200])
        best = (0.0, None)
        for config in INT8_GRID:
            if over(5) and best[1] is not None:
                break
            if config.block_k > k:
                continue
            try:
                sec = graph_seconds(lambda: [gemv(w, x, out, config=config, pdl=PDL,
                                                  workspace=ws) for w in weights], count)
            except Exception as e:
                emit(section=5, shape=name, impl="triton int8", config=cfg_str(config),
                     error=repr(e)[:200])
                continue
            tbs = nbytes / sec / 1e12
            emit(section=5, shape=name, impl="triton int8", config=cfg_str(config),
                 us=sec * 1e6, tbs=tbs)
            if tbs > best[0]:
                best = (tbs, config)
        BEST8[name] = best[1]
        emit(section=5, shape=name, impl="best int8", config=cfg_str(best[1]),
             tbs=best[0])
        del weights
    model = llama_1b()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, 128), generator=gen).cuda()
    best = {m: pairs(m, c) for m, c in BEST8.items() if c is not None}
    for label, options in (("int8 default tiling", {}), ("int8 best tiling",
                                                          {"configs": best})):
        try:
            decoder = TritonDecoder(model, capacity=256, quantize=quantize_int8, **options)
            sec = time_steps(decoder, prompt)
            nbytes = decoder.step_bytes(128 + 50)
            emit(section=5, variant=label, ms=sec * 1e3, tbs=nbytes / sec / 1e12,
                 of_copy=nbytes / sec / COPY_RATE, bytes=nbytes)
            del decoder
        except Exception:
            emit(section=5, variant=label, error=traceback.format_exc(limit=4)[-600:])
        torch.cuda.empty_cache()


def table():
    print("\n==== probe_triton summary ====")
    print(f"{torch.cuda.get_device_name()}, PDL {PDL}, torch {torch.__version__}")
    for r in ROWS:
        if "error" in r:
            print(f"[{r['section']}] ERROR {r.get('shape', r.get('variant', ''))} "
                  f"{r.get('config', '')}: {r['error'][-160:]}")
    print("-- 1. GEMV per matrix, TB/s (weights from HBM) --")
    for name in SHAPES:
        got = [r for r in ROWS if r.get("section") == 1 and r.get("shape") == name]
        cub = next((r["tbs"] for r in got if r["impl"] == "cublas"), float("nan"))
        tri = [r for r in got if r["impl"] == "triton" and "tbs" in r]
        best = max(tri, key=lambda r: r["tbs"], default=None)
        nopdl = next((r["tbs"] for r in tri if r.get("pdl") is False), float("nan"))
        if best:
            sweep = " ".join("%.2f" % r["tbs"] for r in tri)
            print(f"{name:8s} cublas {cub:5.2f}  best {best['tbs']:5.2f} "
                  f"({best['config']})  default-no-PDL {nopdl:5.2f}  [{sweep}]")
    print("-- 2. 65-GEMV chain in one graph --")
    for r in ROWS:
        if r.get("section") == 2:
            print(f"{r['variant']:30s} {r['ms']:.3f} ms  {r['tbs']:.2f} TB/s  "
                  f"{100 * r['of_copy']:.0f}% of copy")
    print("-- 3. decode attention, µs per layer --")
    for ctx in (128, 1024, 4096, 32768):
        got = [r for r in ROWS if r.get("section") == 3 and r.get("ctx") == ctx]
        if got:
            cells = " ".join(f"{r['impl']}={r['us']:.1f}" for r in got if "us" in r)
            err = next((r["check_rel_err"] for r in got if "check_rel_err" in r), None)
            print(f"ctx {ctx:6d}: {cells}  (rel err vs sdpa {err})")
    print("-- 4. TritonDecoder step (BF16, 1B shape, graph) --")
    for r in ROWS:
        if r.get("section") == 4 and "ms" in r:
            print(f"{r['variant']:36s} {r['ms']:.3f} ms/step  {r['tbs']:.2f} TB/s  "
                  f"{100 * r['of_copy']:.0f}% of {COPY_RATE / 1e12:.2f} TB/s")
        elif r.get("section") == 4 and "breakdown" in r:
            cells = ", ".join(f"{k} {v:.0f}us x{r['calls_per_step'][k]:.0f}"
                              for k, v in r["us_per_step"].items())
            print(f"  kernels ({r['breakdown']}): {cells}")
        elif r.get("section") == 4 and "check" in r:
            print(f"{r['check']}: max rel err {r['max_rel_err']:.3g}, "
                  f"top-1 agree {r['top1_agree']} (model BF16 vs FP32: "
                  f"{r['bf16_vs_fp32_max_rel_err']:.3g}, "
                  f"{r['bf16_vs_fp32_top1_agree']})")
    print("-- 5. int8 weights: GEMV per matrix (TB/s of int8 + scales), decoder step --")
    for r in ROWS:
        if r.get("section") == 5 and "tbs" in r:
            what = r.get("shape") or r.get("variant")
            extra = f"  {r['ms']:.3f} ms/step" if "ms" in r else ""
            print(f"{what:20s} {r.get('impl', ''):14s} {r.get('config', ''):18s} "
                  f"{r['tbs']:.2f} TB/s{extra}")
    print(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    for number, section in ((1, section1), (2, section2), (3, section3), (4, section4),
                            (5, section5)):
        try:
            section()
        except Exception:
            emit(section=number, error=traceback.format_exc(limit=4)[-800:])
        torch.cuda.empty_cache()
    table()
