"""Probe (issue 44): do the decoders' checks cost anything measurable? Chapter 5's Triton
step on the 1B model (BF16, prompt 128), as checked now and as main had it before the
checks (commit given to `old_package.sh`, imported as `gpuinfer_old`), in the same
interleaved rounds, two decoders of each (the difference between identical ones is the
noise floor): the graphed step, in which the kernels' masked writes and clamped reads are
all that changed; then each kernel's time in a profile. Tokens are asserted equal.

    bash scripts/probes/old_package.sh 2661907    # writes .probe/gpuinfer_old (ignored)
    python scripts/probes/checks_cost.py OUT_DIR   # on the GPU, .probe carried
"""

import json
import sys
from pathlib import Path

import torch

SMOKE = not torch.cuda.is_available()  # a dry run of the script, interpreted, on a CPU
if SMOKE:
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()
DEVICE, MODEL = ("cpu", "reduced") if SMOKE else ("cuda", "1b")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".probe"))

from gpuinfer.decode.static import capacity_for  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.measure.rounds import interleaved_rounds  # noqa: E402
from gpuinfer.model.configs import build_model, model_config, random_prompt  # noqa: E402
from gpuinfer_old.decode.triton_step import TritonDecoder as OldDecoder  # noqa: E402

PROMPT, NEW, REPLAYS, EAGER, ROUNDS = (8, 4, 2, 2, 2) if SMOKE else (128, 128, 100, 20, 21)

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
model = build_model(model_config(MODEL), seed=0, dtype=torch.bfloat16, device=DEVICE)
prompt = random_prompt(model.config, PROMPT, device=DEVICE)
capacity = capacity_for(PROMPT, NEW + REPLAYS)
# Two decoders of each: the difference between two identical ones (A and B, the same
# kernels on other buffers) is the noise floor a difference of the checks must beat.
decoders = {"checked": TritonDecoder(model, capacity=capacity),
            "before": OldDecoder(model, capacity=capacity),
            "checked B": TritonDecoder(model, capacity=capacity),
            "before B": OldDecoder(model, capacity=capacity)}
tokens = {name: d.generate(prompt, NEW) for name, d in decoders.items()}
assert all(torch.equal(t, tokens["before"]) for t in tokens.values()), "tokens differ"

fns = {}
for name, d in decoders.items():
    d.prefill(prompt)
    replay = d.step_function()  # the captured step

    def graphed(d=d, replay=replay):
        d.pos.fill_(PROMPT)
        for _ in range(REPLAYS):
            replay()

    fns[name] = graphed

with torch.no_grad():
    rounds = interleaved_rounds(fns, rounds=ROUNDS, per_call=REPLAYS / 1e3)
result = {}
for key in rounds.names:
    t = rounds[key]
    result[key] = {"median_us": t.median, "q1_us": t.q1, "q3_us": t.q3, "min_us": t.min,
                   "max_us": t.max, "rounds": len(t.times_ms)}
for a, b in (("checked", "before"), ("checked", "checked B"), ("before", "before B"),
             ("checked B", "before B")):
    print(rounds.compare(a, b).sentence())
print(json.dumps(result, indent=1))

# Where a difference sits: each kernel's mean time, by name, for one decoder of each.
kernels = {}
for name in ("checked", "before"):
    d = decoders[name]
    d.prefill(prompt)
    replay = d.step_function()
    if SMOKE:
        break
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            replay()
        torch.cuda.synchronize()
    kernels[name] = {e.key[:60]: (e.device_time_total / 20, e.count / 20)
                     for e in prof.key_averages()}
if kernels:
    print(f"{'kernel':60} {'checked us/step':>16} {'before us/step':>15} {'count':>6}")
    for key in sorted(kernels["checked"], key=lambda k: -kernels["checked"][k][0]):
        c, n = kernels["checked"][key]
        b = kernels["before"].get(key, (float("nan"), 0))[0]
        print(f"{key:60} {c:16.2f} {b:15.2f} {n:6.0f}")
(out / "checks_cost.json").write_text(json.dumps({
    "gpu": "CPU smoke run" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
    "prompt": PROMPT, "capacity": capacity, "tokens_equal": True, "us_per_step": result,
    "kernels_us_per_step": kernels},
    indent=1))
