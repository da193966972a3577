"""Export to ONNX: the model's own encoder, and its decoder step with the self-attention key/value cache in and out.

    encoder.onnx       src (B, S) int64 -> memory (B, S, D)
    decoder_step.onnx  tokens (B, 1) int64, memory (B, S, D), src_mask (B, S) bool (True on real tokens),
                       past_keys, past_values (L, B, H, T, K) -> logits (B, V), keys, values (L, B, H, T+1, K)

B, S and T are dynamic; the first step passes T = 0 (empty caches). The graphs are traces of `Transformer.encode` and
`Transformer.decode`, so everything nanomt's options give the model (pre- or post-norm, shared/tied embeddings,
either sinusoid layout or learned positions, the output bias, restrict_output's -inf logits) is in them and nothing
is refused. `greedy` is the decoding loop over the two graphs with ONNX Runtime, nanomt's greedy rules in numpy. The
run's tokenizer/ and config.yaml (as nanomt.yaml) are copied next to the graphs.
"""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from nanomt.core.checkpoint import find_run_files, load_checkpoint
from nanomt.core.model import DecoderCache, Encoded, Transformer

ENCODER, DECODER_STEP, EXPORTED_CONFIG = "encoder.onnx", "decoder_step.onnx", "nanomt.yaml"
OPSET = 17
INSTALL_HINT = "pip install 'nanomt[export]'"


class EncoderGraph(nn.Module):
    """src (B, S) -> memory (B, S, D): `Transformer.encode`."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> Tensor:
        return self.model.encode(src).memory


class DecoderStepGraph(nn.Module):
    """One `Transformer.decode` step on explicit tensors: the cache goes in and comes out one position longer."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(
        self, tokens: Tensor, memory: Tensor, src_mask: Tensor, past_keys: Tensor, past_values: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        enc = Encoded(memory, src_mask[:, None, None, :])  # (B, 1, 1, S)
        # A cache of exactly T+1 positions: decode writes the new key/value into the last one and never grows it.
        # Traced, the cache's length T is data (the past's size, not a Python int), so the graph takes any T.
        keys, values = with_room(past_keys), with_room(past_values)  # (L, B, H, T+1, K)
        layers = tuple(
            dataclasses.replace(c, self_k=k, self_v=v)  # the model's cross-attention K/V, these self-attention ones
            for c, k, v in zip(self.model.init_cache(enc).layers, keys.unbind(0), values.unbind(0))
        )
        out = self.model.decode(tokens, enc, DecoderCache(layers, past_keys.size(3)))
        keys = torch.stack([c.self_k for c in out.cache.layers])  # (L, B, H, T+1, K)
        values = torch.stack([c.self_v for c in out.cache.layers])
        return out.logits[:, -1], keys, values  # logits (B, V)


def with_room(past: Tensor) -> Tensor:
    """(L, B, H, T, K) -> (L, B, H, T+1, K): the past and one zero position after it."""
    return torch.cat([past, past.new_zeros(*past.shape[:3], 1, past.size(4))], dim=3)


