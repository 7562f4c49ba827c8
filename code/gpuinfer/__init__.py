"""gpuinfer: the measured code behind the book "GPU & CUDA Inference Optimization".

One idea per module:
- env: where the code runs (device, smoke mode, provenance of a run)
- timing: CUDA-event timing with warm-up, repeats, input rotation and graph replays
- roofline: datasheet ceilings, arithmetic intensity, attainable performance
- ceilings: the ceilings of this GPU, measured (copy bandwidth, matmul peak)
- plots: the book's figure style and the roofline plot
- llama: the decode workload, a small Llama with seeded random weights
- decode: Chapter 2's greedy decode loops (V0 naive ... the lean loop)
- profiling, traceplot: torch.profiler traces, their analysis, and timeline figures
- launch: launch overhead, fusion and CUDA-graph replay of a chain of small ops
- static_decode: a decode step with fixed shapes and addresses, graphed and compiled
- scale: a Llama-3.2-1B-shaped model, bytes per step, MBU and the batch roofline
- recordings, record, sphinx_recordings, sphinx_site, compare: recording chapters on the GPU
  and building the site from the recordings
"""

__version__ = "0.1.0"
