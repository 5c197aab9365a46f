"""
The papers' comparison at CPU scale (SPEC §7) at the CPU demo's recipe: 12 variant rows (the 8 --pos values, four
of them also with SSMax), 3 seeds each, passkey retrieval against length; and a language model per variant and seed
trained to its plateau, perplexity against length.

    python sweep.py                                # all of it (hours: "Wall times" in docs/results.md)
    python sweep.py --only=alibi,rope --seeds=1    # a part: finished runs are reused, every other row kept
    python sweep.py --half=lm --only=bam+ssmax     # one half only (passkey, lm or both)
    python sweep.py --quick                        # tiny models, 2 seeds (minutes), for the tests; writes to --out_dir
    python sweep.py --docs_only                    # rewrite results.md and the plots from docs/sweep-*.json

Passkey half, per variant and seed (out_dir/passkey-<name>-s<seed>/): train.py with config/cpu_demo.py and --seed,
at a budget of --passkey_iters steps (default 6,000: PASSKEY_BUDGET), the last 300 the demo's last phase (prompts of
320-1,280 bytes), the cosine ending where it begins; TAPA at 1/5 of both learning rates (its paper's ratio to RoPE);
learned without the last phase (--phase_from=None: no positions past 320; its last 300 steps stay on 320-byte
prompts, at min_lr). Each run is scored twice, at 1x-64x with 5 depths x 4 samples: at the step where the last
phase begins (the run stops there, in passkey-<name>-s<seed>/pre-phase/, and goes on from a copy) and at the end.
LM half, per variant and seed (out_dir/lm-<name>-s<seed>-<S>/): the same model on tiny Shakespeare bytes
(256-byte windows, 16 a batch, lr 1e-3, TAPA 2e-4) for S steps (3,000; more for the variants in LM_ITERS,
listed under --lm_iters, which sets every variant's), evaluated every S/20; its row records S; then perplexity
on the first ppl_tokens of the held-out 10% at 1x-16x, full windows and a sliding window of stride 256
(eval_ppl.py); PLATEAU_RULE on its log.

Rows merge in docs/sweep-passkey.json and docs/sweep-lm.json (per variant and seed), each with the
settings of its half (several processes may share them): a row there is not run again (delete it to redo it), but
an LM row at another S than asked is trained at that S and replaced; a checkpoint at its budget is reused, an
unfinished one resumed, a cut-short passkey scoring goes on. results.md's top part is rewritten, its hand-written
part (from "## Reading" on) kept.
"""

import argparse
import itertools
import json
import os
import pathlib
import shutil
import time

import numpy as np
import torch

from checkpoint import checkpoint_digest, load_checkpoint, read_checkpoint
from configurator import InputError, positive_int, run_script, write_atomic, write_json
import train
from data.shakespeare import load_text, prepare
from eval_ppl import evaluate_ppl
from evaluate import accuracy_table, format_table, write_results
from passkey import run_passkey
from plots import plot_lines

VARIANTS = [("nope", False), ("nope", True), ("sinusoidal", False), ("learned", False), ("rope", False),
            ("rope", True), ("alibi", False), ("alibi", True), ("bam", False), ("bam", True), ("tapa", False),
            ("fire", False)]
LR_FACTOR = {"tapa": 0.2}  # TAPA trains at 1/5 of the learning rate (the TAPA paper's ratio to its RoPE baseline)
ROOT = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE_LOCAL = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")
DEMO = train.demo_config()
PLATEAU_TAIL, PLATEAU_TOL, PLATEAU_EVALS = 0.25, 0.02, 3  # the LM half's plateau (below)
PLATEAU_RULE = ("the mean val loss of the last 3 evaluations is less than 2% below the mean of the 3 ending at "
                "0.75·S (the last quarter gained < 2%, the cosine's annealing included) and within 2% of the lowest "
                "such mean in the log (not overfitting); means of 3, since one evaluation (20 random batches) "
                "varies by ~2%; on the mean over seeds of each evaluation (a variant's seeds at one S), since one "
                "seed's drop still varies by ~1 point")
