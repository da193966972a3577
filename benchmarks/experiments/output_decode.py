"""Decoding a restrict_output model: the whole output projection masked with -inf, against the pruned copy.

    python -m benchmarks.experiments.output_decode --checkpoint runs/multi30k_de_en/final
                                                                    # -> benchmarks/results/output_decode.json

A model trained with `model.restrict_output: true` (the Multi30k recipe) keeps the whole tied 8k x D output matrix,
which training needs for the embedding's gradient. `Translator` decodes through `model.prune_output`, a copy whose
projection holds the kept rows only (4,272 of 8,000 in the recipe). Here one checkpoint translates val.de both
ways: the Translator as it is ("pruned") and the same Translator given back the loaded model ("masked": the whole
projection, then -inf at the dropped ids, as before), in float32 and int8, with the recipe's beam; --rounds rounds,
the two in alternating order, each translating every sentence in batches (`translate`), then the first --single
sentences one at a time (a server's case), alternating sentence by sentence. Reported: seconds per round, the median
sentences/s, the speedups (one sentence: of the rounds' medians, and the median of the per-sentence ratios), and
how many translations differ (the pruned matmul may round differently, so a near-tie may flip).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import sacrebleu
import torch

from nanomt.core.checkpoint import load_checkpoint
from nanomt.decoding.quantize import quantize_int8
from nanomt.decoding.translate import Translator
from scripts.common import DEFAULT_DATA, DEFAULT_RUN, RESULTS, machine, shown, write_results


def translators(checkpoint: Path, int8: bool) -> dict[str, Translator]:
    """The Translator as it decodes ("pruned") and one given the loaded model unpruned ("masked")."""
    model, cfg, tokenizer = load_checkpoint(checkpoint)
    if model.output_mask is None:
        raise SystemExit(f"{checkpoint} was not trained with model.restrict_output: nothing to prune")
    pruned = Translator(model, tokenizer, cfg, int8=int8)
    masked = Translator(model, tokenizer, cfg, int8=int8)
    masked.model = quantize_int8(model.eval()) if int8 else model.eval()
    assert pruned.model.output.out_features < masked.model.output.out_features
    return {"masked": masked, "pruned": pruned}


def timed(fn) -> tuple[float, list[str]]:
    """Seconds one call of fn takes, and what it returned."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def compare(ts: dict[str, Translator], lines: list[str], refs: list[str], beam: int, rounds: int, single: int) -> dict:
    """Batch and one-at-a-time timings of the two Translators, alternating which goes first."""
    seconds = {name: [] for name in ts}
    single_seconds = {name: [] for name in ts}
    outputs = {}
    ratios = []  # masked / pruned, per sentence translated alone
    for r in range(rounds):
        for name in ts if r % 2 == 0 else reversed(ts):
            s, outputs[name] = timed(lambda t=ts[name]: t.translate(lines, beam_size=beam))
            seconds[name].append(round(s, 2))
        # One sentence takes ~50 ms, so the host's drift over a 5 s stretch outweighs the difference measured:
        # the two alternate sentence by sentence, the order swapped every sentence.
        total = dict.fromkeys(ts, 0.0)
        for i, line in enumerate(lines[:single]):
            took = {}
            for name in ts if (i + r) % 2 == 0 else reversed(ts):
                took[name], _ = timed(lambda t=ts[name], one=[line]: t.translate(one, beam_size=beam))
                total[name] += took[name]
            ratios.append(took["masked"] / took["pruned"])
        for name in ts:
            single_seconds[name].append(round(total[name], 3))
            print(name, r, seconds[name][-1], single_seconds[name][-1], flush=True)
    sent_per_s = {name: round(len(lines) / statistics.median(v), 1) for name, v in seconds.items()}
    single_ms = {name: round(1000 * statistics.median(v) / single, 1) for name, v in single_seconds.items()}
    return {
        "seconds_per_round": seconds,
        "sentences_per_s_median": sent_per_s,
        "speedup_batch": round(sent_per_s["pruned"] / sent_per_s["masked"], 3),
        "one_sentence_seconds_per_round": single_seconds,
        "one_sentence_ms_median": single_ms,
        "speedup_one_sentence": round(single_ms["masked"] / single_ms["pruned"], 3),
        "speedup_one_sentence_median_of_pairs": round(statistics.median(ratios), 3),
        "differing_translations": sum(a != b for a, b in zip(outputs["masked"], outputs["pruned"], strict=True)),
        "bleu": {name: round(sacrebleu.corpus_bleu(out, [refs]).score, 2) for name, out in outputs.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN / "final")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--single", type=int, default=100, help="sentences translated one at a time per round")
    p.add_argument("--out", type=Path, default=RESULTS / "output_decode.json")
    args = p.parse_args()
    torch.set_num_threads(2)
    lines = (args.data / "val.de").read_text(encoding="utf-8").splitlines()
    refs = (args.data / "val.en").read_text(encoding="utf-8").splitlines()
    result = {
        "checkpoint": shown(args.checkpoint),
        "data": shown(args.data),
        "sentences": len(lines),
        "beam": args.beam,
    }
    with torch.inference_mode():
        for precision in ("float32", "int8"):
            ts = translators(args.checkpoint, int8=precision == "int8")
            result["kept_ids"], result["vocab"] = (
                ts["pruned"].model.output.out_features,
                ts["masked"].model.output.out_features,
            )
            result[precision] = compare(ts, lines, refs, args.beam, args.rounds, args.single)
            print(precision, json.dumps(result[precision]), flush=True)
    result["machine"] = machine()
    write_results(args.out, result)


if __name__ == "__main__":
    main()
