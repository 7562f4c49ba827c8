"""The "Your model" page (book/your_model.md): its check runs as printed, on a checkpoint
folder, on the CPU; every name its GPU sketch imports exists; and on a GPU the sketch
runs whole."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuinfer.model.configs import build_model, model_config

PAGE = Path(__file__).resolve().parent.parent / "book" / "your_model.md"


def code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf8"), re.S)


def test_the_pages_check_runs_on_a_checkpoint(checkpoint, capsys):
    check = code_blocks()[0]
    assert 'CHECKPOINT = "path/to/llama"' in check
    exec(check.replace("path/to/llama", str(checkpoint)), {})  # its assert: FP32 exact
    assert re.search(r"BF16: top-1 agreement \d+\.\d% over 32 steps", capsys.readouterr().out)


def test_the_gpu_sketch_imports_what_exists():
    sketch = code_blocks()[1]
    for line in sketch.splitlines():
        if line.startswith("from "):
            exec(line, {})


@pytest.mark.gpu
def test_the_gpu_sketch_runs_whole(checkpoint, tmp_path):
    """The page's check, then its GPU sketch, as printed, on checkpoint folders (the
    target, and a smaller Llama of the same vocabulary as the draft), in a fresh
    process as a reader runs them: in this one, the tests before compiled the same
    step for other decoders, and dynamo compiles one function at most 8 times."""
    draft = build_model(model_config("reduced", num_hidden_layers=1), seed=3)
    draft.save_pretrained(tmp_path / "draft")
    check, sketch = code_blocks()[:2]
    script = (check.replace("path/to/llama", str(checkpoint)) + sketch.replace(
        "path/to/small-llama", str(tmp_path / "draft")) + CHECKS)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sketch ran whole" in run.stdout


CHECKS = """
assert tokens.shape == (1, NEW) and tokens.dtype == torch.int64
assert triton.device.type == "cuda" and int8.quantized and spec.passes >= 1
print("sketch ran whole")
"""