def empty_cache(model_cfg, batch: int) -> np.ndarray:
    """The first step's past_keys/past_values: (L, B, H, 0, K) float32."""
    h = model_cfg.n_heads
    return np.zeros((model_cfg.n_decoder_layers, batch, h, 0, model_cfg.d_model // h), dtype=np.float32)


def export_onnx(run: str | Path, out: str | Path) -> Path:
    """Write encoder.onnx and decoder_step.onnx (plus tokenizer/ and nanomt.yaml) for a nanomt checkpoint."""
    run, out = Path(run), Path(out)
    model, _, _ = load_checkpoint(run)
    config_path, tokenizer_dir = find_run_files(run)
    export_graphs(model, out)
    shutil.copytree(tokenizer_dir, out / "tokenizer", dirs_exist_ok=True)
    shutil.copyfile(config_path, out / EXPORTED_CONFIG)
    return out


def export_graphs(model: Transformer, out: Path) -> None:
    """Trace an eval-mode model's encode and decode into out/encoder.onnx and out/decoder_step.onnx."""
    m = model.cfg
    if m.n_decoder_layers < 1:
        raise ValueError("an ONNX decoder step needs at least one decoder layer (n_decoder_layers: 0)")
    if model.training:
        raise ValueError("export a model in eval mode: a trace in train mode would keep its dropout")
    out.mkdir(parents=True, exist_ok=True)
    src = torch.tensor([[5, 6, 7, m.eos_id], [5, 6, m.eos_id, m.pad_id]])  # (B, S): any ids, padding included
    with torch.no_grad():
        memory = model.encode(src).memory
    past = torch.zeros(m.n_decoder_layers, 2, m.n_heads, 3, m.d_model // m.n_heads)  # an example with 3 positions
    step_args = (torch.tensor([[m.bos_id], [m.bos_id]]), memory, src != m.pad_id, past, past)
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer warns about every Python-level check on a shape (max_positions, the cache's capacity): each is
        # fixed at its traced outcome, which holds for any input (decode's cache never grows here, see above).
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # The TorchScript exporter on purpose (torch's newer one needs onnxscript); it warns of its own deprecation.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            EncoderGraph(model),
            (src,),
            str(out / ENCODER),
            input_names=["src"],
            output_names=["memory"],
            dynamic_axes={"src": {0: "batch", 1: "src_len"}, "memory": {0: "batch", 1: "src_len"}},
            opset_version=OPSET,
            dynamo=False,
        )
        cache_axes = {1: "batch", 3: "past_len"}
        torch.onnx.export(
            DecoderStepGraph(model),
            step_args,
            str(out / DECODER_STEP),
            input_names=["tokens", "memory", "src_mask", "past_keys", "past_values"],
            output_names=["logits", "keys", "values"],
            dynamic_axes={
                "tokens": {0: "batch"},
                "memory": {0: "batch", 1: "src_len"},
                "src_mask": {0: "batch", 1: "src_len"},
                "past_keys": cache_axes,
                "past_values": cache_axes,
                "logits": {0: "batch"},
                "keys": {1: "batch", 3: "len"},
                "values": {1: "batch", 3: "len"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def sessions(onnx_dir: str | Path, threads: int = 1):
    """ONNX Runtime sessions (encoder, decoder step) for an `export_onnx` directory."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ImportError(f"running the ONNX export needs onnxruntime: {INSTALL_HINT}") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    onnx_dir = Path(onnx_dir)
    return tuple(
        ort.InferenceSession(str(onnx_dir / name), options, providers=["CPUExecutionProvider"])
        for name in (ENCODER, DECODER_STEP)
    )


def greedy(encoder, decoder_step, src: np.ndarray, model_cfg, max_lens: list[int], min_len: int = 0) -> list[list[int]]:
    """nanomt's greedy search over the exported graphs: src (B, S) int64 right-padded, each row ending with EOS."""
    # The same rules: PAD and BOS never generated, EOS blocked for the first min_len steps, at most max_lens[i]
    # tokens (EOS included); finished rows keep decoding here (cheaper to read than dropping them) and are cut after.
    pad, bos, eos = model_cfg.pad_id, model_cfg.bos_id, model_cfg.eos_id
    banned = sorted({pad, bos} - {eos})
    (memory,) = encoder.run(None, {"src": src})
    b = src.shape[0]
    keys = values = empty_cache(model_cfg, b)
    tokens = np.full((b, 1), bos, dtype=np.int64)
    out = np.full((b, max(max_lens)), eos, dtype=np.int64)
    for step in range(out.shape[1]):
        feeds = {"tokens": tokens, "memory": memory, "src_mask": src != pad, "past_keys": keys, "past_values": values}
        logits, keys, values = decoder_step.run(None, feeds)
        logits[:, banned] = -np.inf
        if step < min_len:
            logits[:, eos] = -np.inf
        out[:, step] = logits.argmax(axis=-1)
        tokens = out[:, step : step + 1]
    results = []
    for row, limit in zip(out.tolist(), max_lens):
        row = row[:limit]
        results.append(row[: row.index(eos)] if eos in row else row)
    return results
