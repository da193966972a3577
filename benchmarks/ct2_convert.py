"""Convert a nanomt checkpoint to CTranslate2, and time CTranslate2 translating a file with it.

    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR                       # convert (float32 weights)
    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR --src test.de --json  # + translate, time, print JSON

This file never imports torch (nor nanomt, which does): CTranslate2 in a process that has imported torch ran
~2.5x slower in the baselines' measurements (two OpenMP runtimes), so the checkpoint is read with safetensors'
numpy loader and PyYAML. `benchmarks.speed` runs it as a worker for the `translate` section.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import ctranslate2
import numpy as np
import sentencepiece as spm
import yaml
from ctranslate2.specs import common_spec, transformer_spec
from safetensors.numpy import load_file

ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELU,  # erf GELU, as torch's F.gelu
    "swish": common_spec.Activation.SWISH,
}


def run_files(checkpoint: Path) -> tuple[Path, Path]:
    """config.yaml and tokenizer/ of a checkpoint: in it, or in the run dir above checkpoints/step_N."""
    for root in (checkpoint, checkpoint.parent.parent):
        if (root / "config.yaml").is_file() and (root / "tokenizer").is_dir():
            return root / "config.yaml", root / "tokenizer"
    sys.exit(f"ct2_convert.py: error: {checkpoint} is not a nanomt checkpoint (no config.yaml and tokenizer/)")


def sentencepiece_processors(tokenizer_dir: Path) -> tuple[spm.SentencePieceProcessor, spm.SentencePieceProcessor]:
    """Source and target SentencePiece processors (one shared model file, or src.model + tgt.model)."""
    shared = tokenizer_dir / "spm.model"
    paths = (shared, shared) if shared.is_file() else (tokenizer_dir / "src.model", tokenizer_dir / "tgt.model")
    return tuple(spm.SentencePieceProcessor(model_file=str(p)) for p in paths)


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """nanomt.model.sinusoidal_table in numpy: sin on even dims, cos on odd dims (CT2's own table splits halves)."""
    position = np.arange(n_positions, dtype=np.float64)[:, None]
    inv_freq = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-np.log(10000.0) / d_model))
    table = np.zeros((n_positions, d_model))
    table[:, 0::2] = np.sin(position * inv_freq)
    table[:, 1::2] = np.cos(position * inv_freq)
    return table.astype(np.float32)


def set_linear(spec, w: dict, name: str) -> None:
    """Weight (and bias, if any) of nanomt's nn.Linear `name` into a CT2 LinearSpec."""
    spec.weight = w[f"{name}.weight"]  # (out, in), as torch stores it
    if f"{name}.bias" in w:
        spec.bias = w[f"{name}.bias"]


def set_norm(spec, w: dict, name: str) -> None:
    """Gain and bias of nanomt's LayerNorm `name` into a CT2 LayerNormSpec."""
    spec.gamma, spec.beta = w[f"{name}.weight"], w[f"{name}.bias"]


def build_spec(model: dict, w: dict, src_vocab: list[str], tgt_vocab: list[str]):
    """A CTranslate2 TransformerSpec holding nanomt's weights (names as in nanomt.model)."""
    pre_norm = model["norm_first"]
    spec = transformer_spec.TransformerSpec.from_config(
        (model["n_encoder_layers"], model["n_decoder_layers"]),
        model["n_heads"],
        pre_norm=pre_norm,
        activation=ACTIVATIONS[model["activation"]],
    )
    src_embed = w["src_embed.tokens.weight"]
    tgt_embed = src_embed if model["share_embeddings"] else w["tgt_embed.tokens.weight"]
    output = tgt_embed if model["tie_output"] else w["output.weight"]
    d, n = model["d_model"], model["max_positions"]

    def positions(side: str) -> np.ndarray:
        if model["positional"] == "learned":
            return w[f"{side}_embed.positions.weight"]
        return sinusoidal_table(n, d)

    # Both sides: embeddings scaled by sqrt(d_model) (3.4), then positions; CT2 does the same.
    spec.encoder.embeddings[0].weight = src_embed
    spec.encoder.position_encodings.encodings = positions("src")
    spec.decoder.embeddings.weight = tgt_embed
    spec.decoder.position_encodings.encodings = positions("tgt")
    spec.decoder.projection.weight = output
    if pre_norm:  # the final LayerNorm of each stack
        set_norm(spec.encoder.layer_norm, w, "encoder_norm")
        set_norm(spec.decoder.layer_norm, w, "decoder_norm")
    for i, layer in enumerate(spec.encoder.layer):
        p = f"encoder.{i}"
        set_linear(layer.self_attention.linear[0], w, f"{p}.self_attn.qkv")  # fused Q/K/V in both
        set_linear(layer.self_attention.linear[1], w, f"{p}.self_attn.out")
        set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        set_linear(layer.ffn.linear_0, w, f"{p}.ffn.w1")
        set_linear(layer.ffn.linear_1, w, f"{p}.ffn.w2")
        set_norm(layer.ffn.layer_norm, w, f"{p}.norm2")
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder.{i}"
        set_linear(layer.self_attention.linear[0], w, f"{p}.self_attn.qkv")
        set_linear(layer.self_attention.linear[1], w, f"{p}.self_attn.out")
        set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        set_linear(layer.attention.linear[0], w, f"{p}.cross_attn.q")
        set_linear(layer.attention.linear[1], w, f"{p}.cross_attn.kv")  # fused K/V in both
        set_linear(layer.attention.linear[2], w, f"{p}.cross_attn.out")
        set_norm(layer.attention.layer_norm, w, f"{p}.norm2")
        set_linear(layer.ffn.linear_0, w, f"{p}.ffn.w1")
        set_linear(layer.ffn.linear_1, w, f"{p}.ffn.w2")
        set_norm(layer.ffn.layer_norm, w, f"{p}.norm3")
    spec.config.layer_norm_epsilon = model["layer_norm_eps"]
    spec.config.add_source_eos = True  # nanomt's sources end with EOS; the decoder starts from BOS (<s>)
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec


