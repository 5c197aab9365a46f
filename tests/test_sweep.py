"""sweep.py --quick (tiny models): every variant end to end, partial calls merging their rows, finished runs reused;
the mean and range over seeds, the LM half's plateau rule, and the errors."""
import itertools
import json
import pathlib
import re

import pytest

import sweep
from checkpoint import read_checkpoint
from configurator import InputError
from passkey import run_passkey
from sweep import VARIANTS, add_row, at_plateau, cell, markdown_table, name_of, plateau, seeds_text, spread


def quick(tmp_path, shakespeare_path, *args, docs=""):
    """One in-process call of `python sweep.py --quick ...` (--docs=tmp_path/docs); returns the rows of
    sweep-passkey.json and of sweep-lm.json ({variant: {seed: row}})."""
    sweep.main(["--quick", f"--out_dir={tmp_path}", f"--input={shakespeare_path}", f"--docs={tmp_path / docs}", *args])
    read = lambda half: json.loads((tmp_path / docs / f"sweep-{half}.json").read_text())["variants"]
    return read("passkey"), read("lm")


def table_names(part):
    return [line.split(" | ")[0][2:] for line in part.splitlines() if line.startswith("| ") and "| variant" not in line]


def test_quick_sweep_merges_and_reuses(tmp_path, shakespeare_path, capsys, monkeypatch):
    names = [name_of(*v) for v in VARIANTS]
    pk, lm = quick(tmp_path, shakespeare_path, "--seeds=1337")  # every variant, one seed, both halves
    assert set(pk) == set(lm) == set(names) and all(list(r) == ["1337"] for r in [*pk.values(), *lm.values()])
    for r in pk.values():  # accuracies are fractions of the scored prompts, before the last phase and after it
        assert all(v is None or 0.0 <= v <= 1.0 for key in ("passkey", "passkey_pre") for v in r["1337"][key])
    assert pk["tapa"]["1337"]["lr"] == pk["rope"]["1337"]["lr"] / 5  # TAPA's paper: 5x lower
    assert lm["tapa"]["1337"]["lr"] == lm["rope"]["1337"]["lr"] / 5
    assert all(r["1337"]["iters"] == 4 for r in lm.values())
    # the demo's last phase (QUICK: its last 2 of 4 steps), scored before it (pre-phase/: the run stopped at step 2,
    # which the main run goes on from) and at the end; learned has no positions past 320: no phase
    run = tmp_path / "passkey-bam+ssmax-s1337"
    assert "phase from" not in (run / "pre-phase" / "log.txt").read_text()
    assert "phase from iteration 2" in (run / "log.txt").read_text()
    assert [read_checkpoint(str(p / "ckpt.pt"))["iter_num"] for p in (run / "pre-phase", run)] == [2, 4]
    assert "phase from" not in (tmp_path / "passkey-learned-s1337" / "log.txt").read_text()
    md = (tmp_path / "results.md").read_text()
    passkey_part, ppl_part = md.split("## Perplexity")
    end_part, pre_part = passkey_part.split("### Before the last phase (step 2)")
    label = lambda n: n + " (no last phase)" * (n == "learned")
    assert table_names(end_part) == table_names(pre_part) == [label(n) for n in names]
    alibi = passkey_part.split("| alibi | ")[1].splitlines()[0]  # one seed: the seeds column says so, not each cell
    assert alibi.startswith("1337 | ") and "seed" not in alibi
    alibi_pre = pre_part.split("| alibi | ")[1].splitlines()[0].split(" | ")
    assert alibi_pre[1:-1] == [cell([v], 1) for v in pk["alibi"]["1337"]["passkey_pre"]]
    assert alibi_pre[-1] == f"{pk['alibi']['1337']['val_loss_pre']:.3f} |"
    full_part, sliding_part = ppl_part.split("## Learned")[0].split("### Sliding window")
    assert table_names(full_part) == table_names(sliding_part) == names
    learned = full_part.split("| learned | ")[1].splitlines()[0].split(" | ")
    assert learned[:3] == ["1337", f"{lm['learned']['1337']['ppl_full'][0]:.2f}", "n/a"]  # 2x: past its positions
    assert learned[-1].rstrip(" |") in ("yes", "**no**")
    for png in ("passkey.png", "ppl-full.png", "ppl-sliding.png", "priors-bam.png", "heatmap-bam+ssmax.png"):
        assert (tmp_path / png).stat().st_size > 1000

    # a second call runs a part: the first call's rows stay, and so does the hand-written part of results.md
    (tmp_path / "results.md").write_text(md + "## Reading\nwritten by hand\n")
    capsys.readouterr()
    merged, lm2 = quick(tmp_path, shakespeare_path, "--only=alibi,rope", "--seeds=1,1337")
    out = capsys.readouterr().out  # already there (both halves): not run again
    assert "alibi, seed 1337: in " + str(tmp_path / "sweep-passkey.json") in out and "sweep-lm.json already" in out
    assert merged["alibi"]["1337"] == pk["alibi"]["1337"] and lm2["alibi"]["1337"] == lm["alibi"]["1337"]
    for rows in (merged, lm2):
        assert list(rows["rope"]) == ["1337", "1"] and list(rows["alibi"]) == ["1337", "1"]
    assert all(merged[n] == pk[n] and lm2[n] == lm[n] for n in names if n not in ("alibi", "rope"))
    md = (tmp_path / "results.md").read_text()
    assert md.endswith("## Reading\nwritten by hand\n") and md.count("## Reading") == 1
    alibi = md.split("| alibi | ")[1].splitlines()[0]
    assert alibi.startswith("1337, 1 | ") and "seed" not in alibi  # both of QUICK's seeds: no count
    nope = md.split("| nope | ")[1].splitlines()[0]  # a row of one seed beside rows of two: no count in its cells
    assert nope.startswith("1337 | ") and "seed" not in nope
    rope_ppl = md.split("### Full windows")[1].split("| rope | ")[1].splitlines()[0].split(" | ")
    assert rope_ppl[:3] == ["1337, 1"] + [cell([lm2["rope"][s]["ppl_full"][i] for s in ("1337", "1")], 2, percent=False)
                                          for i in range(2)]  # the mean over the row's seeds and their range

    # reuse: a call writing elsewhere finds the checkpoints at their budget and the passkey results scored on them
    ckpts = {p: p.stat().st_mtime_ns for p in tmp_path.glob("**/ckpt.pt")}
    done = []
    monkeypatch.setattr(sweep, "run_passkey", lambda *a, **k: done.append(len(k["done"])) or run_passkey(*a, **k))
    capsys.readouterr()
    again, lm3 = quick(tmp_path, shakespeare_path, "--only=alibi", docs="other")
    out = capsys.readouterr().out
    assert out.count("nothing to train") == 6 and "nanoPE: pos=" not in out  # 2 seeds x (pre-phase, end, LM)
    assert done == [4, 4, 4, 4]  # every prompt (2 lengths x 2 depths x 1 sample) of both scorings of both seeds
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("**/ckpt.pt")} == ckpts
    for seed, key in itertools.product(("1337", "1"), ("passkey", "passkey_pre")):
        assert again["alibi"][seed][key] == merged["alibi"][seed][key]
    assert all(lm3["alibi"][seed]["ppl_full"] == lm2["alibi"][seed]["ppl_full"] for seed in ("1337", "1"))

    # the errors, before anything runs
    with pytest.raises(InputError, match=r"unknown variant\(s\) nosuch in --only"):
        quick(tmp_path, shakespeare_path, "--only=nosuch")
    for bad in ("1,x", "1,1", ","):
        with pytest.raises(InputError, match="bad --seeds"):
            quick(tmp_path, shakespeare_path, f"--seeds={bad}")
    with pytest.raises(InputError, match=r"sweep-passkey.json holds a sweep of other settings: passkey_iters=4 "
                                         r"\(now 6\)"):
        quick(tmp_path, shakespeare_path, "--passkey_iters=6", "--half=passkey")
    # an LM row at another S (a variant that needs more steps) is trained again at that S and replaced; the
    # passkey half's settings are not checked by a call of the LM half
    _, longer = quick(tmp_path, shakespeare_path, "--passkey_iters=6", "--half=lm", "--only=alibi", "--lm_iters=8")
    out = capsys.readouterr().out
    assert all(f"alibi, seed {seed}: in " in out for seed in ("1337", "1"))
    assert "at 4 steps, now 8: trained again" in out
    assert [r["iters"] for r in longer["alibi"].values()] == [8, 8]
    assert [it for it, _ in longer["alibi"]["1"]["val"]] == list(range(9)) and longer["rope"] == lm2["rope"]
    with pytest.raises(InputError, match=r"passkey-alibi-s1337/pre-phase holds a run of other settings "
                                         r"\(phase_from=2, lr_decay_iters=2\)"):
        quick(tmp_path, shakespeare_path, "--passkey_iters=6", "--only=alibi", "--seeds=1337", docs="third")


