"""The Llama model: its configs, weights and math, its cost, and the corpus it is trained on."""
