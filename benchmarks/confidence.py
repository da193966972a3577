"""Which confidence to ship: predictors of sentence chrF fitted on a validation set, compared in and out of domain.

    python -m benchmarks.confidence RUN --data ../shared/data                 # Multi30k val/test2016 + news sample
    python -m benchmarks.confidence RUN --data ../shared/data --news-lines 50 --smoke   # a quick run

Every set is translated once with the checkpoint's decoding (its beam) through Translator.translate_confident, whose
read-back features every predictor shares; each predictor is fitted on the validation set only (Multi30k val) and
scored on test2016 (in domain) and on the first --news-lines lines of each WMT news set (out of domain): Pearson and
Spearman correlation with each sentence's chrF, and the mean absolute error of the estimate (chrF / 100). The
baseline is a line on the mean token log-probability fitted on the same validation set. Also: the n-best list's
agreement as a feature (a second decoding, n-best = beam), the shares of sentences a min_confidence flags, and the
time confidence adds to translating (greedy and beam, one sentence and test2016 whole), each against the same
translations without it, in this run. Writes benchmarks/results/confidence.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from nanomt.decoding import calibration as calib
from nanomt.decoding.quality import FEATURES
from nanomt.decoding.translate import Translator
from nanomt.training.data import read_lines
from scripts.common import RESULTS, machine, shown

NEWS = ("news-test2008", "newssyscomb2009", "newstest2009", "newstest2010", "newstest2011", "newstest2012")
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)


def translated(translator: Translator, srcs: list[str], refs: list[str], beam: int) -> dict:
    """A set's features, raw scores, n-best agreement and chrF (sentences with an empty side left out)."""
    keep = [i for i, (s, r) in enumerate(zip(srcs, refs)) if s.strip() and r.strip()]
    srcs, refs = [srcs[i] for i in keep], [refs[i] for i in keep]
    found = translator.translate_confident(srcs, beam_size=beam)
    hyps = [c.translation for c in found]
    chrf = calib.sentence_chrf(hyps, refs)
    rows = [dict(c.features) for c in found]
    if beam > 1:  # the n-best list's agreement: mean chrF of the other hypotheses against the best
        lists = translator.translate_n_best(srcs, n_best=beam, beam_size=beam)
        for row, hyp, alts in zip(rows, hyps, lists):
            others = [t for t, _ in alts[1:]] or [hyp]
            row["n_best_agreement"] = float(np.mean(calib.sentence_chrf(others, [hyp] * len(others))))
    return {"rows": rows, "chrf": np.array(chrf), "sentences": len(srcs)}


def isotonic(x: np.ndarray, y: np.ndarray):
    """Pool-adjacent-violators on one feature: a non-decreasing step function, interpolated between the blocks."""
    order = np.argsort(x)
    xs, ys = x[order], y[order]
    blocks = [[ys[0], 1, xs[0], xs[0]]]  # mean, count, first x, last x
    for xv, yv in zip(xs[1:], ys[1:]):
        blocks.append([yv, 1, xv, xv])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2, a2, b2 = blocks.pop()
            m1, n1, a1, _ = blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2, a1, b2])
    knots = np.array([(b[2] + b[3]) / 2 for b in blocks])
    values = np.array([b[0] for b in blocks])
    return lambda v: np.interp(v, knots, values)


