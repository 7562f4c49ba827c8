"""Measuring: timing, launch costs, ceilings, profiling, the roofline, logit agreement."""
