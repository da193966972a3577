"""Where `nanomt translate`'s time goes: torch.profiler's operators over one translation of a file.

    python -m benchmarks.profile_translate --checkpoint runs/multi30k_de_en \\
        --src ../shared/data/multi30k/test2016.de       # -> benchmarks/results/profile_translate.json

One process on 2 threads, as `nanomt translate` runs (the malloc setting, then decoding): the file translated once
to warm up, then once under the profiler (float32, then int8 with --int8). Per operator: its self CPU time and
calls, largest first, with the share of the profiled run's wall time; grouped into the matrix products, attention,
the beams' cache reorders, scoring (softmax, top-k) and everything else.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from scripts.common import DEFAULT_RUN, DEFAULT_SRC, RESULTS, machine, shown

GROUPS = {
    "matrix products": ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::_int_mm", "onednn::qlinear"),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product"),
    "cache reorders": ("aten::index_select", "aten::index", "aten::repeat_interleave"),
    "scoring": ("aten::_log_softmax", "aten::topk", "aten::log_softmax"),
}


def group_of(name: str) -> str:
    return next((g for g, prefixes in GROUPS.items() if name.startswith(prefixes)), "other")


def profile(checkpoint: Path, lines: list[str], beam: int, int8: bool, top: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from nanomt.core import runtime
    from nanomt.decoding.translate import Translator

    translator = Translator.from_checkpoint(checkpoint, int8=int8)
    runtime.keep_freed_memory()
    translator.translate(lines, beam_size=beam)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        translator.translate(lines, beam_size=beam)
        wall = time.perf_counter() - t0
    rows = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    groups: dict[str, float] = {}
    for name, seconds, _ in rows:
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + seconds
    profiled = sum(s for _, s, _ in rows)
    return {
        "threads": torch.get_num_threads(),
        "wall_s_profiled": round(wall, 2),
        "self_cpu_s_total": round(profiled, 2),
        "groups_share_of_self_cpu": {g: round(s / profiled, 3) for g, s in sorted(groups.items(), key=lambda x: -x[1])},
        "top_ops": [{"op": n, "self_s": round(s, 3), "calls": c} for n, s, c in rows[:top]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN)
    p.add_argument("--src", type=Path, default=DEFAULT_SRC)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path, default=RESULTS / "profile_translate.json")
    args = p.parse_args()
    lines = args.src.read_text(encoding="utf-8").splitlines()
    result = {
        "what": "torch.profiler self CPU time per operator of Translator.translate of --src at --beam (what nanomt "
        "translate decodes), after one warm-up translation",
        "checkpoint": shown(args.checkpoint),
        "src": shown(args.src),
        "beam": args.beam,
        **{x: profile(args.checkpoint, lines, args.beam, x == "int8", args.top) for x in ("fp32", "int8")},
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({x: result[x]["groups_share_of_self_cpu"] for x in ("fp32", "int8")}, indent=1))


if __name__ == "__main__":
    main()
