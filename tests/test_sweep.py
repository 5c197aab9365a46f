"""sweep.py --quick (tiny models): every variant end to end, partial calls merging their rows, finished runs reused;
the mean and range over seeds, the LM half's plateau rule, and the errors."""
import json
import pathlib

import pytest

import sweep
from configurator import InputError
from passkey import run_passkey
from sweep import VARIANTS, add_row, cell, markdown_table, name_of, plateau, spread


def quick(tmp_path, shakespeare_path, *args, docs=""):
    """One in-process call of `python sweep.py --quick ...` (--docs=tmp_path/docs); returns sweep-recipe.json's rows."""
    sweep.main(["--quick", f"--out_dir={tmp_path}", f"--input={shakespeare_path}", f"--docs={tmp_path / docs}", *args])
    return json.loads((tmp_path / docs / "sweep-recipe.json").read_text())["variants"]


def table_names(part):
    return [line.split(" | ")[0][2:] for line in part.splitlines() if line.startswith("| ") and "| variant" not in line]


def test_quick_sweep_merges_and_reuses(tmp_path, shakespeare_path, capsys, monkeypatch):
    names = [name_of(*v) for v in VARIANTS]
    rows = quick(tmp_path, shakespeare_path, "--seeds=1337")  # every variant, one seed, both halves
    assert set(rows) == set(names) and all(list(r["passkey"]) == ["1337"] and "lm" in r for r in rows.values())
    for r in rows.values():  # accuracies are fractions of the scored prompts
        assert all(v is None or 0.0 <= v <= 1.0 for v in r["passkey"]["1337"]["passkey"])
    assert rows["tapa"]["passkey"]["1337"]["lr"] == rows["rope"]["passkey"]["1337"]["lr"] / 5  # TAPA's paper: 5x lower
    assert rows["tapa"]["lm"]["lr"] == rows["rope"]["lm"]["lr"] / 5
    # the demo's last phase (QUICK: its last 2 of 4 steps), except for learned, which has no positions past 320
    assert "phase from iteration 2" in (tmp_path / "passkey-bam+ssmax-s1337" / "log.txt").read_text()
    assert "phase from" not in (tmp_path / "passkey-learned-s1337" / "log.txt").read_text()
    md = (tmp_path / "results.md").read_text()
    passkey_part, ppl_part = md.split("## Perplexity")
    assert table_names(passkey_part) == [n + " (no last phase)" * (n == "learned") for n in names]
    assert "| alibi | 1337 | " in passkey_part and "(1 seed)" in passkey_part.split("| alibi |")[1].splitlines()[0]
    assert table_names(ppl_part.split("## Learned")[0]) == names
    learned = ppl_part.split("| learned | ")[1].splitlines()[0].split(" | ")
    assert learned[1] == "n/a / n/a" and learned[-1].rstrip(" |") in ("yes", "**no**")  # 2x is past its positions
    for png in ("passkey.png", "ppl-full.png", "ppl-sliding.png", "priors-bam.png", "heatmap-bam+ssmax.png"):
        assert (tmp_path / png).stat().st_size > 1000

    # a second call runs a part: the first call's rows stay, and so does the hand-written part of results.md
    (tmp_path / "results.md").write_text(md + "## Reading\nwritten by hand\n")
    capsys.readouterr()
    merged = quick(tmp_path, shakespeare_path, "--only=alibi,rope", "--seeds=1,1337", "--half=passkey")
    assert "alibi, seed 1337: in " in capsys.readouterr().out  # already there: not run again
    assert merged["alibi"]["passkey"]["1337"] == rows["alibi"]["passkey"]["1337"]
    assert list(merged["rope"]["passkey"]) == ["1337", "1"] and list(merged["alibi"]["passkey"]) == ["1337", "1"]
    assert all(merged[n] == rows[n] for n in names if n not in ("alibi", "rope"))
    md = (tmp_path / "results.md").read_text()
    assert md.endswith("## Reading\nwritten by hand\n") and md.count("## Reading") == 1
    alibi = md.split("| alibi | ")[1].splitlines()[0]
    assert alibi.startswith("1337, 1 | ") and "seed" not in alibi  # both of QUICK's seeds: no count
    assert "(1 seed)" in md.split("| nope | ")[1].splitlines()[0]

    # reuse: a call writing elsewhere finds the checkpoints at their budget and the passkey results scored on them
    ckpts = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/ckpt.pt")}
    done = []
    monkeypatch.setattr(sweep, "run_passkey", lambda *a, **k: done.append(len(k["done"])) or run_passkey(*a, **k))
    capsys.readouterr()
    again = quick(tmp_path, shakespeare_path, "--only=alibi", docs="other")
    out = capsys.readouterr().out
    assert out.count("nothing to train") == 3 and "nanoPE: pos=" not in out  # 2 passkey seeds and the LM: no step
    assert done == [4, 4]  # every prompt (2 lengths x 2 depths x 1 sample) of both seeds already scored
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/ckpt.pt")} == ckpts
    for seed in ("1337", "1"):
        assert again["alibi"]["passkey"][seed]["passkey"] == merged["alibi"]["passkey"][seed]["passkey"]
    assert again["alibi"]["lm"]["ppl_full"] == rows["alibi"]["lm"]["ppl_full"]

    # the errors, before anything runs
    with pytest.raises(InputError, match=r"unknown variant\(s\) nosuch in --only"):
        quick(tmp_path, shakespeare_path, "--only=nosuch")
    for bad in ("1,x", "1,1", ","):
        with pytest.raises(InputError, match="bad --seeds"):
            quick(tmp_path, shakespeare_path, f"--seeds={bad}")
    with pytest.raises(InputError, match=r"holds a sweep of other settings: lm_iters=4 \(now 8\)"):
        quick(tmp_path, shakespeare_path, "--lm_iters=8")
    with pytest.raises(InputError, match="passkey-alibi-s1337 holds a run of other settings"):
        quick(tmp_path, shakespeare_path, "--passkey_iters=6", "--only=alibi", "--seeds=1337", docs="third")


