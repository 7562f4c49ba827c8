"""The fresh process that times one stock `generate()` variant for `gpuinfer.measure.stock`:
`python -m gpuinfer.measure.stock_process ARGS [OUT]`, ARGS the JSON that `stock_fresh`
writes. It builds the chapter's model and prompt, makes a first generation (which
compiles), warms up, then times interleaved rounds of a whole generation and a one-token one.
"""

from __future__ import annotations

import functools
import json
import sys
import time

import torch

from gpuinfer.measure.stock import DOCS_RECOMPILE_LIMIT

def _describe(err: BaseException) -> str:
    """`Type: first line of the message`, short enough for a table cell."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first.replace('`', chr(39)).replace('|', '/')[:240]}"


def _measure(args: dict) -> dict:
    """Build the model, run the variant, time it: a dict of StockRun's fields."""
    import warnings

    import transformers
    from torch._dynamo.utils import counters

    from gpuinfer.measure.rounds import interleaved_rounds
    from gpuinfer.measure.timing import wall_seconds
    from gpuinfer.model.configs import build_model, model_config, random_prompt
    from gpuinfer.model.stock_generate import decode_generate, decode_generate_static

    warnings.filterwarnings("ignore", message="IProgress not found")  # transformers' tqdm
    transformers.logging.set_verbosity_error()  # generate()'s advice to users
    variant, n = args["variant"], args["new_tokens"]
    device = torch.device(args["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but this process sees no CUDA device")
    if device.type == "cuda" and args.get("gpu_budget_gib") is not None:
        from gpuinfer.env import cap_gpu_memory

        cap_gpu_memory(args["gpu_budget_gib"])
    if device.type == "cpu":
        torch.set_num_threads(1)  # a smoke run's tiny ops only lose to threads' syncs
    torch.set_float32_matmul_precision("highest")  # FP32 stays FP32, as in the chapters
    config = model_config(args["config"], **args["overrides"])
    model = build_model(config, seed=args["seed"], dtype=getattr(torch, args["dtype"]),
                        device=device, attn_implementation=args["attn_implementation"])
    prompt = random_prompt(config, args["prompt_len"], seed=args["prompt_seed"],
                           device=device)
    fn = decode_generate if variant == "dynamic" else decode_generate_static
    generate = functools.partial(fn, model)
    clock = "cuda-event" if device.type == "cuda" else "host"
    result = {"variant": variant, "clock": clock}
    try:
        if variant == "docs":  # the transformers docs' recipe ("Optimizing inference")
            model.forward = torch.compile(model.forward, mode="reduce-overhead",
                                          fullgraph=True)
        with torch._dynamo.config.patch(
                **({"recompile_limit": DOCS_RECOMPILE_LIMIT,
                    "fail_on_recompile_limit_hit": True} if variant == "docs" else {})):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            tokens, result["first_call_s"] = wall_seconds(lambda: generate(prompt, n))
            if device.type == "cuda":
                result["peak_bytes"] = torch.cuda.max_memory_allocated()
            result["tokens"] = tokens[0].tolist()
            start = time.perf_counter()
            for _ in range(args["warmup"]):
                generate(prompt, n)
                generate(prompt, 1)
            result["seconds"] = {"warm-up": time.perf_counter() - start}
            start = time.perf_counter()
            result["compiled"] = variant == "docs" or "_compiled_call" in vars(model)
            graphs = counters["stats"]["unique_graphs"]
            timed = interleaved_rounds({n: functools.partial(generate, prompt, n),
                                        1: functools.partial(generate, prompt, 1)},
                                       rounds=args["rounds"], warmup=0)
            result["graphs_in_rounds"] = counters["stats"]["unique_graphs"] - graphs
            result["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
            result["seconds"]["rounds"] = time.perf_counter() - start
    except Exception as err:  # noqa: BLE001 - a stock variant that fails is reported
        return {**result, "error": _describe(err)}  # with what it got to, its first call
    whole, first = timed.times_ms[n], timed.times_ms[1]
    result.update(whole_ms=list(whole), prefill_ms=list(first),
                  decode_ms=[(w - f) / (n - 1) for w, f in zip(whole, first)])
    return result


def main(argv: list[str]) -> None:
    """`python -m gpuinfer.measure.stock_process ARGS [OUT]`: the result as JSON, into the
    file OUT (where `stock_fresh` reads it), or without OUT onto stdout (to run one by
    hand)."""
    empty = {"decode_ms": [], "prefill_ms": [], "whole_ms": [], "tokens": [], "seconds": {}}
    result = {**empty, **_measure(json.loads(argv[0]))}
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf8") as f:
            json.dump(result, f)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
