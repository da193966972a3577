"""`nanomt translate` against CTranslate2 as a user times them: whole processes, start to exit, start-up included.

    python -m benchmarks.translate_ct2 runs/multi30k_de_en --src ../shared/data/multi30k/test2016.de
    python -m benchmarks.translate_ct2 RUN --src FILE --reps 3 --out runs/translate_ct2_quick.json   # a quick run

The CTranslate2 side is a plain script (`python -m benchmarks.translate_ct2 --ct2 DIR ...`): it imports
CTranslate2 and SentencePiece (never torch), loads the model exported by `nanomt export ct2` (float32 weights,
converted to int8 at load with --compute-type int8, as CTranslate2 users do), translates the file with the
checkpoint's decoding settings mapped onto CTranslate2's (nanomt.interop.ct2.Ct2Translator) and writes one line a
sentence: one translate_batch call over the file, CTranslate2's own batching by tokens at the checkpoint's
decode.max_tokens, as a user of CTranslate2 writes it. nanomt's side is
`nanomt translate RUN -i FILE -o OUT --beam 5` (and `--int8`). Each command runs alone,
on 2 threads, the four alternated round-robin after a warm-up round; the median wall time of --reps rounds is
reported. Start-up: the same commands on a one-line file (the time to a first translation, model load included),
and `python -c "import torch"` alongside, whose time bounds how fast anything built on torch can start. The
outputs are compared line by line (float32: the same translations expected). Writes
benchmarks/results/translate_ct2_process.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nanomt.interop import ct2
from scripts.common import NANOMT, RESULTS, ROOT, cpu_model, git, shown

THREADS = 2


def ct2_main(argv: list[str]) -> None:
    """The plain CTranslate2 script: translate a file, one line a sentence (no torch in this process)."""
    p = argparse.ArgumentParser()
    p.add_argument("--ct2", type=Path, required=True)
    p.add_argument("-i", "--input", type=Path, required=True)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--compute-type", default="float32")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--use-vmap", action="store_true", help="the export's vocabulary map (its vmap.txt)")
    args = p.parse_args(argv)
    t = ct2.Ct2Translator(args.ct2, compute_type=args.compute_type, intra_threads=THREADS)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    ids = t.encode(lines)
    keep = [i for i, s in enumerate(ids) if s]
    src = [ids[i][: t.max_src_tokens] for i in keep]
    budgets = [t.max_len(len(s)) for s in src]
    # One translate_batch call, CTranslate2 batching by tokens as nanomt does (decode.max_tokens): what a user of
    # CTranslate2 writes. One max_decoding_length a call: the longest budget, each output then cut at its own.
    d = t.decoding.replace(beam_size=args.beam)
    options = t.search_options(d)  # its max_batch_size: decode.max_tokens, batch_type tokens
    options["use_vmap"] = args.use_vmap
    tokens = [[t.src_vocab[x] for x in s] for s in src]
    results = t.translator.translate_batch(tokens, max_decoding_length=max(budgets, default=1), **options)
    out: list[list[int]] = [[] for _ in lines]
    for i, budget, res in zip(keep, budgets, results):
        hyps = [h[:budget] for h in res.hypotheses]
        best = t.rescore(hyps, res.scores, budget, d) if res.scores else hyps[0]
        out[i] = [t.tgt_ids[p] for p in best]
    args.output.write_text("".join(x + "\n" for x in t.decode_ids(out)), encoding="utf-8")
    assert "torch" not in sys.modules


def wall(cmd: list[str]) -> float:
    """Seconds from starting `cmd` to its exit (an error if it fails)."""
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"translate_ct2.py: error: {' '.join(cmd[:4])}... failed: {res.stderr.strip().splitlines()[-1:]}")
    return seconds


def commands(run: Path, ct2_dir: Path, src: Path, out: Path, beam: int, shortlist: bool) -> dict[str, list[str]]:
    """The whole-process commands, each writing out/NAME.txt; with `shortlist`, nanomt's vocabulary shortlist and
    CTranslate2's vocabulary map made from it."""
    me = [sys.executable, "-m", "benchmarks.translate_ct2", "--ct2", str(ct2_dir), "-i", str(src), "--beam", str(beam)]
    nanomt = [*NANOMT, "translate", str(run), "-i", str(src), "--beam", str(beam)]
    if shortlist:
        me, nanomt = [*me, "--use-vmap"], [*nanomt, "--shortlist"]
    return {
        "nanomt_fp32": [*nanomt, "-o", str(out / "nanomt_fp32.txt")],
        "ct2_fp32": [*me, "-o", str(out / "ct2_fp32.txt"), "--compute-type", "float32"],
        "nanomt_int8": [*nanomt, "--int8", "-o", str(out / "nanomt_int8.txt")],
        "ct2_int8": [*me, "-o", str(out / "ct2_int8.txt"), "--compute-type", "int8"],
    }


def round_robin(cmds: dict[str, list[str]], reps: int, warmup: int) -> dict[str, list[float]]:
    """Every command once a round, starting one further along each round; warm-up rounds dropped."""
    names, samples = list(cmds), {name: [] for name in cmds}
    for r in range(warmup + reps):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            seconds = wall(cmds[name])
            if r >= warmup:
                samples[name].append(round(seconds, 3))
            time.sleep(0.3)
    return samples