# lm_iters, S = 3,000 (12M tokens, ~11 passes over the 1M training bytes). A probe at one thread sharing 2 busy cores
# (rope and bam+ssmax, this recipe with a cosine to 3,000, 280 steps each, 2026-12-02): val loss 2.31 / 2.11 / 1.99 /
# 1.89 (rope) and 2.33 / 2.17 / 2.03 / 1.93 (bam+ssmax) at steps 80 / 120 / 200 / 280, still 1.5-2% lower every 40.
# A power law fitted to rope's (1.65 + 20.8·t^-0.79) puts the drop from 0.75·S to S at 0.6% for S = 3,000. Measured
# at 3,000 (2026-12-03): rope, alibi, bam and bam+ssmax flat or a little past their lowest (-0.9% to +0.2% over the
# last quarter), NoPE and NoPE + SSMax still falling (4.5%, 4.6%; val loss 2.01, 1.87 against ~1.5). LM_ITERS
# gives a variant that needs it a larger S, with its cosine; its row says its S. TAPA (at lr/5) was still falling
# too (3.3%, val loss 1.91). Cost: ~2.5-2.9 it/s on 2 threads alone, ~20 minutes a variant at 3,000.
# At 6,000 (2026-12-04) NoPE and NoPE + SSMax were still falling (2.6%, 3.3%; val loss 1.82, 1.73): 12,000.
# TAPA at 6,000: 2.5% (val loss 1.68): 12,000. NoPE at 12,000: 2.00%, on the rule's line (val loss 1.76).
# At 3,000 with three seeds (2026-12-07): sinusoidal 2.5% (1.9% on seeds 1337 and 1), learned 2.1% (1.7%): 6,000.
# Sinusoidal at 6,000 (seed 1337) overfits: its val loss goes no lower than at 3,000 (lowest mean of 3: 1.555 at
# step 4,500, against 1.560 at the end of its 3,000-step run) and then rises to 1.613 (train loss 1.05): 3,000 is
# its plateau, and it stays there (docs/results.md, "The language-model half"). Learned at 6,000 (seed 1337) the
# same: lowest mean of 3 1.524 (step 3,300), against 1.500 at the end of its 3,000-step run; 1.562 at 6,000.
LM_ITERS = {"nope": 12000, "nope+ssmax": 12000, "tapa": 12000}  # a guess that the plateau rule checks
# PASSKEY_BUDGET, the passkey half's steps for every variant. At the demo's 2,300 (2,000 + the 300 of the last
# phase; docs/lab-notes.md, "The sweep at the demo's 2,300 steps") the copy of RoPE (val loss 0.057 at 2,000), NoPE +
# SSMax (0.081) and TAPA at lr/5 (0.137) had not formed; the copy is at val loss ~0.041. At 4,000 (2026-12-04,
# seed 1337 of five variants; docs/lab-notes.md, "The sweep at 4,000 steps") TAPA's had not either (val loss 0.077
# at step 3,700, 25% at 1x), and in the first sweep (lr 1e-3, no last phase; docs/lab-notes.md) TAPA's at lr/5 formed by ~6,000. So every
# variant gets 6,000 (the rule: the budget the slowest copy needs, for all).
PASSKEY_BUDGET = 6000
PASSKEY_KEYS = ("seeds", "passkey_iters", "phase_iters", "passkey_lengths", "depths", "samples", "model")
LM_KEYS = ("seeds", "lm_lr", "lm_block", "stride", "ppl_lengths", "ppl_tokens", "model")  # each half's (S: per row)
FULL = dict(seeds=[1337, 1, 2], passkey_iters=PASSKEY_BUDGET, phase_iters=DEMO["max_iters"] - DEMO["phase_from"],
            passkey_lengths=[1, 2, 4, 8, 16, 32, 64], depths=5, samples=4,
            lm_iters=3000, lm_lr=1e-3, lm_block=256, stride=256, ppl_lengths=[1, 2, 4, 8, 16], ppl_tokens=16384,
            model=[])  # the CPU demo's model
QUICK = dict(seeds=[1337, 1], passkey_iters=4, phase_iters=2, passkey_lengths=[1, 2], depths=2, samples=1,
             lm_iters=4, lm_lr=1e-3, lm_block=64, stride=32, ppl_lengths=[1, 2], ppl_tokens=256,
             model=["--n_layer=1", "--n_embd=32", "--n_head=2", "--batch_size=2", "--eval_iters=1"])


def name_of(pos, ssmax):
    return f"{pos}+ssmax" if ssmax else pos


