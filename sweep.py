"""
The papers' comparison at CPU scale (SPEC §7): every positional variant trained
the same way, then passkey retrieval and perplexity against context length.

    python sweep.py                       # the full sweep on 2 CPU cores, writes docs/results.md and docs/*.png
    python sweep.py --only=bam+ssmax,alibi  # some variants; the tables keep the others' earlier results
    python sweep.py --quick               # a reduced version (minutes), for the tests; writes to --out_dir only
    python sweep.py --docs_only           # rewrite results.md and the plots from docs/sweep.json

For each variant: (1) train the CPU demo as it was when the committed sweep ran (config/cpu_demo.py under
SWEEP_SETTINGS: learning rate 1e-3, no last phase; 2,000 steps), resume it to 4,000 steps with the cosine stretched to 4,000 (at
2,000 NoPE, sinusoidal and TAPA have not learned the copy yet), and run passkey.py's
evaluation at 1x..64x its block_size, 20 prompts per length at evenly spaced depths; (2) train the same-sized
model on tiny Shakespeare (byte tokenizer) and measure perplexity on the held-out 10%
at 1x..16x. Same seed, data, steps and size for every variant; TAPA at a 5x lower
learning rate, the ratio to RoPE its paper used. Finished trainings are reused when
the sweep is run again, and results.md keeps its hand-written part (from "## Reading" on).
"""

import argparse
import json
import os
import shutil
import time

import numpy as np
import torch

from configurator import InputError, run_script
import train
from data.shakespeare import load_text, prepare
from eval_ppl import evaluate_ppl
from model import load_checkpoint
from plots import plot_lines
from passkey import format_table, run_passkey, write_results

VARIANTS = [("nope", False), ("nope", True), ("sinusoidal", False), ("learned", False), ("rope", False),
            ("rope", True), ("alibi", False), ("alibi", True), ("bam", False), ("bam", True), ("tapa", False),
            ("fire", False)]
# The committed sweep (docs/results.md) ran on the CPU demo before its current recipe (lr 5e-4, layer 1's shapes up
# to 2/3, a last phase on longer prompts): these settings keep it reproducible. The current recipe against the main
# baselines: docs/results.md, "The demo's recipe against the baselines".
SWEEP_SETTINGS = ["--learning_rate=1e-3", "--bam_shape_init=[1,[0,0.3333333333333333,0.5,1]]", "--phase_from=None",
                  "--ssmax_max_n=None"]
# per-variant settings: TAPA trains at 1/5 of the learning rate (the TAPA paper's ratio to its RoPE baseline)
LR_FACTOR = {"tapa": 0.2}
ROOT = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE_LOCAL = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")

# passkey_iters: the passkey model trains to the first count, then is resumed to each next one with the
# cosine stretched to it (a warm restart); the first stage is the CPU demo under SWEEP_SETTINGS
FULL = dict(passkey_iters=[2000, 4000], passkey_lengths=[1, 2, 4, 8, 16, 32, 64], depths=5, samples=4,
            shakespeare_iters=300, ppl_lengths=[1, 2, 4, 8, 16], ppl_tokens=16384,
            model=[])  # the CPU demo's model
QUICK = dict(passkey_iters=[2, 4], passkey_lengths=[1, 2], depths=2, samples=1,
             shakespeare_iters=4, ppl_lengths=[1, 2], ppl_tokens=1024,
             model=["--n_layer=1", "--n_embd=32", "--n_head=2", "--batch_size=2", "--eval_iters=1"])


def name_of(pos, ssmax):
    return f"{pos}+ssmax" if ssmax else pos


def train_variant(args, out_dir):
    """train.py with config/cpu_demo.py, SWEEP_SETTINGS and these --key=value args; a run in out_dir is resumed to max_iters,
    or reused if it has got that far."""
    cfg = train.demo_config(SWEEP_SETTINGS + args + [f"--out_dir={out_dir}"])
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    if os.path.isfile(ckpt_path) and torch.load(ckpt_path, weights_only=True)["iter_num"] >= cfg["max_iters"]:
        print(f"reusing {ckpt_path}")
    else:
        if os.path.isfile(ckpt_path):
            cfg["init_from"] = "resume"
        train.train(cfg)
    model, _ = load_checkpoint(ckpt_path)
    return model


def shakespeare_dir(out, text_path=None):
    """The folder `out` with tiny Shakespeare prepared (byte tokenizer) if it is not there yet:
    from text_path, else ../shared (offline), else the public URL (raises naming --input when offline)."""
    if not os.path.isfile(os.path.join(out, "val.bin")):
        path = text_path or (SHAKESPEARE_LOCAL if os.path.isfile(SHAKESPEARE_LOCAL) else None)
        prepare(load_text(path, cache=os.path.join(out, "input.txt")), "byte", out)
    return out


def fmt(x, kind):
    if x is None:
        return "n/a"
    return f"{100 * x:.0f}%" if kind == "acc" else (f"{x:.2f}" if x < 1e4 else f"{x:.2e}")


