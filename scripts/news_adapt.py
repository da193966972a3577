"""Adapt the Multi30k caption model to news: fine-tuning, fine-tuning on a mix, and training from scratch, compared.

    python -m scripts.news_adapt --data ../shared/data                    # ~105 minutes on a 2-core CPU
    python -m scripts.news_adapt --data ../shared/data --base runs/multi30k_de_en --minutes 10
    python -m scripts.news_adapt --data ../shared/data --base-minutes 40  # a shorter base training

--data holds multi30k/ (train, val, test2016 .de/.en) and news/ (the WMT news test sets 2008-2012). The news
training pairs are news-test2008, newssyscomb2009 and newstest2009-2011 (10,570 pairs, written once under
--work); newstest2012 validates (the greedy BLEU of its first 500 pairs picks each run's kept weights) and is
reported whole. Four models, each evaluated on newstest2012 and Multi30k test2016 by `nanomt evaluate` at beam 5:

- base: --base, the caption model; without --base, `nanomt train configs/multi30k_de_en.yaml` (the Multi30k
  recipe's 60-minute training, without its averaging and tuning) makes it in runs/multi30k_de_en;
- finetune_news: configs/news_adapt_de_en.yaml with --init-from base, on the news pairs;
- finetune_mix: the same on news and Multi30k's training pairs mixed 1:1 (data.train as a list of corpora), which
  keeps some captions in every epoch against forgetting;
- scratch_news: configs/multi30k_de_en.yaml (its architecture, a tokenizer of its own) on the news pairs alone.
The three trained models get the same budget (--minutes each, the linear lr decaying to 0 with the clock).
Writes scripts/results/news_adapt.json (--out) with the commit it ran; paths in it are relative.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from scripts.common import (
    DEFAULT_CONFIG,
    DEFAULT_RUN,
    NANOMT,
    RECIPE_RESULTS,
    ROOT,
    data_overrides,
    machine,
    run_training,
    shown,
    training_summary,
)

NEWS_TRAIN = ("news-test2008", "newssyscomb2009", "newstest2009", "newstest2010", "newstest2011")
NEWS_TEST = "newstest2012"
BASE_CONFIG = DEFAULT_CONFIG  # the Multi30k recipe's
ADAPT_CONFIG = ROOT / "configs" / "news_adapt_de_en.yaml"


def news_training_files(news: Path, work: Path) -> tuple[Path, Path]:
    """The news training sets end to end, one file a language (written once)."""
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    files = tuple(out / f"news_train.{lang}" for lang in ("de", "en"))
    for lang, path in zip(("de", "en"), files):
        if not path.is_file():
            text = "".join((news / f"{name}.{lang}").read_text(encoding="utf-8") for name in NEWS_TRAIN)
            path.write_text(text, encoding="utf-8")
    return files


def split_sets(train: tuple[Path, Path] | list[dict], news: Path) -> list[str]:
    """--set arguments: the training data (files, or a list of weighted corpora) and newstest2012 as validation."""
    if isinstance(train, list):
        sets = ["data.train=" + json.dumps(train)]
    else:
        sets = [f"data.train.src={train[0]}", f"data.train.tgt={train[1]}"]
    return sets + [f"data.valid.src={news / NEWS_TEST}.de", f"data.valid.tgt={news / NEWS_TEST}.en"]


def evaluate(run: Path, src: Path, ref: Path) -> dict:
    """`nanomt evaluate --json` at beam 5: BLEU, chrF and their signatures."""
    cmd = [*NANOMT, "evaluate", str(run), "--src", str(src), "--ref", str(ref), "--beam", "5", "--json"]
    print("$", " ".join(cmd), flush=True)
    report = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    keep = ("bleu", "chrf", "bleu_signature", "chrf_signature", "sentences", "sentences_per_s")
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in report.items() if k in keep}


def scores(run: Path, data: Path) -> dict:
    news, multi30k = data / "news", data / "multi30k"
    return {
        NEWS_TEST: evaluate(run, news / f"{NEWS_TEST}.de", news / f"{NEWS_TEST}.en"),
        "test2016": evaluate(run, multi30k / "test2016.de", multi30k / "test2016.en"),
    }


def trained(name: str, config: Path, run: Path, sets: list[str], log: Path) -> dict:
    """Train (or resume) one run with `nanomt train`, its output to `log`; its steps, time and validation curve."""
    t0 = time.time()
    run_training(config, run, sets, log=log)
    return {"config": shown(config), "run": shown(run), **training_summary(run), "wall_s": round(time.time() - t0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a directory with multi30k/ and news/")
    p.add_argument("--base", type=Path, default=None, help="the caption model (default: train it)")
    p.add_argument("--minutes", type=float, default=10.0, help="training budget of each of the three runs")
    p.add_argument("--base-minutes", type=float, default=None, help="the base's budget (default: its config's)")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "news_adapt")
    p.add_argument("--out", type=Path, default=RECIPE_RESULTS / "news_adapt.json")
    args = p.parse_args()
    data, news, multi30k = args.data.resolve(), args.data.resolve() / "news", args.data.resolve() / "multi30k"
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = args.base
    base_run = None
    if base is None:
        base = DEFAULT_RUN
        sets = data_overrides(multi30k) + ([f"train.max_minutes={args.base_minutes}"] if args.base_minutes else [])
        base_run = trained("base", BASE_CONFIG, base, sets, work / "base.log")
    news_train = news_training_files(news, work)
    budget = [f"train.max_minutes={args.minutes}", "train.progress=false"]
    mix = [
        {"src": str(news_train[0]), "tgt": str(news_train[1]), "weight": 1.0},
        {"src": str(multi30k / "train.de"), "tgt": str(multi30k / "train.en"), "weight": 1.0},
    ]
    runs = {
        "finetune_news": (ADAPT_CONFIG, split_sets(news_train, news) + [f"train.init_from={base}"]),
        "finetune_mix": (ADAPT_CONFIG, split_sets(mix, news) + [f"train.init_from={base}"]),
        "scratch_news": (BASE_CONFIG, split_sets(news_train, news)),
    }
    training = {
        name: trained(name, cfg, work / name, sets + budget, work / f"{name}.log") for name, (cfg, sets) in runs.items()
    }
    models = {"base": base, **{name: work / name for name in runs}}
    rows = {name: scores(run, data) for name, run in models.items()}
    forgetting = {name: round(rows[name]["test2016"]["bleu"] - rows["base"]["test2016"]["bleu"], 2) for name in runs}
    results = {
        "what": "the Multi30k caption model adapted to news (WMT news test sets 2008-2011), against training on news "
        "from scratch with the same budget: sacreBLEU and chrF at beam 5 on newstest2012 and Multi30k test2016",
        "data": {
            "news_train": list(NEWS_TRAIN),
            "news_train_pairs": sum(1 for _ in news_train[0].open(encoding="utf-8")),
            "valid": f"{NEWS_TEST} (greedy BLEU of its first 500 pairs picks the kept weights)",
            "mix": "news and Multi30k train, weights 1 and 1",
        },
        "budget_minutes_each": args.minutes,
        "base": {"run": shown(base), "training": base_run},
        "training": training,
        "scores": rows,
        "test2016_bleu_change_from_base": forgetting,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({name: {k: v["bleu"] for k, v in r.items()} for name, r in rows.items()}, indent=2))


if __name__ == "__main__":
    main()
