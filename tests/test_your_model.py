"""The "Your model" page (book/your_model.md): its check runs as printed, on a checkpoint
folder, on the CPU; and every name its GPU sketch imports exists."""

import re
from pathlib import Path

import torch

from gpuinfer.model.configs import build_model, model_config
from gpuinfer.model.train import train

PAGE = Path(__file__).resolve().parent.parent / "book" / "your_model.md"


def code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf8"), re.S)


def test_the_pages_check_runs_on_a_checkpoint(tmp_path, capsys):
    model = build_model(model_config("reduced"), seed=0)
    tokens = torch.arange(64).repeat(40) % model.config.vocab_size
    train(model, tokens, steps=15, batch=4, seq_len=32, lr=3e-3, warmup=2)
    model.eval().save_pretrained(tmp_path)
    check = code_blocks()[0]
    assert 'CHECKPOINT = "path/to/llama"' in check
    exec(check.replace("path/to/llama", str(tmp_path)), {})  # its assert: FP32 exact
    assert re.search(r"BF16: top-1 agreement \d+\.\d% over 32 steps", capsys.readouterr().out)


def test_the_gpu_sketch_imports_what_exists():
    sketch = code_blocks()[1]
    for line in sketch.splitlines():
        if line.startswith("from "):
            exec(line, {})