def differing(a: Path, b: Path) -> int:
    x, y = a.read_text(encoding="utf-8").splitlines(), b.read_text(encoding="utf-8").splitlines()
    return sum(1 for p, q in zip(x, y) if p != q) + abs(len(x) - len(y))


def main() -> None:
    if "--ct2" in sys.argv:
        ct2_main(sys.argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="the nanomt checkpoint (exported to CTranslate2 here)")
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--shortlist", action="store_true", help="nanomt --shortlist against CTranslate2's vocabulary map")
    p.add_argument("--out", type=Path, default=RESULTS / "translate_ct2_process.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ct2_dir = tmp / "ct2"
        subprocess.run([*NANOMT, "export", "ct2", str(args.run), "--out", str(ct2_dir)], check=True, cwd=ROOT)
        one = tmp / "one.txt"
        one.write_text(args.src.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
        (tmp / "whole").mkdir()
        (tmp / "start").mkdir()
        if args.shortlist and not (ct2_dir / ct2.VMAP).is_file():
            sys.exit(f"translate_ct2.py: error: {args.run} has no shortlist (nanomt shortlist builds it)")
        cmds = commands(args.run, ct2_dir, args.src, tmp / "whole", args.beam, args.shortlist)
        whole = round_robin(cmds, args.reps, args.warmup)
        start_cmds = commands(args.run, ct2_dir, one, tmp / "start", args.beam, args.shortlist)
        start_cmds["import_torch"] = [sys.executable, "-c", "import torch"]
        start = round_robin(start_cmds, args.reps, args.warmup)
        diffs = {
            "fp32_nanomt_vs_ct2": differing(tmp / "whole" / "nanomt_fp32.txt", tmp / "whole" / "ct2_fp32.txt"),
            "int8_nanomt_vs_ct2": differing(tmp / "whole" / "nanomt_int8.txt", tmp / "whole" / "ct2_int8.txt"),
            "nanomt_int8_vs_fp32": differing(tmp / "whole" / "nanomt_int8.txt", tmp / "whole" / "nanomt_fp32.txt"),
        }
    median = {name: statistics.median(s) for name, s in whole.items()}
    first = {name: statistics.median(s) for name, s in start.items()}
    result = {
        "measures": "whole processes, start to exit: `nanomt translate` and a plain CTranslate2 script on the same "
        "file and model, median wall seconds; start-up: the same on the file's first line, and import torch",
        "run": shown(args.run),
        "src": shown(args.src),
        "sentences": len(args.src.read_text(encoding="utf-8").splitlines()),
        "beam_size": args.beam,
        "shortlist": args.shortlist,
        "reps": args.reps,
        "whole_s": median,
        "whole_samples_s": whole,
        "one_line_s": first,
        "one_line_samples_s": start,
        "nanomt_over_ct2_speed": {
            kind: round(median[f"ct2_{kind}"] / median[f"nanomt_{kind}"], 3) for kind in ("fp32", "int8")
        },
        "start_up_share": {name: round(first[name] / median[name], 3) for name in median},
        "nanomt_one_line_over_import_torch_s": {
            kind: round(first[f"nanomt_{kind}"] - first["import_torch"], 3) for kind in ("fp32", "int8")
        },
        "differing_lines": diffs,
        "cpu": cpu_model(),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": time.strftime("%Y-%m-%d"),
    }
    result["bound"] = bound(result)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("whole_s", "one_line_s", "nanomt_over_ct2_speed", "bound")}))


def bound(result: dict) -> dict:
    """What bounds the whole-process ratio: each engine's file time less its one-line run (decoding without
    start-up), and how much faster nanomt's decoding would have to be to make up its start-up."""
    whole, one = result["whole_s"], result["one_line_s"]
    out = {}
    for kind in ("fp32", "int8"):
        n, c = whole[f"nanomt_{kind}"] - one[f"nanomt_{kind}"], whole[f"ct2_{kind}"] - one[f"ct2_{kind}"]
        gap = one[f"nanomt_{kind}"] - one[f"ct2_{kind}"]  # the start-up nanomt pays more
        out[kind] = {
            "nanomt_decoding_s": round(n, 3),
            "ct2_decoding_s": round(c, 3),
            "start_up_gap_s": round(gap, 3),
            "decoding_speedup_needed_for_1x": round(n / max(c - gap, 1e-9), 3),
        }
    over_torch = {kind: one[f"nanomt_{kind}"] - one["import_torch"] for kind in ("fp32", "int8")}
    lines = [
        f"importing torch alone ({one['import_torch']:.2f} s, a whole process) takes longer than CTranslate2's whole "
        f"one-line run ({one['ct2_fp32']:.2f} s float32)",
        "nanomt's one-line run is "
        + ", ".join(f"{d:+.2f} s ({kind})" for kind, d in over_torch.items())
        + " from importing torch's",
    ]
    for kind in ("fp32", "int8"):
        need = out[kind]["decoding_speedup_needed_for_1x"]
        lines.append(
            f"{kind}: its decoding makes up its start-up (1.0x needs {need:.2f}x CTranslate2's decoding speed)"
            if need <= 1
            else f"{kind}: 1.0x needs nanomt to decode {need:.2f}x as fast as CTranslate2 to make up its start-up"
        )
    out["why"] = "; ".join(lines)
    return out


if __name__ == "__main__":
    main()
