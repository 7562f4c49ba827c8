"""Chapter experiments that sweep or compare variants: the batch sweep, the GEMV bench."""