def test_add_row_keeps_rows_written_meanwhile(tmp_path):
    path = tmp_path / "sweep-passkey.json"
    data = dict(setting={}, variants={"rope": {"1337": {"acc": 1}}})  # as this process read it
    other = {"rope": {"1337": {"acc": 1}, "1": {"acc": 2}}, "alibi": {"7": {"acc": 3}}}
    path.write_text(json.dumps(dict(setting={}, variants=other)))  # what another process (another --only) wrote since
    add_row(str(path), data, "rope", "2", {"acc": 4})
    add_row(str(path), data, "nope", "1337", {"ppl": 5})  # a variant's first row
    other["rope"]["2"], other["nope"] = {"acc": 4}, {"1337": {"ppl": 5}}
    assert json.loads(path.read_text())["variants"] == other == data["variants"]


def test_headings_name_the_seeds_the_rows_have():
    """A half's heading gives the planned seeds, and the seeds its rows have where they differ (seed order: the
    plan's, then others), so "seeds 1337, 1, 2" never heads rows of seed 1337 alone."""
    planned = [1337, 1, 2]
    assert seeds_text({"bam": {"1337": {}, "2": {}, "1": {}}, "rope": {"1337": {}}}, planned) == "1337, 1, 2"
    assert seeds_text({"bam": {"1337": {}}, "rope": {"2": {}}}, planned) == "1337, 1, 2 planned; rows so far: 1337, 2"
    assert seeds_text({"bam": {"7": {}, "1": {}}}, planned) == "1337, 1, 2 planned; rows so far: 1, 7"
    assert seeds_text({}, planned).endswith("rows so far: none")


