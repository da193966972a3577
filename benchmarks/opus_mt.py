"""An opus-mt-shaped Marian model in nanomt, in transformers and in CTranslate2: logits, translations, sentences/s.

    python -m benchmarks.opus_mt                          # -> benchmarks/results/opus_mt.json (~15 minutes)
    python -m benchmarks.opus_mt --sentences 16 --reps 1 --out runs/opus_mt_smoke.json

The model: a MarianMTModel of Helsinki-NLP/opus-mt-de-en's shape (d_model 512, 6+6 post-norm layers, 8 heads,
d_ff 2048, swish, 58,101 ids shared by both sides and tied to the output, final_logits_bias, sinusoidal positions),
with random weights (nothing is downloaded): transformers' N(0, 0.02) initialization, and a logit bias of -1e4
on EOS. A random model does not end its sentences as a trained one does (some at once, some never), and
generate decodes a batch until its last sentence ends: so no sentence ends, and every engine generates exactly 24
tokens a sentence, about a Multi30k translation's length. The same work for each engine, and the same tokens.
Its tokenizer: two SentencePiece models trained on the Multi30k training text (--data),
with a vocab.json that lists their pieces and fills the table to 58,101 ids, as opus-mt's shared table is laid
out (</s> 0, <unk> 1, ..., <pad> last). `save_pretrained` writes it (under --work); `nanomt import marian` makes it a
run directory and `nanomt export ct2` a CTranslate2 model, the commands a user runs.

Measured, on the first --sentences lines of test2016.de, end to end (tokenize, batch, decode, detokenize):
- sentences/s, greedy and beam 4, float32 and int8, for `Translator.translate` (what `nanomt translate` runs; int8:
  `--int8`), transformers' `generate` (MarianTokenizer, batches of --hf-batch sentences sorted by length; int8:
  nanomt's quantize_int8 on its Linear layers, the layers of nanomt's --int8) and CTranslate2 (`export ct2`,
  decoded with nanomt's rules; int8: compute_type int8). nanomt and CTranslate2 each run in a worker process of
  their own, as in `benchmarks.speed`'s translate harness (CTranslate2's never imports torch, and decodes exactly
  nanomt's batches), transformers in this one; all are timed round-robin, one warm-up round and --reps kept, median
  and every sample.
- the largest difference between nanomt's and transformers' logits on a padded batch (EOS's, biased by -1e4,
  relative);
- per engine and setting, how many translations are identical to transformers' float32 ones, nanomt's lines that
  differ from CTranslate2's, and int8 against float32 within each engine (int8 rounding makes small
  differences expected).
Decoding: the model's generation settings (beam 4, length penalty 1.0 of Hugging Face's form, early stopping,
max_length 25: 24 new tokens) for all three; greedy is beam 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (
    NUM_THREADS,
    OPUS_MT,
    Contender,
    changed_by_batch_budget,
    engine_contenders,
    engine_outputs,
    engine_processes,
    harness_info,
    limit_threads,
    marian_config,
    round_robin,
    same_batches,
    timed,
)
from scripts.common import DEFAULT_DATA, RESULTS, ROOT, machine, shown, write_results

limit_threads()  # before torch starts

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from nanomt.decoding.quantize import quantize_int8  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.interop.marian import import_marian  # noqa: E402

VOCAB = 58101  # Helsinki-NLP/opus-mt-de-en's shared id table
SPM_VOCAB = 6000  # per side, trained on --data (opus-mt's are 32k each, over far more text)
NEW_TOKENS = 24  # every sentence's translation: about a Multi30k sentence's, in 6k-piece SentencePiece tokens
MAX_LENGTH = NEW_TOKENS + 1  # generation_config.max_length counts the decoder's start token
EOS_BIAS = -1e4  # final_logits_bias of EOS: no engine ends a sentence before NEW_TOKENS
BEAM = 4
MODES = {"greedy": 1, "beam4": BEAM}


def opus_mt_config(pad: int) -> transformers.MarianConfig:
    """opus-mt-de-en's architecture."""
    shape = dict(vocab=VOCAB, d_model=512, layers=6, heads=8, d_ff=2048)
    return marian_config(**shape, **OPUS_MT, max_position_embeddings=512, pad_token_id=pad, decoder_start_token_id=pad)


def id_table(models: list[bytes]) -> dict[str, int]:
    """vocab.json: </s> 0, <unk> 1, both models' pieces, filler entries up to VOCAB - 1, <pad> last."""
    table = {"</s>": 0, "<unk>": 1}
    for model in models:
        sp = spm.SentencePieceProcessor(model_proto=model)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                table.setdefault(sp.id_to_piece(i), len(table))
    for i in range(VOCAB - 1 - len(table)):  # ids the text never produces, as most of a 58k table is for any one text
        table[f"<unused{i}>"] = len(table)
    table["<pad>"] = len(table)
    return table


