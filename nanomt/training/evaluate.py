"""Evaluate a checkpoint on a test set: sacreBLEU BLEU and chrF with their signatures, and speed."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from nanomt.core.decoding import Decoding
from nanomt.decoding.translate import Translator
from nanomt.training.data import CorpusError, read_lines
from nanomt.training.metrics import score


def evaluate(
    translator: Translator,
    src_path: str | Path,
    ref_path: str | Path,
    decoding: Decoding | None = None,
    save_hyp: str | Path | None = None,
    progress: bool = False,
    max_tokens: int | None = None,
    **settings,
) -> dict:
    """Translate `src_path` with `decoding` (default: the checkpoint's) and `settings` changed (e.g. beam_size=4),
    score against `ref_path`; returns a JSON-ready report."""
    srcs, refs = read_lines(src_path), read_lines(ref_path)
    if len(srcs) != len(refs):
        raise CorpusError(f"{src_path} has {len(srcs)} lines but {ref_path} has {len(refs)}")
    decoding = (decoding or translator.default_decoding).replace(**settings)
    start = time.perf_counter()
    hyps = translator.translate_hypotheses(srcs, decoding, max_tokens=max_tokens, progress=progress)
    seconds = time.perf_counter() - start
    texts = translator.tokenizer.decode_tgt([h[0].tokens for h in hyps])
    n_tokens = sum(len(h[0].tokens) + 1 for h in hyps)  # + EOS: every generated token counts
    if save_hyp:
        Path(save_hyp).write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    report = asdict(score(texts, refs))
    report.update(
        seconds=round(seconds, 3),
        sentences_per_s=round(len(srcs) / max(seconds, 1e-9), 2),
        tokens_per_s=round(n_tokens / max(seconds, 1e-9), 1),
        beam_size=decoding.beam_size,
    )
    return report