def test_mean_and_range_over_seeds():
    assert spread([0.7, None, 0.9, 1.0]) == pytest.approx(((0.7 + 0.9 + 1.0) / 3, 0.7, 1.0, 3))  # None: n/a
    assert spread([None]) == (None, None, None, 0)
    assert cell([0.7, 0.9, 1.0], 3) == "87% (70–100)"  # 86.7%
    assert cell([1.0, 1.0, 1.0], 3) == "100%"  # every seed the same: no range
    assert cell([1.0], 3) == "100% (1 seed)"
    assert cell([0.5, 0.75], 3) == "62% (50–75, 2 seeds)"  # 62.5 rounds to even
    assert cell([None, None], 3) == "n/a"
    assert cell([0.996, 1.0], 2) == "100%"  # both print 100: no range
    assert cell([4.114, 4.2], 2, percent=False) == "4.16 (4.11–4.20)"  # perplexities: 2 decimals
    assert cell([4.111, 4.114], 2, percent=False) == "4.11" and cell([4.1], 3, percent=False) == "4.10 (1 seed)"
    assert cell([31234.0], 1, percent=False) == "3.12e+04"


def test_plateau_rule():
    mean = lambda xs: sum(xs) / len(xs)
    flat = [[it, 1.5 + 2.0 * 0.7 ** it] for it in range(21)]  # S = 20, evaluations every 1: 0.75 S = 15
    drop, ok = plateau(flat)  # the means of the 3 evaluations ending at 15 and at 20
    last = mean([v for _, v in flat[18:]])
    assert ok and drop == pytest.approx((mean([v for _, v in flat[13:16]]) - last) / last)
    falling = [[it, 2.0 - 0.01 * it] for it in range(21)]  # means 1.86 -> 1.81 over the last quarter: 2.8%
    assert plateau(falling) == (pytest.approx(0.05 / 1.81), False)
    overfit = [[it, 1.5 + 0.01 * abs(it - 8)] for it in range(21)]  # lowest mean 1.507 (7-9), 1.60 at the end
    assert not plateau(overfit)[1] and plateau(overfit)[0] < 0
    coarse = [[0, 1.62], [300, 1.61], [600, 1.60], [900, 1.59]]  # 0.75 S = 675: the 3 evaluations to 600
    assert plateau(coarse) == (pytest.approx(0.01 / 1.60), True)
    short = [[0, 1.7], [1, 1.6]]  # fewer evaluations than 3: the mean of those there are (0.75 S = 0.75: step 0)
    assert plateau(short) == (pytest.approx((1.7 - 1.65) / 1.65), False)
    # GGD-BAM + SSMax's 21 evaluations at S = 3,000 (docs/sweep-lm.json): the one at 0.75·S is 2.1% above the
    # last, the means of 3 ending there and at S differ by 0.2%
    noisy = [[150 * i, v] for i, v in enumerate([5.521, 2.103, 1.927, 1.831, 1.771, 1.72, 1.698, 1.648, 1.614, 1.602,
                                                  1.591, 1.582, 1.577, 1.545, 1.527, 1.565, 1.521, 1.536, 1.533,
                                                  1.562, 1.533])]
    assert noisy[15] == [2250, 1.565] and (1.565 - 1.533) / 1.533 > 0.02
    last = mean([1.533, 1.562, 1.533])
    assert plateau(noisy) == (pytest.approx((mean([1.545, 1.527, 1.565]) - last) / last), True)


