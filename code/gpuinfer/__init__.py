"""gpuinfer: the measured code behind the book "GPU & CUDA Inference Optimization".

One idea per module:
- env: where the code runs (device, smoke mode, provenance of a run)
- timing: CUDA-event timing with warm-up, repeats and input rotation
- roofline: datasheet ceilings, arithmetic intensity, attainable performance
- plots: the book's figure style and the roofline plot
"""

__version__ = "0.1.0"