def build_marian(out: Path, data: Path, seed: int) -> None:
    """Write the random opus-mt-shaped model and its tokenizer to `out`, as save_pretrained writes them."""
    out.mkdir(parents=True, exist_ok=True)
    models = []
    for lang, name in (("de", "source.spm"), ("en", "target.spm")):
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            input=str(data / f"train.{lang}"), model_writer=buf, vocab_size=SPM_VOCAB, minloglevel=2
        )
        (out / name).write_bytes(buf.getvalue())
        models.append(buf.getvalue())
    table = id_table(models)
    (out / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"), vocab=str(out / "vocab.json")
    )
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(opus_mt_config(table["<pad>"])).eval()
    with torch.no_grad():  # random weights never end a sentence as a trained model does: none of them does
        model.final_logits_bias[0, 0] = EOS_BIAS
    gen = model.generation_config
    gen.num_beams, gen.max_length, gen.early_stopping, gen.length_penalty = BEAM, MAX_LENGTH, True, 1.0
    gen.bad_words_ids, gen.forced_eos_token_id = [[table["<pad>"]]], None
    model.save_pretrained(out)


def largest_logit_difference(hf, tok, translator: Translator, sources: list[str]) -> dict:
    """The largest difference of nanomt's and transformers' teacher-forced logits on a padded batch of 16."""
    ours, m = translator.model, translator.cfg.model
    batch = tok(sources[:16], text_target=sources[16:32], return_tensors="pt", padding=True)
    decoder_in = transformers.models.marian.modeling_marian.shift_tokens_right(batch.labels, m.pad_id, m.bos_id)
    with torch.no_grad():
        ref = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=decoder_in).logits
        got = ours(batch.input_ids, decoder_in)
    # EOS's logit is biased by -1e4 (EOS_BIAS), where float32 keeps ~1e-3: compared on its own, relative.
    eos = m.eos_id
    others = torch.ones(got.size(-1), dtype=torch.bool)
    others[eos] = False
    return {
        "max_abs": float((got - ref)[..., others].abs().max()),
        "max_abs_logit": float(ref[..., others].abs().max()),
        "eos_max_relative": float(((got - ref)[..., eos] / ref[..., eos]).abs().max()),
    }


def hf_translate(model, tokenizer, lines: list[str], beam: int, batch_size: int) -> list[str]:
    """transformers' generate over length-sorted batches; translations in the input order."""
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    out = [""] * len(lines)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = tokenizer([lines[i] for i in idx], return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(**batch, num_beams=beam, max_length=MAX_LENGTH)
        for i, text in zip(idx, tokenizer.batch_decode(ids, skip_special_tokens=True)):
            out[i] = text
    return out


def hf_contenders(args: argparse.Namespace, hf, tokenizer, lines: list[str], outputs: dict) -> list[Contender]:
    """transformers' generate in this process, float32 and int8, greedy and beam 4 (outputs kept in `outputs`)."""
    models = {"hf_fp32": hf, "hf_int8": quantize_int8(hf)}  # the same int8 Linear layers as nanomt's --int8
    contenders = []
    for mode, beam in MODES.items():
        for name, m in models.items():
            key = f"{name}/{mode}"
            fn = lambda m=m, b=beam, k=key: outputs.__setitem__(  # noqa: E731
                k, hf_translate(m, tokenizer, lines, b, args.hf_batch)
            )
            contenders.append(Contender(key, timed(fn)))
    return contenders


def time_everything(args: argparse.Namespace, hf, tokenizer, run: Path, lines: list[str]) -> tuple[dict, dict, dict]:
    """Round-robin: nanomt and CTranslate2 in their worker processes (the same batches), transformers here."""
    outputs: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="nanomt-opus-") as tmp, contextlib.ExitStack() as stack:
        src_file = Path(tmp) / "src.de"
        src_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        engines = engine_processes(str(run), src_file, Path(tmp))
        for proc in engines.values():
            stack.callback(proc.close)
        if "ct2" not in engines:
            sys.exit("opus_mt.py: error: this benchmark needs ctranslate2")
        engines["ct2"].ask("plan", batches=engines["nanomt"].info["plan"])
        contenders = engine_contenders(engines, MODES, "plan") + hf_contenders(args, hf, tokenizer, lines, outputs)
        print(f"== {len(lines)} sentences, greedy and beam {BEAM}, {args.reps} rounds after 1 warm-up", flush=True)
        timings = round_robin(contenders, 1, args.reps)
        done = {k for k, t in timings.items() if "median_s" in t}
        outputs.update(engine_outputs(engines, MODES, "plan", done))
        changed = changed_by_batch_budget(engines["ct2"], MODES, outputs)
        harness = harness_info(engines, MODES, "plan", 1, args.reps)
    rename = lambda key: key.replace("_translate", "")  # noqa: E731  (this file's row names: nanomt_fp32/greedy)
    harness["ct2_lines_changed_by_batch_budget"] = {rename(k): n for k, n in changed.items()}
    harness["same_batches"] = same_batches(timings, "plan")
    return {rename(k): t for k, t in timings.items()}, {rename(k): o for k, o in outputs.items()}, harness