def test_add_row_keeps_rows_written_meanwhile(tmp_path):
    path = tmp_path / "sweep-recipe.json"
    data = dict(setting={}, variants={"rope": {"passkey": {"1337": {"acc": 1}}}})  # as this process read it
    other = {"rope": {"passkey": {"1337": {"acc": 1}, "1": {"acc": 2}}}, "alibi": {"passkey": {}, "lm": {"ppl": 3}}}
    path.write_text(json.dumps(dict(setting={}, variants=other)))  # what another process (another --only) wrote since
    add_row(str(path), data, "rope", "2", {"acc": 4})
    add_row(str(path), data, "nope", "lm", {"ppl": 5})
    other["rope"]["passkey"]["2"], other["nope"] = {"acc": 4}, {"passkey": {}, "lm": {"ppl": 5}}
    assert json.loads(path.read_text())["variants"] == other == data["variants"]


def test_mean_and_range_over_seeds():
    assert spread([0.7, None, 0.9, 1.0]) == pytest.approx(((0.7 + 0.9 + 1.0) / 3, 0.7, 1.0, 3))  # None: n/a
    assert spread([None]) == (None, None, None, 0)
    assert cell([0.7, 0.9, 1.0], 3) == "87% (70–100)"  # 86.7%
    assert cell([1.0, 1.0, 1.0], 3) == "100%"  # every seed the same: no range
    assert cell([1.0], 3) == "100% (1 seed)"
    assert cell([0.5, 0.75], 3) == "62% (50–75, 2 seeds)"  # 62.5 rounds to even
    assert cell([None, None], 3) == "n/a"


def test_plateau_rule():
    flat = [[it, 0, 1.5 + 2.0 * 0.7 ** it] for it in range(21)]  # S = 20, evaluations every 1: 0.75 S = 15
    drop, ok = plateau(flat)
    assert ok and drop == pytest.approx((flat[15][2] - flat[20][2]) / flat[20][2])
    falling = [[it, 0, 2.0 - 0.01 * it] for it in range(21)]  # 1.85 -> 1.80 over the last quarter: 2.8%
    assert plateau(falling) == (pytest.approx(0.05 / 1.8), False)
    overfit = [[it, 0, 1.5 + 0.01 * abs(it - 8)] for it in range(21)]  # lowest 1.50 at 8, 1.62 at S: 8% above
    assert not plateau(overfit)[1] and plateau(overfit)[0] < 0
    coarse = [[0, 0, 5.0], [300, 0, 1.61], [600, 0, 1.60], [900, 0, 1.59]]  # 0.75 S = 675: the evaluation at 600
    assert plateau(coarse) == (pytest.approx(0.01 / 1.59), True)


def test_markdown_table_formats():
    table = markdown_table({"a": ["100%", "n/a"], "b": ["50%", "0%"]}, ["1x", "2x"])
    assert table.splitlines() == ["| variant | 1x | 2x |", "|---|---|---|", "| a | 100% | n/a |", "| b | 50% | 0% |"]


def test_readme_passkey_table_is_the_sweeps():
    """The README's passkey table (rows "| variant: flags | seeds | 1x | 4x | 16x | 64x | ...") says what
    docs/sweep-recipe.json holds: each row's seeds, and at 1x, 4x, 16x and 64x the mean and range over them."""
    root = pathlib.Path(sweep.ROOT)
    sweep_json = json.loads((root / "docs" / "sweep-recipe.json").read_text())
    rows, lengths = sweep_json["variants"], sweep_json["setting"]["passkey_lengths"]
    row_name = lambda line: line[2:].strip("*").split("*")[0].split(":")[0]  # "| **bam+ssmax**: ..." -> bam+ssmax
    names = [name_of(*v) for v in VARIANTS]
    table = [(row_name(line), line.split(" | ")) for line in (root / "README.md").read_text().splitlines()
             if line.startswith("| ") and row_name(line) in names]
    assert table, "no passkey table in the README"
    for name, cells in table:
        runs = rows[name]["passkey"]
        assert cells[1] == ", ".join(runs), f"README's {name} row: seeds {cells[1]}, the sweep's {', '.join(runs)}"
        for m, text in zip((1, 4, 16, 64), cells[2:6]):
            i = lengths.index(m)
            assert text == cell([r["passkey"][i] for r in runs.values()], len(runs)), f"README's {name} at {m}x"