def train_run(argv, out_dir):
    """train.py with config/cpu_demo.py and argv (--key=value) in out_dir: a run there that has reached max_iters is
    reused, an unfinished one (or one stopped at a smaller max_iters) resumed. Returns (model, checkpoint, minutes).
    Raises InputError if out_dir holds a run of other settings, or one past max_iters."""
    cfg = train.demo_config(argv + [f"--out_dir={out_dir}"])
    path, t0 = os.path.join(out_dir, "ckpt.pt"), time.time()
    if os.path.isfile(path):
        saved = read_checkpoint(path, mmap=True)
        other = [f"{k}={saved['config'][k]!r}" for k in cfg if k in saved["config"] and saved["config"][k] != cfg[k]
                 and k not in ("out_dir", "init_from", "vocab_size", "max_iters")]
        if saved["iter_num"] > cfg["max_iters"]:
            other.append(f"iteration {saved['iter_num']} > max_iters={cfg['max_iters']}")
        if other:
            raise InputError(f"{out_dir} holds a run of other settings ({', '.join(other)}): delete it or use "
                             f"another --out_dir")
        cfg["init_from"] = "resume"  # at max_iters already: train() says so and trains nothing
    train.train(cfg)
    return load_checkpoint(path) + ((time.time() - t0) / 60,)


def shakespeare_dir(out, text_path=None):
    """The folder `out` with tiny Shakespeare prepared (byte tokenizer) if it is not there yet:
    from text_path, else ../shared (offline), else the public URL (raises naming --input when offline)."""
    if not os.path.isfile(os.path.join(out, "val.bin")):
        path = text_path or (SHAKESPEARE_LOCAL if os.path.isfile(SHAKESPEARE_LOCAL) else None)
        prepare(load_text(path, cache=os.path.join(out, "input.txt")), "byte", out)
    return out


def score_passkey(model, out, meta, setting):
    """Passkey at every length of setting on model, written to out/passkey.json (a cut-short scoring there goes on,
    one of other settings is scored again); returns the accuracy per length (fractions) and the minutes."""
    block_size, path, t0 = model.config.block_size, os.path.join(out, "passkey.json"), time.time()
    lengths = [m * block_size for m in setting["passkey_lengths"]]
    meta = dict(meta, block_size=block_size, settings=dict(ckpt_sha256=checkpoint_digest(os.path.join(
        out, "ckpt.pt")), lengths=lengths, depths=setting["depths"], samples=setting["samples"]))
    earlier = json.load(open(path)) if os.path.isfile(path) else dict(meta={})
    done = earlier["results"] if earlier["meta"].get("settings") == meta["settings"] else []  # not scored again
    results = run_passkey(model, "byte", lengths, setting["depths"], setting["samples"], seed=0, done=done,
                          save=lambda r: write_results(r, path, meta, finished=False))
    write_results(results, path, meta)
    print(format_table(results, block_size))
    return [accuracy_table(results)[1][L] for L in lengths], (time.time() - t0) / 60


def passkey_row(pos, ssmax, seed, setting, args):
    """Train (or reuse) one variant at one seed to the step where its last phase begins (out/pre-phase), score it;
    go on from a copy of that run to the budget (out), score it again; returns its row of the sweep."""
    name, lr, n, tail = name_of(pos, ssmax), LR_FACTOR.get(pos, 1.0), setting["passkey_iters"], setting["phase_iters"]
    out = os.path.join(args.out_dir, f"passkey-{name}-s{seed}")
    pre = os.path.join(out, "pre-phase")
    argv = [f"--pos={pos}", f"--ssmax={ssmax}", f"--seed={seed}"] + setting["model"] + [
        f"--lr_decay_iters={n - tail}", f"--phase_from={None if pos == 'learned' else n - tail}",
        f"--learning_rate={DEMO['learning_rate'] * lr}", f"--phase_lr={DEMO['phase_lr'] * lr}"]
    meta = dict(pos=pos, ssmax=ssmax, seed=seed, title=f"passkey accuracy (%), {name}, seed {seed}")
    model, ckpt, t_pre = train_run(argv + [f"--max_iters={n - tail}"], pre)
    acc_pre, e_pre = score_passkey(model, pre, dict(meta, title=meta["title"] + f", step {n - tail}"), setting)
    if not os.path.isfile(os.path.join(out, "ckpt.pt")):  # the run goes on from here (log.txt: its first part)
        for f in ("ckpt.pt", "log.txt"):
            shutil.copy(os.path.join(pre, f), os.path.join(out, f))
    val_pre = ckpt["history"][-1][2]
    model, ckpt, t_train = train_run(argv + [f"--max_iters={n}"], out)
    acc, e = score_passkey(model, out, meta, setting)
    prior = {k: [row and [round(x, 3) for x in row] for row in v] for k, v in model.prior_state().items()}
    return dict(passkey=acc, passkey_pre=acc_pre, prior=prior, block_size=model.config.block_size,
                lr=DEMO["learning_rate"] * lr, val_loss=ckpt["history"][-1][2], val_loss_pre=val_pre,
                minutes=dict(train=t_pre + t_train, eval=e_pre + e), threads=torch.get_num_threads())


