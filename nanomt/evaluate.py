"""Evaluate a checkpoint on a test set: sacreBLEU BLEU and chrF with their signatures, and speed."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from nanomt.data import CorpusError, read_lines
from nanomt.metrics import score
from nanomt.translate import Translator


def evaluate(
    translator: Translator,
    src_path: str | Path,
    ref_path: str | Path,
    beam_size: int | None = None,
    save_hyp: str | Path | None = None,
    progress: bool = False,
    **decode_kwargs,
) -> dict:
    """Translate `src_path`, score against `ref_path`; returns a JSON-ready report."""
    srcs, refs = read_lines(src_path), read_lines(ref_path)
    if len(srcs) != len(refs):
        raise CorpusError(f"{src_path} has {len(srcs)} lines but {ref_path} has {len(refs)}")
    start = time.perf_counter()
    hyps = translator.translate_hypotheses(srcs, beam_size=beam_size, progress=progress, **decode_kwargs)
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
        beam_size=beam_size if beam_size is not None else translator.cfg.decode.beam_size,
    )
    return report
