"""Measuring: timing, launch costs, ceilings, profiling, the roofline and logit agreement."""