def seed_mean_val(runs):
    """The variant's evaluations for the plateau rule: {S: [iteration, mean over the seeds at S of its val loss]}
    (runs: LM rows, each with its S as "iters" and its evaluations as "val"). Raises ValueError if two seeds at one
    S were evaluated at other iterations."""
    by_S = {}
    for r in runs:
        by_S.setdefault(r["iters"], []).append(r["val"])
    for S, vals in by_S.items():
        if len({tuple(it for it, _ in v) for v in vals}) > 1:
            raise ValueError(f"the seeds at S={S} were evaluated at other iterations: run them again alike")
    return {S: [[v[0][i][0], float(np.mean([x[i][1] for x in v]))] for i in range(len(v[0]))]
            for S, v in sorted(by_S.items())}


def plateau(val):
    """PLATEAU_RULE on a run's evaluations (val: [iteration, val loss] rows, the last at S). Returns (drop, ok);
    drop = (mean of the PLATEAU_EVALS evaluations ending at (1 - PLATEAU_TAIL)·S − mean of the last ones) / the
    latter (fewer evaluations than that: the mean of those there are)."""
    S, losses = val[-1][0], [v for _, v in val]
    mean = lambda i: np.mean(losses[max(0, i + 1 - PLATEAU_EVALS):i + 1])  # the evaluations ending at index i
    before = max(i for i, (it, _) in enumerate(val) if it <= (1 - PLATEAU_TAIL) * S)
    last = mean(len(val) - 1)
    drop = float((mean(before) - last) / last)
    return drop, bool(drop < PLATEAU_TOL and last <= (1 + PLATEAU_TOL) * min(map(mean, range(len(val)))))


