"""Export to ONNX: the encoder, and one decoder step that takes and returns the self-attention key/value cache.

    encoder.onnx       src (B, S) int64 -> memory (B, S, D)
    decoder_step.onnx  tokens (B, 1) int64, memory (B, S, D), src_mask (B, S) bool (True on real tokens),
                       past_keys, past_values (L, B, H, T, K) -> logits (B, V), keys, values (L, B, H, T+1, K)

B, S and T are dynamic; the first step passes T = 0 (empty caches). Everything else nanomt's options give the model
(pre- or post-norm, shared/tied embeddings, either sinusoid layout or learned positions, the output bias,
restrict_output's -inf logits) is in the graphs, so nothing is refused. `greedy` is the decoding loop over the two
graphs with ONNX Runtime, nanomt's greedy rules in numpy. The run's tokenizer/ and config.yaml (as nanomt.yaml)
are copied next to the graphs.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from nanomt.core.checkpoint import find_run_files, load_checkpoint
from nanomt.core.model import Transformer, attention, merge_heads, split_heads

ENCODER, DECODER_STEP, EXPORTED_CONFIG = "encoder.onnx", "decoder_step.onnx", "nanomt.yaml"
OPSET = 17
INSTALL_HINT = "pip install 'nanomt[export]'"


class EncoderGraph(nn.Module):
    """src (B, S) -> memory (B, S, D)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> Tensor:
        # model.encode, with padding_mask's in-place fix-up of all-padding rows written as an expression.
        mask = src != self.model.cfg.pad_id  # (B, S)
        first = torch.cumsum(torch.ones_like(src), dim=1) == 1  # (B, S) True at position 0
        mask = (mask | (first & ~mask.any(dim=1, keepdim=True)))[:, None, None, :]  # (B, 1, 1, S)
        x = self.model.src_embed(src)
        for layer in self.model.encoder:
            x, _ = layer(x, mask)
        return self.model.encoder_norm(x)


class DecoderStepGraph(nn.Module):
    """One decoding step on explicit tensors: the cache goes in and comes out one position longer."""

    # model.decode writes into preallocated buffers at a Python-int position; a graph needs the position as data
    # and the cache as plain tensors, so the step is spelled out here with the model's own modules.

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def embed(self, tokens: Tensor, step: Tensor) -> Tensor:
        """tokens (B, 1) at position `step` (a 0-d tensor) -> (B, 1, D), as the model's target Embedding."""
        e = self.model.tgt_embed
        table = e.positions.weight if e.positions is not None else e.table  # (P, D)
        return e.tokens(tokens) * e.scale + table.index_select(0, step.view(1))  # (B, 1, D)

    def forward(
        self, tokens: Tensor, memory: Tensor, src_mask: Tensor, past_keys: Tensor, past_values: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        # The cache's length as data: a count over its time axis stays dynamic in the graph (a Python int would not).
        step = torch.ones_like(past_keys[0, 0, 0, :, 0]).sum().long()
        x = self.embed(tokens, step)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        keys, values = [], []
        for i, layer in enumerate(self.model.decoder):
            x, k, v = self.layer(layer, x, memory, mask, past_keys[i], past_values[i])
            keys.append(k)
            values.append(v)
        logits = self.model.logits(self.model.decoder_norm(x))[:, -1]  # (B, V)
        return logits, torch.stack(keys), torch.stack(values)  # (L, B, H, T+1, K) each

    @staticmethod
    def self_attention(attn: nn.Module, x: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """SelfAttention with the new key/value appended to the past ones (B, H, T, K)."""
        q, k, v = (split_heads(z, attn.n_heads) for z in attn.qkv(x).chunk(3, dim=-1))  # 3 x (B, H, 1, K)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (B, H, T+1, K)
        y, _ = attention(q, k, v)  # the one new query may see every position so far
        return attn.out(merge_heads(y)), k, v

    def layer(self, layer: nn.Module, x: Tensor, memory: Tensor, mask: Tensor, past_k: Tensor, past_v: Tensor):
        """nanomt.core.model.DecoderLayer.forward for one new position (eval mode: no dropout)."""
        cross_kv = layer.cross_attn.memory_kv(memory)
        if layer.norm_first:
            h, k, v = self.self_attention(layer.self_attn, layer.norm1(x), past_k, past_v)
            x = x + h
            x = x + layer.cross_attn(layer.norm2(x), cross_kv, mask)[0]
            x = x + layer.ffn(layer.norm3(x))
        else:
            h, k, v = self.self_attention(layer.self_attn, x, past_k, past_v)
            x = layer.norm1(x + h)
            x = layer.norm2(x + layer.cross_attn(x, cross_kv, mask)[0])
            x = layer.norm3(x + layer.ffn(x))
        return x, k, v


def empty_cache(model_cfg, batch: int) -> np.ndarray:
    """The first step's past_keys/past_values: (L, B, H, 0, K) float32."""
    h = model_cfg.n_heads
    return np.zeros((model_cfg.n_decoder_layers, batch, h, 0, model_cfg.d_model // h), dtype=np.float32)


def export_onnx(run: str | Path, out: str | Path) -> Path:
    """Write encoder.onnx and decoder_step.onnx (plus tokenizer/ and nanomt.yaml) for a nanomt checkpoint."""
    run, out = Path(run), Path(out)
    model, cfg, _ = load_checkpoint(run)
    config_path, tokenizer_dir = find_run_files(run)
    m = cfg.model
    if m.n_decoder_layers < 1:
        raise ValueError("an ONNX decoder step needs at least one decoder layer (n_decoder_layers: 0)")
    out.mkdir(parents=True, exist_ok=True)
    src = torch.tensor([[5, 6, 7, m.eos_id], [5, 6, m.eos_id, m.pad_id]])  # (B, S): any ids, padding included
    memory = model.encode(src).memory
    past = torch.zeros(m.n_decoder_layers, 2, m.n_heads, 3, m.d_model // m.n_heads)  # an example with 3 positions
    step_args = (torch.tensor([[m.bos_id], [m.bos_id]]), memory, src != m.pad_id, past, past)
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer warns about every Python-level check on a shape (max_positions, the output mask's size).
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
    shutil.copytree(tokenizer_dir, out / "tokenizer", dirs_exist_ok=True)
    shutil.copyfile(config_path, out / EXPORTED_CONFIG)
    return out


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
