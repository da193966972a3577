"""nanomt: the original Transformer for machine translation, from scratch in PyTorch."""
