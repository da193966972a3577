"""Random sentence pairs, the model and the loss they go through, shared by the tests of packed batches on the CPU
(training/test_packing.py) and on CUDA (test_cuda.py)."""

import dataclasses

import numpy as np
import torch

from nanomt.core.config import ModelConfig, SpecialIds
from nanomt.core.model import Transformer
from nanomt.training.train import label_smoothed_loss

IDS = SpecialIds(pad=0, bos=1, eos=2)
VOCAB = 40


class Pairs:
    """A corpus of random sentence pairs (what collate and pack read: src(i), tgt(i), the lengths)."""

    def __init__(self, n: int, seed: int, max_len: int = 12):
        rng = np.random.default_rng(seed)
        lens = rng.integers(1, max_len + 1, size=(n, 2))
        self.srcs = [rng.integers(3, VOCAB, size=s) for s, _ in lens]
        self.tgts = [rng.integers(3, VOCAB, size=t) for _, t in lens]
        self.src_lens, self.tgt_lens = lens[:, 0], lens[:, 1]

    def __len__(self) -> int:
        return len(self.srcs)

    def src(self, i: int) -> np.ndarray:
        return self.srcs[i]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgts[i]


def model(**kw) -> Transformer:
    torch.manual_seed(0)
    shape = dict(d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64)
    cfg = ModelConfig(VOCAB, VOCAB, **{**shape, **kw})
    return Transformer(dataclasses.replace(cfg, dropout=0.0, max_positions=64)).float()


def loss_and_grads(m: Transformer, b, fused: bool) -> tuple[torch.Tensor, dict]:
    m.zero_grad(set_to_none=True)
    logits = m(b.src, b.tgt_in, packing=b.packing)
    loss = label_smoothed_loss(logits, b.tgt_out, 0.1, IDS.pad, fused=fused) / b.n_tgt_tokens
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