def mlp(x: np.ndarray, y: np.ndarray, hidden: int = 8, seed: int = 0):
    """A one-hidden-layer tanh network with a sigmoid output, least squares with weight decay (L-BFGS)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
    net = net.double()
    xt, yt = torch.tensor(x), torch.tensor(y)
    opt = torch.optim.LBFGS(net.parameters(), max_iter=500, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = ((torch.sigmoid(net(xt).squeeze(1)) - yt) ** 2).mean()
        value = value + 1e-4 * sum((p**2).sum() for p in net.parameters())
        value.backward()
        return value

    opt.step(loss)
    return lambda v: torch.sigmoid(net(torch.tensor(v)).squeeze(1)).detach().numpy()


def matrix(rows: list[dict], features: tuple[str, ...]) -> np.ndarray:
    return np.array([[r[f] for f in features] for r in rows], dtype=np.float64)


def candidates(fit_set: dict) -> dict:
    """Each predictor fitted on the validation set: name -> rows -> estimates."""
    rows, y = fit_set["rows"], fit_set["chrf"]
    out = {}
    line = calib.fit(rows, y, kind="line", features=("mean_log_prob",))
    out["baseline: line on mean log-prob"] = line.predict
    mean_lp = lambda rs: np.array([r["mean_log_prob"] for r in rs])  # noqa: E731
    iso = isotonic(mean_lp(rows), y)
    out["isotonic on mean log-prob"] = lambda rs: iso(mean_lp(rs))
    out["line on all features"] = calib.fit(rows, y, kind="line").predict
    out["logistic on all features (shipped)"] = calib.fit(rows, y, kind="logistic").predict
    for dropped in FEATURES:
        kept = tuple(f for f in FEATURES if f != dropped)
        out[f"logistic without {dropped}"] = calib.fit(rows, y, kind="logistic", features=kept).predict
    if "n_best_agreement" in rows[0]:
        with_nbest = (*FEATURES, "n_best_agreement")
        n_mean, n_scale = matrix(rows, with_nbest).mean(0), matrix(rows, with_nbest).std(0) + 1e-9
        w, b = calib.fit_logistic((matrix(rows, with_nbest) - n_mean) / n_scale, y)
        out["logistic on all features + n-best agreement"] = lambda rs: (
            1 / (1 + np.exp(-((matrix(rs, with_nbest) - n_mean) / n_scale @ w + b)))
        )
    mean, scale = matrix(rows, FEATURES).mean(0), matrix(rows, FEATURES).std(0) + 1e-9
    net = mlp((matrix(rows, FEATURES) - mean) / scale, y)
    out["tiny network (6-8-1) on all features"] = lambda rs: net((matrix(rs, FEATURES) - mean) / scale)
    return out


def alternated(a, b, repeat: int) -> tuple[float, float]:
    """The median wall times of `a()` and `b()`, run one after the other `repeat` times."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in ((a, times[0]), (b, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def costs(translator: Translator, srcs: list[str], repeat: int) -> list[dict]:
    """The time translate_confident takes against translate, same sentences and decoding, alternated."""
    out = []
    for beam in (1, 5):
        for name, texts, n in (("one sentence", srcs[:1], 15 * repeat), ("test2016 whole", srcs, repeat)):
            plain, confident = alternated(
                lambda t=texts, b=beam: translator.translate(t, beam_size=b),
                lambda t=texts, b=beam: translator.translate_confident(t, beam_size=b),
                n,
            )
            out.append({
                "beam_size": beam, "input": name, "runs": n, "translate_s": round(plain, 4),
                "with_confidence_s": round(confident, 4), "added": f"{100 * (confident / plain - 1):+.1f}%",
            })  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="the checkpoint (the Multi30k recipe's de->en model)")
    p.add_argument("--data", type=Path, required=True, help="the folder holding multi30k/ and news/")
    p.add_argument("--news-lines", type=int, default=300, help="lines from the start of each news set")
    p.add_argument("--smoke", action="store_true", help="100 lines of each Multi30k set, no timing repeats")
    p.add_argument(
        "--time-only", action="store_true", help="only the time confidence adds, into the results file already there"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "confidence.json")
    args = p.parse_args()
    translator = Translator.from_checkpoint(args.run)
    beam = translator.default_decoding.beam_size
    cut = 100 if args.smoke else None
    m30k = args.data / "multi30k"
    read = lambda path: read_lines(path)[:cut]  # noqa: E731
    if args.time_only:  # timed alone, on a quiet machine
        result = json.loads(args.out.read_text(encoding="utf-8"))
        result["time"] = costs(translator, read(m30k / "test2016.de"), 3)
        result["time_machine"] = machine()
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        for row in result["time"]:
            print(row)
        return
    sets = {
        "val": translated(translator, read(m30k / "val.de"), read(m30k / "val.en"), beam),
        "test2016": translated(translator, read(m30k / "test2016.de"), read(m30k / "test2016.en"), beam),
    }
    news = args.data / "news"
    parts = [
        translated(translator, read_lines(news / f"{n}.de")[: args.news_lines],
                   read_lines(news / f"{n}.en")[: args.news_lines], beam)
        for n in NEWS
    ]  # fmt: skip
    sets["news"] = {
        "rows": [r for part in parts for r in part["rows"]],
        "chrf": np.concatenate([part["chrf"] for part in parts]),
        "sentences": sum(part["sentences"] for part in parts),
    }
    predictors = candidates(sets["val"])
    table = {
        name: {s: calib.agreement(fn(sets[s]["rows"]), sets[s]["chrf"]) for s in ("val", "test2016", "news")}
        for name, fn in predictors.items()
    }
    raw = {s: calib.agreement([r["mean_log_prob"] for r in sets[s]["rows"]], sets[s]["chrf"]) for s in sets}
    shipped = predictors["logistic on all features (shipped)"]
    flagged = {s: {str(t): round(float((shipped(sets[s]["rows"]) < t).mean()), 3) for t in THRESHOLDS} for s in sets}
    result = {
        "measures": "how well each predictor's estimate of a translation's sentence chrF / 100 follows the truth: "
        "Pearson and Spearman correlation, mean absolute error; fitted on Multi30k val, scored on test2016 and news",
        "run": shown(args.run),
        "beam_size": beam,
        "sets": {
            s: {"sentences": v["sentences"], "mean_chrf": round(float(v["chrf"].mean()), 4)} for s, v in sets.items()
        },
        "news_sets": {n: args.news_lines for n in NEWS},
        "predictors": table,
        "raw_mean_log_prob": {s: {k: v for k, v in a.items() if k != "mae"} for s, a in raw.items()},
        "min_confidence_flags": flagged,
        "time": [],  # --time-only fills it, timed alone
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for name, scores in table.items():
        cells = "  ".join(
            f"{s} r={v['pearson']:.3f} rho={v['spearman']:.3f} mae={v['mae']:.3f}" for s, v in scores.items()
        )
        print(f"{name:48s} {cells}")
    for row in result["time"]:
        print(row)


if __name__ == "__main__":
    main()
