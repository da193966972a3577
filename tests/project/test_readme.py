"""The README's Quickstart runs as written, on a tiny training budget, from a fresh directory."""

import re
import shutil
import subprocess
import sys

import pytest
from paths import REPO as ROOT

# `nanomt` as the README's reader runs it, with a budget of a few steps added to `train` and fewer pairs to `synth`
# (argparse keeps the last of a repeated option, so a README that sets these itself still runs with the budget).
NANOMT = f"""
nanomt() {{
  case "$1" in
    train) "{sys.executable}" -m nanomt.cli "$@" --set train.max_steps=3 --set train.eval_every=3 \\
             --set train.save_every=3 --set train.valid_bleu_sentences=5 ;;
    synth) "{sys.executable}" -m nanomt.cli "$@" --pairs 1000 ;;
    *) "{sys.executable}" -m nanomt.cli "$@" ;;
  esac
}}
set -euo pipefail
"""


def bash_block(heading: str) -> list[str]:
    """The lines of the first bash block under a README heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"the {heading} section has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def quickstart_commands() -> list[str]:
    return bash_block("Quickstart")


@pytest.mark.slow
def test_quickstart_runs_as_written(tmp_path):
    commands = quickstart_commands()
    assert commands[0].startswith("nanomt synth") and any(c.startswith("nanomt train") for c in commands)
    # The commands run from the repository root: give them its configs/ and nothing else of it.
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    # Then the Documents section's round trip on the model the Quickstart trained.
    commands += bash_block("Documents")
    script = NANOMT + "\n".join(commands) + "\n"
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    for line in commands:  # every file a command names with -o/--output exists afterwards
        for out in re.findall(r"(?:-o|--output) (\S+)", line):
            assert (tmp_path / out).is_file(), line
    hyp = (tmp_path / "runs/demo/doc.hyp").read_text(encoding="utf-8").split("\n")
    assert len(hyp) == 4 and hyp[1] == "" and "https://example.com 🙂" in hyp[2]
    page = (tmp_path / "runs/demo/page.hyp.html").read_text(encoding="utf-8")
    assert page.startswith("<p>") and page.count("<b>") == page.count("</b>") == 1
    assert page.endswith("<code>x = 1</code></p>\n")