def test_plateau_rule_on_the_mean_over_seeds():
    """A variant's plateau is judged on the mean over its seeds of each evaluation: here seed a alone falls 2.8% over
    the last quarter (fails) and seed b rises 1%, their mean falls 0.9% (passes)."""
    a = [[it, 2.0 - 0.01 * it] for it in range(21)]  # means 1.86 -> 1.81 over the last quarter
    b = [[it, 1.6 + 0.001 * it] for it in range(21)]
    mean = [[it, (va + vb) / 2] for (it, va), (_, vb) in zip(a, b)]
    runs = [dict(iters=20, val=a), dict(iters=20, val=b)]
    assert not plateau(a)[1] and plateau(mean)[1]
    assert at_plateau(runs) and not at_plateau(runs[:1])
    assert sweep.seed_mean_val(runs)[20] == [[it, pytest.approx(v)] for it, v in mean]
    assert sweep.drop_text(runs) == f"{100 * plateau(mean)[0]:.1f}% ({100 * plateau(b)[0]:.1f} to 2.8)"
    longer = dict(iters=40, val=[[2 * it, 2.0 - 0.01 * it] for it in range(21)])  # a seed at another S fails alone
    assert not at_plateau(runs + [longer]) and sweep.drop_text(runs + [longer]).endswith("; 2.8%")
    with pytest.raises(ValueError, match="evaluated at other iterations"):
        sweep.seed_mean_val([dict(iters=20, val=a), dict(iters=20, val=a[::2])])


def test_markdown_table_formats():
    table = markdown_table({"a": ["100%", "n/a"], "b": ["50%", "0%"]}, ["1x", "2x"])
    assert table.splitlines() == ["| variant | 1x | 2x |", "|---|---|---|", "| a | 100% | n/a |", "| b | 50% | 0% |"]


