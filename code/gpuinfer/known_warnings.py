"""The warnings a chapter's run is known to raise, and why none of them is for the reader.

- torch's profiler notes, on every profiled run, that it "clears events at the end of each
  cycle": a chapter profiles one cycle at a time and reads all of it.
- torch.compile notes "dynamo_pgo force disabled" whenever its caches are off, which the
  chapters turn off on purpose so that every first call compiles from nothing.
- Inductor notes that TF32 tensor cores are "available but not enabled": FP32 products
  stay FP32 on purpose, so that FP32 variants give exactly the reference tokens.
- tqdm notes "IProgress not found" in a kernel without Jupyter's widgets: nothing here
  shows a progress bar.

`silence()` filters exactly these, by message, and nothing else: a new warning still
reaches the recording, where a maintainer reads it.
"""

import warnings

KNOWN = ("Warning: Profiler clears events at the end of each cycle",
         "dynamo_pgo force disabled",
         "TensorFloat32 tensor cores for float32 matrix multiplication available",
         "IProgress not found")


def silence() -> None:
    """Ignore the known warnings (KNOWN) in this process from now on."""
    for message in KNOWN:
        warnings.filterwarnings("ignore", message=".*" + message)
