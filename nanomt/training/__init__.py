"""Corpora and batches, the training loop, the toy language pair, evaluation."""