def convert(checkpoint: Path, out_dir: Path) -> Path:
    """Write the CTranslate2 model directory for a nanomt checkpoint (float32 weights)."""
    config_path, tokenizer_dir = run_files(checkpoint)
    model = yaml.safe_load(config_path.read_text())["model"]
    weights = load_file(str(checkpoint / "model.safetensors"))
    src_sp, tgt_sp = sentencepiece_processors(tokenizer_dir)
    vocab = lambda sp: [sp.id_to_piece(i) for i in range(sp.get_piece_size())]  # noqa: E731
    spec = build_spec(model, weights, vocab(src_sp), vocab(tgt_sp))
    spec.validate()
    spec.optimize(quantization=None)  # int8 is chosen at load time (compute_type), from these weights
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    return out_dir


def time_translation(
    ct2_dir: Path, checkpoint: Path, src_file: Path, compute_type: str, beam: int, length_penalty: float, reps: int
) -> dict:
    """Median wall time of translating the whole file (SentencePiece in and out included), after one warm-up."""
    config_path, tokenizer_dir = run_files(checkpoint)
    src_sp, tgt_sp = sentencepiece_processors(tokenizer_dir)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type, intra_threads=2)
    lines = src_file.read_text(encoding="utf-8").splitlines()
    max_positions = yaml.safe_load(config_path.read_text())["model"]["max_positions"]

    def run() -> list[str]:
        # As nanomt's Translator: sources cut to max_positions - 1 pieces (+ EOS), outputs within the positions.
        pieces = [p[: max_positions - 1] for p in src_sp.encode(lines, out_type=str)]
        results = translator.translate_batch(
            pieces,
            beam_size=beam,
            length_penalty=length_penalty,
            max_decoding_length=max_positions,
            max_batch_size=6000,
            batch_type="tokens",
        )
        return tgt_sp.decode([r.hypotheses[0] for r in results])

    run()  # warm-up
    samples, outputs = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        outputs = run()
        samples.append(time.perf_counter() - t0)
    median = statistics.median(samples)
    return {
        "compute_type": compute_type,
        "beam": beam,
        "length_penalty": length_penalty,
        "median_s": median,
        "min_s": min(samples),
        "max_s": max(samples),
        "samples_s": samples,
        "n_sentences": len(lines),
        "sentences_per_s": len(lines) / median,
        "translations": outputs,
    }


def main() -> None:
    """Convert, then optionally translate and time; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--src", type=Path, help="also translate this file and time it")
    p.add_argument("--compute-types", default="float32,int8")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length-penalty", type=float, default=1.0, help="CTranslate2's: score / length^alpha")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    t0 = time.perf_counter()
    convert(args.checkpoint, args.out_dir)
    report = {"ct2_dir": str(args.out_dir), "convert_s": time.perf_counter() - t0, "version": ctranslate2.__version__}
    if args.src:
        report["runs"] = [
            time_translation(
                args.out_dir, args.checkpoint, args.src, compute_type, args.beam, args.length_penalty, args.reps
            )
            for compute_type in args.compute_types.split(",")
        ]
    print(json.dumps(report) if args.json else f"converted to {args.out_dir}")


if __name__ == "__main__":
    main()
