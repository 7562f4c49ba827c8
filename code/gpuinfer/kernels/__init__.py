"""Triton kernels of a batch-1 decode step (Chapter 5), each beside a plain-PyTorch
reference that computes the same thing with FP32 accumulation.

- common: interpreter and PDL detection, launch options, dtype rounding, the split-K
  workspace shared by every GEMV, and the "last program finishes" reduction
- gemv: W @ x with an optional RMSNorm prologue; plain, residual-add and SiLU(gate) * up
  epilogues; optional split-K; weight tiles loaded before the PDL wait
- rotary: the q/k/v GEMV whose epilogue applies the rotary embedding and writes the new
  key and value into the KV cache
- attention: split-KV ("flash-decoding") attention of grouped-query heads at batch 1
- argmax: the lm_head GEMV with the greedy argmax fused in, and the embedding lookup of
  the step's input token
- tiling: each kernel's tiling on a GPU and under the interpreter (the probe's best)
- interpret: `use_interpreter()`, to run the kernels on a CPU under Triton's interpreter
  (call it before importing the others)
- aot: compile the kernels for sm_80, sm_89 and sm_90 without a GPU, to read their
  registers and spills

`gpuinfer.decode.triton_step.TritonDecoder` launches them as a whole decode step. They
read pos and the token from tensors, unchecked (a CUDA graph replays them), and stay
inside their buffers whatever those hold: writes past the cache or the tokens are
masked, reads clamped.
"""
