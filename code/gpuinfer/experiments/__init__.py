"""Chapter experiments that sweep or compare variants: the batch sweep and the GEMV bench."""
