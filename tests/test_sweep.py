"""sweep.py --quick: the whole comparison end to end, both tables with one row per variant."""
import json
import os
import subprocess
import sys

import torch

from sweep import VARIANTS, name_of, markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_sweep_end_to_end(tmp_path, shakespeare_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "sweep.py", "--quick", f"--out_dir={tmp_path}", f"--input={shakespeare_path}"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # every passkey model trained 2 steps, then went on from that checkpoint to 4 (QUICK's passkey_iters)
    assert r.stdout.count("at iteration 2 of 4") == len(VARIANTS)
    for v in VARIANTS:
        assert torch.load(tmp_path / f"passkey-{name_of(*v)}" / "ckpt.pt", weights_only=True)["iter_num"] == 4
    md = (tmp_path / "results.md").read_text()
    assert "trained 2 steps, then resumed to 4 with the cosine stretched" in md
    passkey_part, ppl_part = md.split("## Perplexity")
    for part in (passkey_part, ppl_part):
        rows = [line for line in part.splitlines() if line.startswith("| ") and not line.startswith("| variant")]
        assert [row.split(" | ")[0][2:] for row in rows] == [name_of(*v) for v in VARIANTS]
    assert "| learned | " in ppl_part and "n/a" in ppl_part.split("| learned | ")[1].splitlines()[0]
    for png in ("passkey.png", "ppl.png", "priors-bam.png", "priors-bam+ssmax.png", "heatmap-bam+ssmax.png"):
        assert (tmp_path / png).stat().st_size > 1000
    data = json.loads((tmp_path / "sweep.json").read_text())["variants"]
    assert set(data) == {name_of(*v) for v in VARIANTS}
    for row in data.values():  # accuracies are fractions of the scored prompts
        assert all(v is None or 0.0 <= v <= 1.0 for v in row["passkey"])
    assert data["tapa"]["lr"] == data["rope"]["lr"] / 5  # TAPA's paper: 5x lower than RoPE

    # --only re-runs some variants; the others' rows stay, and so does the hand-written part of results.md
    (tmp_path / "results.md").write_text(md + "## Reading\nwritten by hand\n")
    r = subprocess.run([sys.executable, "sweep.py", "--quick", "--only=alibi", f"--out_dir={tmp_path}",
                        f"--input={shakespeare_path}"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "results.md").read_text()
    assert md.endswith("## Reading\nwritten by hand\n") and md.count("## Reading") == 1
    assert md.count("| nope+ssmax | ") == 2
    r = subprocess.run([sys.executable, "sweep.py", "--quick", "--only=nosuch", f"--out_dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 1 and "unknown variant(s) nosuch" in r.stderr


def test_markdown_table_formats():
    table = markdown_table({"a": [1.0, None], "b": [0.5, 0.0]}, [1, 2], "acc")
    assert table.splitlines() == ["| variant | 1x | 2x |", "|---|---|---|", "| a | 100% | n/a |", "| b | 50% | 0% |"]
