"""Decoders: Chapter 2's loops, the static-cache, Triton and speculative decoders, and how a step is run."""
