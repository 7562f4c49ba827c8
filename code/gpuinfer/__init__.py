"""gpuinfer: the measured code behind the book "GPU & CUDA Inference Optimization"."""

__version__ = "0.2.0"
