"""The "Your model" page (book/your_model.md): its check runs as printed, on a checkpoint
folder, on the CPU; and every name its GPU sketch imports exists."""

import re
from pathlib import Path

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
