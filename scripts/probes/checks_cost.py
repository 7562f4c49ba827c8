"""Probe (issue 44): do the decoders' checks cost anything measurable? Chapter 5's Triton
step on the 1B model (BF16, prompt 128), as checked now and as main had it before the
checks (commit given to `old_package.sh`, imported as `gpuinfer_old`), in the same
interleaved rounds: the graphed step (the replay: the kernels' masked writes are all that
changed in it) and the eager step called from Python (`decode_step`, with the host-side
count). Tokens of the two are asserted equal.

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
from gpuinfer.measure.timing import interleaved_rounds  # noqa: E402
from gpuinfer.model.configs import build_model, model_config, random_prompt  # noqa: E402
from gpuinfer_old.decode.triton_step import TritonDecoder as OldDecoder  # noqa: E402

PROMPT, NEW, REPLAYS, EAGER, ROUNDS = (8, 4, 2, 2, 2) if SMOKE else (128, 128, 100, 20, 21)

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
model = build_model(model_config(MODEL), seed=0, dtype=torch.bfloat16, device=DEVICE)
prompt = random_prompt(model.config, PROMPT, device=DEVICE)
capacity = capacity_for(PROMPT, NEW + REPLAYS)
decoders = {"checked": TritonDecoder(model, capacity=capacity),
            "before": OldDecoder(model, capacity=capacity)}
tokens = {name: d.generate(prompt, NEW) for name, d in decoders.items()}
assert torch.equal(tokens["checked"], tokens["before"]), "the checks changed the tokens"

fns = {}
for name, d in decoders.items():
    d.prefill(prompt)
    replay = d.step_function()  # the captured step

    def graphed(d=d, replay=replay):
        d.pos.fill_(PROMPT)
        for _ in range(REPLAYS):
            replay()

    def eager(d=d):
        d.pos.fill_(PROMPT)
        if hasattr(d, "host_pos"):
            d.host_pos = PROMPT
        for _ in range(EAGER):
            d.decode_step()

    fns[name, "graphed"], fns[name, "eager"] = graphed, eager

with torch.no_grad():
    graphed_rounds = interleaved_rounds({k: f for k, f in fns.items() if k[1] == "graphed"},
                                        rounds=ROUNDS, per_call=REPLAYS / 1e3)
    eager_rounds = interleaved_rounds({k: f for k, f in fns.items() if k[1] == "eager"},
                                      rounds=ROUNDS, per_call=EAGER / 1e3)
result = {}
for rounds in (graphed_rounds, eager_rounds):
    for key in rounds.names:
        t = rounds[key]
        result[" ".join(key)] = {"median_us": t.median, "q1_us": t.q1, "q3_us": t.q3,
                                 "min_us": t.min, "max_us": t.max,
                                 "rounds": len(t.times_ms)}
    a, b = rounds.names
    print(rounds.compare(a, b).sentence())
print(json.dumps(result, indent=1))
(out / "checks_cost.json").write_text(json.dumps({
    "gpu": "CPU smoke run" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
    "prompt": PROMPT, "capacity": capacity, "tokens_equal": True, "us_per_step": result},
    indent=1))