def readme_table(readme, header):
    """The rows of the README's table whose header line starts with `header`: {first cell's variant name: cells}
    ("| **bam+ssmax**: the demo | ..." -> "bam+ssmax"), cells split at " | " (the first keeps its "| ")."""
    lines = readme.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert len(starts) == 1, f"the README should have one table under {header!r}, it has {len(starts)}"
    rows = list(itertools.takewhile(lambda line: line.startswith("| "), lines[starts[0] + 2:]))
    return {line[2:].strip("*").split("*")[0].split(":")[0].split(" |")[0]: line.split(" | ") for line in rows}


def test_readme_passkey_table_is_the_sweeps():
    """The README's passkey table (rows "| variant: flags | seeds | 1x | 4x | 16x | 64x | ...") says what the
    sweep file its caption names (docs/sweep-passkey*.json) holds: each row's seeds, and at 1x, 4x, 16x and 64x the
    mean and range over them."""
    root = pathlib.Path(sweep.ROOT)
    readme = (root / "README.md").read_text()
    named = set(re.findall(r"\(docs/(sweep-passkey[\w-]*\.json)\)", readme))
    assert len(named) == 1, f"the README should link one passkey sweep file, it links {sorted(named) or 'none'}"
    sweep_json = json.loads((root / "docs" / named.pop()).read_text())
    rows, lengths = sweep_json["variants"], sweep_json["setting"]["passkey_lengths"]
    table = readme_table(readme, "| variant: `python train.py` + flags |")
    assert sorted(table) == sorted(name_of(*v) for v in VARIANTS), "the README's passkey table: one row a variant"
    for name, cells in table.items():
        runs = rows[name]
        assert cells[1] == ", ".join(runs), f"README's {name} row: seeds {cells[1]}, the sweep's {', '.join(runs)}"
        for m, text in zip((1, 4, 16, 64), cells[2:6]):
            i = lengths.index(m)
            assert text == cell([r["passkey"][i] for r in runs.values()], len(runs)), f"README's {name} at {m}x"


def test_readme_perplexity_table_is_the_sweeps():
    """The README's perplexity table (rows "| variant | seeds | steps | 1x | 4x | 16x |") says what docs/sweep-lm.json
    holds: each row's seeds, steps S (marked "²" when the plateau rule fails on the seeds' mean), and the mean and range over
    the seeds of the full-window perplexity at 1x (the sliding window is the same there) and of "full / sliding" at
    4x and 16x; "n/a" where the model has no positions."""
    root = pathlib.Path(sweep.ROOT)
    readme = (root / "README.md").read_text()
    assert "(docs/sweep-lm.json)" in readme, "the README's perplexity caption should link docs/sweep-lm.json"
    sweep_json = json.loads((root / "docs" / "sweep-lm.json").read_text())
    rows, lengths = sweep_json["variants"], sweep_json["setting"]["ppl_lengths"]
    table = readme_table(readme, "| variant | seeds | steps |")
    assert sorted(table) == sorted(rows) == sorted(name_of(*v) for v in VARIANTS), "one row a variant"
    for name, cells in table.items():
        runs = list(rows[name].values())
        mean = lambda mode, m: cell([r[f"ppl_{mode}"][lengths.index(m)] for r in runs], len(runs), percent=False)
        steps = ", ".join(f"{S:,}" for S in sorted({r["iters"] for r in runs}))
        assert cells[1] == ", ".join(rows[name]), f"README's {name}: seeds"
        assert cells[2] == steps + " ²" * (not at_plateau(runs)), f"README's {name}: steps"
        assert all(r["ppl_full"][0] == r["ppl_sliding"][0] for r in runs) and cells[3] == mean("full", 1), name
        for m, text in zip((4, 16), cells[4:6]):
            full = mean("full", m)
            assert text.rstrip(" |") == (full if full == "n/a" else f"{full} / {mean('sliding', m)}"), \
                f"README's {name} at {m}x"


def test_readme_is_short():
    """Issue 27's target: the README a newcomer finishes, at most 150 lines (the lab notes live in docs/)."""
    lines = (pathlib.Path(sweep.ROOT) / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail to docs/ (at most 150)"