def markdown_table(table, lengths, kind):
    head = "| variant | " + " | ".join(f"{x}x" for x in lengths) + " |\n|---|" + "---|" * len(lengths) + "\n"
    return head + "".join(f"| {name} | " + " | ".join(fmt(v, kind) for v in vals) + " |\n" for name, vals in table.items())


def evaluate_variant(pos, ssmax, setting, args):
    """Train and evaluate one variant; returns its row of the sweep (accuracies, perplexities, prior, times)."""
    name = name_of(pos, ssmax)
    common = [f"--pos={pos}", f"--ssmax={ssmax}"] + setting["model"]
    lr = train.demo_config(SWEEP_SETTINGS)["learning_rate"] * LR_FACTOR.get(pos, 1.0)
    t0 = time.time()
    # (1) passkey: train on the synthetic set, evaluate at 1x..64x
    out = os.path.join(args.out_dir, f"passkey-{name}")
    for n in setting["passkey_iters"]:  # FULL: the demo's 2,000 steps, then resumed to 4,000 (cosine stretched)
        model = train_variant(common + [f"--max_iters={n}", f"--lr_decay_iters={n}", f"--learning_rate={lr}"], out)
    t_train = time.time() - t0
    block_size = model.config.block_size
    lengths = [m * block_size for m in setting["passkey_lengths"]]
    results = run_passkey(model, "byte", lengths, setting["depths"], setting["samples"], seed=0)
    write_results(results, os.path.join(out, "passkey.json"),
                  dict(pos=pos, ssmax=ssmax, block_size=block_size, title=f"passkey accuracy (%), {name}"))
    print(format_table(results, block_size))
    accuracy = []
    for L in lengths:
        scored = [r["correct"] for r in results if r["length"] == L and r["correct"] is not None]
        accuracy.append(sum(scored) / len(scored) if scored else None)
    prior = {k: [row and [round(x, 3) for x in row] for row in v] for k, v in model.prior_state().items()}
    t_passkey = time.time() - t0
    # (2) perplexity: train on tiny Shakespeare, evaluate on its held-out 10%
    data_dir = shakespeare_dir(os.path.join(args.out_dir if args.quick else os.path.join(ROOT, "data"),
                                            "shakespeare_byte"), args.input)
    model = train_variant(common + [f"--dataset={data_dir}", f"--max_iters={setting['shakespeare_iters']}",
                                    f"--lr_decay_iters={setting['shakespeare_iters']}", "--eval_interval=100",
                                    f"--learning_rate={2 * lr}", "--block_size=256",
                                    "--batch_size=16", "--warmup_iters=30"],
                          os.path.join(args.out_dir, f"shakespeare-{name}"))
    val = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
    ppl = []
    for m in setting["ppl_lengths"]:
        L = m * model.config.block_size
        if L > model.max_length:
            ppl.append(None)  # learned positions stop at block_size (SPEC §4)
            continue
        ppl.append(evaluate_ppl(model, val, L, max_windows=max(1, setting["ppl_tokens"] // L))[1])
    return dict(passkey=accuracy, ppl=ppl, prior=prior, block_size=block_size, lr=lr,
                minutes=dict(passkey_train=t_train / 60, passkey_eval=(t_passkey - t_train) / 60,
                             shakespeare=(time.time() - t0 - t_passkey) / 60))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a reduced sweep for the tests (tiny models, 1x-2x)")
    p.add_argument("--only", default=None, help="comma-separated variant names (e.g. bam+ssmax,alibi); default all")
    p.add_argument("--out_dir", default=os.path.join(ROOT, "out-sweep"), help="checkpoints and raw results")
    p.add_argument("--input", default=None, help="a local tinyshakespeare.txt (default: ../shared, else download)")
    p.add_argument("--docs", default=None, help="where results.md and the plots go (default docs/, or out_dir with --quick)")
    p.add_argument("--docs_only", action="store_true",
                   help="train nothing: write the docs from the rows in <docs>/sweep.json")
    args = p.parse_args()
    setting = QUICK if args.quick else FULL
    docs = args.docs or (args.out_dir if args.quick else os.path.join(ROOT, "docs"))
    names = [name_of(*v) for v in VARIANTS]
    only = names if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InputError(f"unknown variant(s) {', '.join(unknown)} in --only; valid: {', '.join(names)}")
    os.makedirs(docs, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    sweep_json = os.path.join(docs, "sweep.json")  # the rows, committed beside results.md
    rows = {}
    if os.path.isfile(sweep_json):  # the variants of earlier runs stay in the tables
        with open(sweep_json) as f:
            rows = json.load(f)["variants"]
    for pos, ssmax in VARIANTS:
        name = name_of(pos, ssmax)
        if name in only and not args.docs_only:
            rows[name] = evaluate_variant(pos, ssmax, setting, args)
            print(f"{name}: passkey {rows[name]['passkey']}, ppl {rows[name]['ppl']}")
            with open(sweep_json, "w") as f:
                json.dump({"variants": rows, "setting": setting}, f, indent=1)
    write_docs(rows, setting, docs, args)


def write_docs(rows, setting, docs, args):
    """results.md (tables, plots, times; its hand-written part from "## Reading" on is kept) and the PNGs."""
    rows = {name_of(*v): rows[name_of(*v)] for v in VARIANTS if name_of(*v) in rows}  # in VARIANTS order
    passkey = {n: r["passkey"] for n, r in rows.items()}
    ppl = {n: r["ppl"] for n, r in rows.items()}
    plot_lines(passkey, setting["passkey_lengths"], "passkey accuracy", os.path.join(docs, "passkey.png"))
    plot_lines(ppl, setting["ppl_lengths"], "perplexity (byte level)", os.path.join(docs, "ppl.png"), logy=True)
    # heatmaps: bam+ssmax and the baseline with the best mean accuracy from 8x on
    far = [i for i, m in enumerate(setting["passkey_lengths"]) if m >= 8] or [0]
    score = {n: np.mean([a or 0 for a in (v[i] for i in far)]) for n, v in passkey.items()}
    baselines = [n for n in score if not n.startswith("bam")]
    heatmaps = [n for n in ("bam+ssmax", max(baselines, key=score.get) if baselines else None) if n in rows]
    for n in heatmaps:  # from this machine's runs; rows of earlier runs keep their copies in docs
        src = os.path.join(args.out_dir, f"passkey-{n}", "passkey.png")
        if os.path.isfile(src):
            shutil.copy(src, os.path.join(docs, f"heatmap-{n}.png"))
    for n in ("bam", "bam+ssmax"):
        src = os.path.join(args.out_dir, f"passkey-{n}", "priors.png")
        if n in rows and os.path.isfile(src):
            shutil.copy(src, os.path.join(docs, f"priors-{n}.png"))
    path = os.path.join(docs, "results.md")
    reading = ""
    if os.path.isfile(path):
        text = open(path).read()
        reading = text[text.index("## Reading"):] if "## Reading" in text else ""
    bs = next(iter(rows.values()))["block_size"]
    command = "python sweep.py" + (" --quick" if args.quick else "")
    stages = setting["passkey_iters"]
    with open(path, "w") as f:
        f.write(f"# Results: every variant at CPU scale\n\nMade by `{command}` (with `--only` for parts) on "
                f"{os.cpu_count()} CPU cores, last run {time.strftime('%Y-%m-%d')}; the models are the CPU demo's "
                f"(`config/cpu_demo.py`) under sweep.py's SWEEP_SETTINGS ({' '.join(SWEEP_SETTINGS)}: the demo "
                f"before its current recipe), TAPA at 1/5 of its learning rate. The passkey models are trained "
                f"{stages[0]:,} steps" + "".join(f", then resumed to {n:,}" for n in stages[1:]) +
                (" with the cosine stretched to the new end" if len(stages) > 1 else "") + ".\n\n")
        f.write(f"## Passkey retrieval (teacher-forced, {setting['depths']} depths x {setting['samples']} "
                f"samples per length; training length {bs} bytes)\n\n")
        f.write(markdown_table(passkey, setting["passkey_lengths"], "acc"))
        f.write("\n![passkey accuracy against length](passkey.png)\n\n")
        f.write("".join(f"![passkey heatmap, {n}](heatmap-{n}.png)\n" for n in heatmaps) + "\n")
        f.write(f"## Perplexity on held-out tiny Shakespeare (bytes; up to {setting['ppl_tokens']:,} tokens "
                f"per length)\n\n")
        f.write(markdown_table(ppl, setting["ppl_lengths"], "ppl"))
        f.write("\n![perplexity against length](ppl.png)\n\n## Learned positional parameters\n\n")
        for n, r in rows.items():
            for key, per_layer in r["prior"].items():
                f.write(f"- {n}, {train.PRIOR_NAMES[key]}: " +
                        "; ".join(f"layer {i}: {v}" for i, v in enumerate(per_layer) if v is not None) + "\n")
        f.write("".join(f"\n![learned prior, {n}](priors-{n}.png)\n" for n in ("bam", "bam+ssmax")
                        if os.path.isfile(os.path.join(docs, f"priors-{n}.png"))))
        f.write("\n## Wall times (minutes on 2 CPU cores: passkey training, passkey evaluation, tiny Shakespeare)\n\n")
        f.write("".join(f"- {n}: {r['minutes']['passkey_train']:.1f} + {r['minutes']['passkey_eval']:.1f} + "
                        f"{r['minutes']['shakespeare']:.1f}\n" for n, r in rows.items()))
        total = sum(sum(r["minutes"].values()) for r in rows.values())
        f.write(f"- total: {total:.0f} minutes\n\n{reading}")
    print(f"wrote {path}")


if __name__ == "__main__":
    run_script(main)