def lm_row(pos, ssmax, seed, S, setting, args):
    """Train (or reuse) one variant at one seed S steps on tiny Shakespeare (out_dir/lm-<name>-s<seed>-<S>), then
    perplexity at every length in both modes; its row."""
    name, lr = name_of(pos, ssmax), setting["lm_lr"] * LR_FACTOR.get(pos, 1.0)
    data_dir = shakespeare_dir(os.path.join(args.out_dir if args.quick else os.path.join(ROOT, "data"),
                                            "shakespeare_byte"), args.input)
    model, ckpt, t_train = train_run(
        [f"--pos={pos}", f"--ssmax={ssmax}", f"--seed={seed}"] + setting["model"] +
        [f"--dataset={data_dir}", "--phase_from=None", f"--block_size={setting['lm_block']}", "--batch_size=16",
         f"--learning_rate={lr}", f"--max_iters={S}", f"--lr_decay_iters={S}", f"--eval_interval={max(1, S // 20)}"],
        os.path.join(args.out_dir, f"lm-{name}-s{seed}-{S}"))
    val, t0 = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r"), time.time()
    ppl = dict(full=[], sliding=[])
    for m in setting["ppl_lengths"]:
        L = m * model.config.block_size
        for mode, stride in (("full", L), ("sliding", min(setting["stride"], L))):
            ppl[mode].append(None if L > model.max_length else  # learned positions stop at block_size (SPEC §4)
                             evaluate_ppl(model, val, L, stride, max(1, setting["ppl_tokens"] // stride))[1])
    return dict(iters=S, ppl_full=ppl["full"], ppl_sliding=ppl["sliding"],
                val=[[it, v] for it, _, v in ckpt["history"]], block_size=model.config.block_size, lr=lr,
                minutes=dict(train=t_train, eval=(time.time() - t0) / 60), threads=torch.get_num_threads())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a reduced sweep for the tests (tiny models, 1x-2x, 2 seeds)")
    p.add_argument("--only", default=None, help="comma-separated variant names (e.g. bam+ssmax,alibi); default all")
    p.add_argument("--seeds", default=None, help="comma-separated seeds, both halves (default 1337,1,2)")
    p.add_argument("--half", choices=["both", "passkey", "lm"], default="both", help="which half to run")
    p.add_argument("--passkey_iters", type=positive_int,
                   help=f"every variant's passkey budget (default {PASSKEY_BUDGET:,})")
    p.add_argument("--lm_iters", type=positive_int, help=f"the LM half's steps S, every variant's (default "
                   f"{FULL['lm_iters']:,}; " + ", ".join(f"{k} {v:,}" for k, v in LM_ITERS.items()) + ": LM_ITERS)")
    p.add_argument("--out_dir", default=os.path.join(ROOT, "out-sweep"), help="checkpoints and raw results")
    p.add_argument("--input", default=None, help="a local tinyshakespeare.txt (default: ../shared, else download)")
    p.add_argument("--docs", default=None, help="results.md, sweep-passkey.json, sweep-lm.json, plots "
                   "(default docs/; --quick: out_dir)")
    p.add_argument("--docs_only", action="store_true", help="train nothing: write the docs from the JSON files")
    args = p.parse_args(argv)
    setting = dict(QUICK if args.quick else FULL)
    setting.update({k: getattr(args, k) for k in ("passkey_iters", "lm_iters") if getattr(args, k)})
    if setting["passkey_iters"] <= setting["phase_iters"]:
        raise InputError(f"--passkey_iters={setting['passkey_iters']} leaves no steps before the last phase's "
                         f"{setting['phase_iters']}: use more (the demo's: {DEMO['max_iters']})")
    seeds = (args.seeds or ",".join(map(str, setting["seeds"]))).split(",")
    if not all(s.strip().lstrip("-").isdigit() for s in seeds) or len(set(map(int, seeds))) < len(seeds):
        raise InputError(f"bad --seeds={args.seeds!r}: give distinct integers, comma-separated, e.g. --seeds=1337,1,2")
    seeds = [int(s) for s in seeds]
    names = [name_of(*v) for v in VARIANTS]
    only = names if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InputError(f"unknown variant(s) {', '.join(unknown)} in --only; valid: {', '.join(names)}")
    docs = args.docs or (args.out_dir if args.quick else os.path.join(ROOT, "docs"))
    halves = [h for h in ("passkey", "lm") if args.half in (h, "both")]
    paths = {h: os.path.join(docs, f"sweep-{h}.json") for h in ("passkey", "lm")}  # the rows, beside results.md
    data = dict(passkey=dict(setting={k: setting[k] for k in PASSKEY_KEYS}, variants={}),
                lm=dict(setting={k: setting[k] for k in LM_KEYS}, variants={}))
    for half, path in paths.items():  # the rows of earlier calls stay in the tables
        if os.path.isfile(path):
            with open(path) as f:
                data[half] = json.load(f)
            other = [f"{k}={v!r} (now {setting.get(k)!r})" for k, v in data[half]["setting"].items()
                     if v != setting.get(k)]
            if other and half in halves and not args.docs_only:  # --docs_only: each file's own settings
                raise InputError(f"{path} holds a sweep of other settings: {', '.join(other)}; call with those, or "
                                 f"write elsewhere (--docs=DIR --out_dir=DIR)")
    if args.docs_only and not any(map(os.path.isfile, paths.values())):
        raise InputError(f"no {' or '.join(paths.values())} to write the docs from: run the sweep first (or pass "
                         f"--docs=DIR)")
    longer = {} if args.quick else LM_ITERS  # S per variant; --lm_iters: every variant's
    lm_iters = {name_of(*v): args.lm_iters or longer.get(name_of(*v), setting["lm_iters"]) for v in VARIANTS}
    for folder in (docs, args.out_dir):
        os.makedirs(folder, exist_ok=True)
    chosen = [v for v in VARIANTS if name_of(*v) in only and not args.docs_only]
    for (pos, ssmax), half, seed in itertools.product(chosen, halves, seeds):
        name = name_of(pos, ssmax)
        row = data[half]["variants"].get(name, {}).get(str(seed))
        if row and (half == "passkey" or row["iters"] == lm_iters[name]):
            print(f"{name}, seed {seed}: in {paths[half]} already (delete its row to run it again)")
            continue
        if row:  # an LM row at another S (a variant that needed more steps): trained at S, replaced
            print(f"{name}, seed {seed}: in {paths['lm']} at {row['iters']:,} steps, now {lm_iters[name]:,}: trained "
                  f"again (its row stays until then)")
        add_row(paths[half], data[half], name, str(seed), passkey_row(pos, ssmax, seed, setting, args)
                if half == "passkey" else lm_row(pos, ssmax, seed, lm_iters[name], setting, args))
    write_docs(data["passkey"], data["lm"], docs, args)


def add_row(path, data, name, seed, row):
    """data["variants"][name][seed] = row, written to the JSON at path, re-read first: rows that another sweep.py
    process (another --only) wrote there meanwhile stay."""
    if os.path.isfile(path):
        with open(path) as f:
            data["variants"] = json.load(f)["variants"]
    data["variants"].setdefault(name, {})[seed] = row
    write_json(path, data)


def spread(values):
    """(mean, lowest, highest, count) of the values that are not None (one per seed); count 0 if none is."""
    xs = [v for v in values if v is not None]
    return (sum(xs) / len(xs), min(xs), max(xs), len(xs)) if xs else (None, None, None, 0)


def at_plateau(runs):
    """Whether a variant's LM rows (its seeds) pass PLATEAU_RULE: on the mean over seeds, at each S it has."""
    return all(plateau(val)[1] for val in seed_mean_val(runs).values())


def drop_text(runs):
    """A variant's last-quarter drop for the tables: the mean curve's, in % ("1.5% (0.2 to 2.6)": the seeds' own);
    one per S, joined by "; " if its seeds ran at several."""
    runs, parts = list(runs), []
    for S, val in seed_mean_val(runs).items():
        drops = [100 * plateau(r["val"])[0] for r in runs if r["iters"] == S]
        parts.append(f"{100 * plateau(val)[0]:.1f}%" +
                     (f" ({min(drops):.1f} to {max(drops):.1f})" if len(drops) > 1 else ""))
    return "; ".join(parts)


def ppl_text(x):
    """A perplexity to 2 decimals (3.2e+04 past 10,000); "n/a" for None."""
    return "n/a" if x is None else (f"{x:.2f}" if x < 1e4 else f"{x:.2e}")


def cell(values, n_seeds, percent=True):
    """A table cell of one value per seed (accuracies in [0, 1], or perplexities if not percent): the mean and the
    range, "97% (90–100)", "4.11 (4.05–4.20)"; no range if every seed's value prints the same ("100%"); the count
    if not n_seeds seeds ("100% (1 seed)", "95% (90–100, 2 seeds)"); "n/a" if no seed scored it."""
    mean, lo, hi, n = spread(values)
    if n == 0:
        return "n/a"
    text = (lambda x: f"{100 * x:.0f}") if percent else ppl_text
    notes = [f"{text(lo)}–{text(hi)}"] * (text(lo) != text(hi)) + [f"{n} seed{'s' * (n > 1)}"] * (n != n_seeds)
    return text(mean) + "%" * percent + (f" ({', '.join(notes)})" if notes else "")


def seeds_text(rows, planned):
    """The seeds of a half ({variant: {seed: row}}): "1337, 1, 2" if they are the planned ones, else "1337, 1, 2
    planned; rows so far: 1337"."""
    have = [s for s in dict.fromkeys(str(x) for x in planned) if any(s in r for r in rows.values())]
    have += sorted({s for r in rows.values() for s in r} - set(have))  # seeds run with --seeds beyond the plan
    text = ", ".join(map(str, planned))
    return text if have == [str(x) for x in planned] else f"{text} planned; rows so far: {', '.join(have) or 'none'}"


def markdown_table(table, columns):
    """{row name: cells} under the header "variant" + columns, as a markdown table."""
    return (f"| variant | {' | '.join(columns)} |\n|---|" + "---|" * len(columns) + "\n" +
            "".join(f"| {name} | " + " | ".join(cells) + " |\n" for name, cells in table.items()))


def write_docs(pk_data, lm_data, docs, args):
    """results.md (tables, plots, times; its hand-written part from "## Reading" on is kept) and the PNGs, from the
    passkey half's and the LM half's {setting, variants} (sweep-passkey.json, sweep-lm.json: {variant: {seed: row}}).
    results.md is written whole or not at all (write_atomic)."""
    order = [name_of(*v) for v in VARIANTS]
    pk, lm = ({n: d["variants"][n] for n in order if d["variants"].get(n)} for d in (pk_data, lm_data))
    ps, ls, bs = pk_data["setting"], lm_data["setting"], DEMO["block_size"]
    lengths, tail = ps["passkey_lengths"], ps["phase_iters"]
    per_seed = lambda rows, key, n: {v: [[r[key][i] for r in s.values() if key in r] for i in range(n)]
                                     for v, s in rows.items()}  # {variant: [[each seed's value] per length]}
    scored, scored_pre = per_seed(pk, "passkey", len(lengths)), per_seed(pk, "passkey_pre", len(lengths))
    ppl = {mode: per_seed(lm, f"ppl_{mode}", len(ls["ppl_lengths"])) for mode in ("full", "sliding")}
    if pk:
        plot_lines(scored, lengths, "passkey accuracy (band: seeds' range)", os.path.join(docs, "passkey.png"))
    for mode in ("full", "sliding") if lm else ():
        plot_lines(ppl[mode], ls["ppl_lengths"], f"perplexity (bytes, {mode}; band: seeds' range)",
                   os.path.join(docs, f"ppl-{mode}.png"), logy=True)
    # heatmaps (of a variant's first seed): bam+ssmax and the baseline with the best mean accuracy from 8x on
    far = [i for i, m in enumerate(lengths) if m >= 8] or [0]
    score = {n: np.mean([spread(v[i])[0] or 0 for i in far]) for n, v in scored.items()}
    baselines = [n for n in score if not n.startswith("bam")]
    heatmaps = [n for n in ("bam+ssmax", max(baselines, key=score.get) if baselines else None) if n in pk]
    for n, png in [(n, "heatmap") for n in heatmaps] + [(n, "priors") for n in ("bam", "bam+ssmax") if n in pk]:
        src = os.path.join(args.out_dir, f"passkey-{n}-s{next(iter(pk[n]))}",
                           "passkey.png" if png == "heatmap" else "priors.png")
        if os.path.isfile(src):  # from this machine's runs; rows of earlier runs keep their copies in docs
            shutil.copy(src, os.path.join(docs, f"{png}-{n}.png"))
    path = os.path.join(docs, "results.md")
    text = open(path).read() if os.path.isfile(path) else ""
    reading = text[text.index("## Reading"):] if "## Reading" in text else ""
    minutes = lambda rs: " + ".join(f"{np.mean([r['minutes'][k] for r in rs]):.1f}" for k in ("train", "eval")) if rs \
        else "-"
    val_loss = lambda s, key: f"{np.mean([r[key] for r in s.values()]):.3f}" if all(key in r for r in s.values()) \
        else "-"
    label = lambda n: n + " (no last phase)" * (n == "learned")
    out = [f"# Results: every variant at the demo's recipe\n\nMade by `python sweep.py{' --quick' * args.quick}` "
           f"(in parts: `--only`, `--seeds`, `--half`), last written {time.strftime('%Y-%m-%d')}; the rows are in "
           f"sweep-passkey.json and sweep-lm.json. The models are the CPU demo's (`config/cpu_demo.py`), TAPA "
           f"at 1/5 of its learning rates (its paper's ratio to RoPE).\n\n## Passkey retrieval (teacher-forced, "
           f"{ps['depths']} depths x {ps['samples']} samples per length; training length {bs} bytes)\n\n"
           f"Budget: {ps['passkey_iters']:,} steps for every variant (`--passkey_iters`), the last {tail} on "
           f"prompts of {bs}-{DEMO['phase_train_block_size']:,} bytes, the cosine ending where they begin; seeds "
           f"{seeds_text(pk, ps['seeds'])}. A cell: the mean over seeds (their range; none if every seed "
           f"scored the same; the count if fewer than the row's seeds). learned: no last phase (`--phase_from=None`: "
           f"no positions past {bs}), n/a past 1x. Val loss: the run's last evaluation, mean over seeds "
           f"(before the last phase on {bs}-byte prompts, at the end on the phase's).\n\n"]
    if not pk:
        out.append("No rows yet at this budget.\n\n")
    for title, table, key in [(None, scored, "val_loss"), (f"### Before the last phase (step "
                              f"{ps['passkey_iters'] - tail:,}), the same runs\n\n", scored_pre, "val_loss_pre")]:
        rows = {n: v for n, v in table.items() if any(v)}
        if rows:
            out.append((title or "") + markdown_table({label(n): [", ".join(s for s, r in pk[n].items() if key in r)]
                                                       + [cell(v, len(pk[n])) for v in rows[n]] + [val_loss(pk[n], key)]
                                                       for n in rows},
                                                      ["seeds"] + [f"{x}x" for x in lengths] + ["val loss"]))
            out.append("\n![passkey accuracy against length](passkey.png)\n\n" * (title is None) + "".join(
                f"![passkey heatmap, {n} (seed {next(iter(pk[n]))})](heatmap-{n}.png)\n" for n in heatmaps
                if title is None) + "\n")
    out.append(f"## Perplexity on held-out tiny Shakespeare (bytes; seeds {seeds_text(lm, ls['seeds'])})\n\n"
               f"S steps (`--lm_iters`; lr {ls['lm_lr']:g}, TAPA 1/5 of it; {ls['lm_block']}-byte windows, 16 a "
               f"batch, the cosine to S), evaluated every S/20. A cell: the mean over the seeds of its row (their "
               f"range; none if every seed's prints the same), {ls['ppl_tokens']:,} scored tokens per length. Full "
               f"windows, and a sliding window of stride {ls['stride']} (only the last {ls['stride']} targets of a "
               f"window scored; at 1x the same as full). Val loss at S: the mean of the last {PLATEAU_EVALS} "
               f"evaluations, mean over seeds; last-quarter drop and plateau: on the mean over seeds of each "
               f"evaluation (the seeds' own drops in brackets). "
               f"Plateau: {PLATEAU_RULE}.\n\n")
    summary = lambda runs: [", ".join(f"{S:,}" for S in sorted({r["iters"] for r in runs})),
                            f"{np.mean([np.mean([v for _, v in r['val'][-PLATEAU_EVALS:]]) for r in runs]):.3f}",
                            drop_text(runs), "yes" if at_plateau(runs) else "**no**"]
    for mode, title, extra in (("full", "Full windows", ["S", "val loss at S", "last-quarter drop", "plateau"]),
                               ("sliding", f"Sliding window, stride {ls['stride']}", [])):
        out.append(f"### {title}\n\n" + (markdown_table(
            {n: [", ".join(lm[n])] + [cell(v, len(lm[n]), percent=False) for v in ppl[mode][n]] +
             (summary(lm[n].values()) if extra else []) for n in lm},
            ["seeds"] + [f"{x}x" for x in ls["ppl_lengths"]] + extra) if lm else "No rows yet.\n") + "\n")
    out.append("![perplexity, full windows](ppl-full.png)\n![perplexity, sliding window](ppl-sliding.png)\n\n"
               "## Learned positional parameters (passkey models)\n\n")
    out.append("".join(f"- {n}, seed {seed}, {train.PRIOR_NAMES[key]}: " + "; ".join(
        f"layer {i}: {v}" for i, v in enumerate(per_layer) if v is not None) + "\n"
        for n, s in pk.items() for seed, r in s.items() for key, per_layer in r["prior"].items()) or "No rows yet.\n")
    out.append("".join(f"\n![learned prior, {n}](priors-{n}.png)\n" for n in ("bam", "bam+ssmax")
                       if os.path.isfile(os.path.join(docs, f"priors-{n}.png"))))
    runs = [r for half in (pk, lm) for s in half.values() for r in s.values()]  # every row, both halves
    threads = sorted({r["threads"] for r in runs})
    out.append("\n## Wall times (minutes; a reused or resumed run counts its last call)\n\n"
               f"Passkey training + evaluation (mean over seeds; both scorings); LM training + evaluation (mean over "
               f"seeds). Torch threads a job: {', '.join(map(str, threads))}.\n\n")
    out.append("".join(f"- {n}: {minutes(list(pk.get(n, {}).values()))}; {minutes(list(lm.get(n, {}).values()))}\n"
                       for n in order if n in pk or n in lm))
    out.append(f"- total: {sum(sum(r['minutes'].values()) for r in runs):.0f} minutes\n\n{reading}")
    write_atomic(path, lambda tmp: pathlib.Path(tmp).write_text("".join(out)))
    print(f"wrote {path}")


if __name__ == "__main__":
    run_script(main)
