"""The model and what it stands on: configs, the Transformer, tokenizers, checkpoints, the runtime."""