def result_rows(timings: dict, outputs: dict, n: int) -> dict:
    """Per engine and mode: sentences/s, agreement with transformers' float32 and int8 with its own float32, ratios."""
    rows = {}
    for key, t in timings.items():
        engine, mode = key.split("/")
        precision = engine.split("_")[1]
        reference = outputs[f"hf_fp32/{mode}"]
        row = {
            "sentences_per_s": round(n / t["median_s"], 2),
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in t.items() if k != "samples_s"},
            "samples_s": [round(s, 3) for s in t["samples_s"]],
            "identical_to_hf_fp32": sum(a == b for a, b in zip(outputs[key], reference)),
            "mean_output_words": round(sum(len(x.split()) for x in outputs[key]) / n, 2),
        }
        if precision == "int8":
            own = outputs[f"{engine.replace('int8', 'fp32')}/{mode}"]
            row["identical_to_own_fp32"] = sum(a == b for a, b in zip(outputs[key], own))
        if engine.startswith("nanomt"):
            ct2 = outputs[f"ct2_{precision}/{mode}"]
            row["differing_lines_from_ct2"] = sum(a != b for a, b in zip(outputs[key], ct2))
        rows[key] = row
    for key, row in rows.items():
        engine, mode = key.split("/")
        precision = engine.split("_")[1]
        row["x_hf"] = round(row["sentences_per_s"] / rows[f"hf_{precision}/{mode}"]["sentences_per_s"], 2)
        row["x_ct2"] = round(row["sentences_per_s"] / rows[f"ct2_{precision}/{mode}"]["sentences_per_s"], 2)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k: train.{de,en}, test2016.de")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "opus_mt_random", help="model dirs (reused)")
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--reps", type=int, default=5, help="timed rounds after one warm-up round (default 5)")
    p.add_argument("--hf-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "opus_mt.json")
    args = p.parse_args()
    torch.set_num_threads(NUM_THREADS)
    lines = (args.data / "test2016.de").read_text(encoding="utf-8").splitlines()[: args.sentences]
    hf_dir, run = args.work / "hf", args.work / "run"
    t0 = time.perf_counter()
    if not (hf_dir / "config.json").is_file():
        print(f"building the random opus-mt-shaped model in {hf_dir}", flush=True)
        build_marian(hf_dir, args.data, args.seed)
    import_marian(hf_dir, run)  # the run directory is rebuilt each time: the import is part of what is tested
    build_s = time.perf_counter() - t0
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    val = (args.data / "val.de").read_text(encoding="utf-8").splitlines()
    tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)
    logits = largest_logit_difference(hf, tokenizer, Translator.from_checkpoint(run), val)
    print(f"largest logit difference: {logits['max_abs']:.2e}", flush=True)
    timings, outputs, harness = time_everything(args, hf, tokenizer, run, lines)
    rows = result_rows(timings, outputs, len(lines))
    results = {
        "what": "an opus-mt-de-en-shaped Marian model with random weights, imported into nanomt and exported to "
        "CTranslate2: sentences/s end to end on the first sentences of test2016.de, and agreement",
        "command": "python -m benchmarks.opus_mt " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "src": shown(args.data / "test2016.de"),
        "n_sentences": len(lines),
        "model": {
            "shape": "d_model 512, 6+6 post-norm layers, 8 heads, d_ff 2048, swish, shared tied vocabulary",
            "vocab": VOCAB,
            "parameters": sum(p.numel() for p in hf.model.parameters()),
            "eos_logit_bias": EOS_BIAS,
            "build_and_import_s": round(build_s, 1),
        },
        "decoding": {"beam": BEAM, "length_penalty": 1.0, "early_stopping": True, "max_length": MAX_LENGTH},
        "hf_batch_sentences": args.hf_batch,
        "harness": harness,
        "largest_logit_difference": logits,
        "rows": rows,
    }
    write_results(args.out, results, indent=1)
    for key, row in rows.items():
        print(f"{key:20s} {row['sentences_per_s']:8.2f} sent/s  x_hf {row['x_hf']:.2f}  x_ct2 {row['x_ct2']:.2f}")


if __name__ == "__main__":
    main()
