"""
The papers' comparison at CPU scale (SPEC §7): every positional variant trained
the same way, then passkey retrieval and perplexity against context length.

    python sweep.py              # the full sweep on 2 CPU cores, writes docs/results.md and docs/*.png
    python sweep.py --quick      # a reduced version (minutes), for the tests; writes to --out_dir only

For each variant: (1) train a small model (config/cpu_demo.py with FULL's
overrides below: the demo as it was when docs/results.md was made) on the
synthetic passkey set and run passkey.py's evaluation at 1x..64x its block_size;
(2) train the same-sized model on tiny Shakespeare (byte tokenizer) and measure
perplexity on the held-out 10% at 1x..16x. Same seed, data, steps and size for
every variant. Finished trainings are reused when the sweep is run again.
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from configurator import run_script
import train
from data.shakespeare import load_text, prepare
from eval_ppl import evaluate_ppl
from model import load_checkpoint
from passkey import run_passkey

VARIANTS = [("nope", False), ("sinusoidal", False), ("learned", False), ("rope", False), ("alibi", False),
            ("bam", False), ("bam", True), ("tapa", False), ("rope", True)]
ROOT = os.path.dirname(os.path.abspath(__file__))
SHAKESPEARE_LOCAL = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")

FULL = dict(passkey_iters=250, passkey_lengths=[1, 2, 4, 8, 16, 32, 64], depths=3, samples=1,
            shakespeare_iters=200, ppl_lengths=[1, 2, 4, 8, 16], ppl_tokens=16384,
            # the data, model and optimizer docs/results.md was made with (the CPU demo of that time)
            model=["--dataset=passkey_byte_512", "--block_size=512", "--n_layer=4", "--n_embd=128",
                   "--learning_rate=3e-3", "--ssmax_init=1.0", "--weight_decay=0.1", "--beta2=0.99",
                   "--eval_interval=250"])
QUICK = dict(passkey_iters=4, passkey_lengths=[1, 2], depths=2, samples=1,
             shakespeare_iters=4, ppl_lengths=[1, 2], ppl_tokens=1024,
             model=["--n_layer=1", "--n_embd=32", "--n_head=2", "--batch_size=2", "--eval_iters=1"])


def name_of(pos, ssmax):
    return f"{pos}+ssmax" if ssmax else pos


def train_variant(args, out_dir):
    """train.py with config/cpu_demo.py and these --key=value args; reuses a finished run in out_dir."""
    defaults = {k: getattr(train, k) for k in train.CONFIG_KEYS}
    cfg = train.get_config([os.path.join(ROOT, "config", "cpu_demo.py")] + args + [f"--out_dir={out_dir}"], defaults)
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    if os.path.isfile(ckpt_path) and torch.load(ckpt_path, weights_only=True)["iter_num"] == cfg["max_iters"]:
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


def plot_lines(table, lengths, ylabel, path, logy=False):
    """One line per variant: table[name][i] against lengths (multiples of block_size), log-x. Saves a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in table.items():
        pts = [(x, y) for x, y in zip(lengths, values) if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name, ls="--" if "ssmax" in name else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{x}x" for x in lengths])
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("context length (multiple of the training length)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_priors(models, block_size, path):
    """The learned GGD-BAM penalties −b(d) = c·(d + ε)^β against distance d (log-log), one panel per BAM model, one line per head."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    d = torch.logspace(0, math.log10(64 * block_size), 200)
    for ax, (name, model) in zip(axes[0], models.items()):
        for layer, block in enumerate(model.transformer.h):
            p = block.attn.prior
            for h in range(len(p.shape)):
                penalty = torch.exp(p.log_scale[h]) * (d + 1e-5).pow(p.shape[h])
                ax.plot(d, penalty.detach(), color=f"C{layer}", alpha=0.8,
                        label=f"layer {layer}" if h == 0 else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axvline(block_size, color="k", lw=0.8, ls=":")
        ax.set_title(f"{name}: learned prior per head")
        ax.set_xlabel("distance i − j (tokens); dotted: training length")
        ax.set_ylabel("penalty −b(d) = c·(d + ε)^β")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(x, kind):
    if x is None:
        return "n/a"
    return f"{100 * x:.0f}%" if kind == "acc" else (f"{x:.2f}" if x < 1e4 else f"{x:.2e}")


def markdown_table(table, lengths, kind):
    head = "| variant | " + " | ".join(f"{x}x" for x in lengths) + " |\n|---|" + "---|" * len(lengths) + "\n"
    return head + "".join(f"| {name} | " + " | ".join(fmt(v, kind) for v in vals) + " |\n" for name, vals in table.items())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a reduced sweep for the tests (tiny models, 1x-2x)")
    p.add_argument("--out_dir", default=os.path.join(ROOT, "out-sweep"), help="checkpoints and raw results")
    p.add_argument("--input", default=None, help="a local tinyshakespeare.txt (default: ../shared, else download)")
    p.add_argument("--docs", default=None, help="where results.md and the plots go (default docs/, or out_dir with --quick)")
    args = p.parse_args()
    setting = QUICK if args.quick else FULL
    docs = args.docs or (args.out_dir if args.quick else os.path.join(ROOT, "docs"))
    os.makedirs(docs, exist_ok=True)
    t_start = time.time()
    passkey_acc, ppl, bam_models, shapes = {}, {}, {}, {}
    block_size = None
    for pos, ssmax in VARIANTS:
        name = name_of(pos, ssmax)
        common = [f"--pos={pos}", f"--ssmax={ssmax}"] + setting["model"]
        # (1) passkey: train on the synthetic set, evaluate at 1x..64x
        model = train_variant(common + [f"--max_iters={setting['passkey_iters']}",
                                        f"--lr_decay_iters={setting['passkey_iters']}"],
                              os.path.join(args.out_dir, f"passkey-{name}"))
        block_size = model.config.block_size
        lengths = [m * block_size for m in setting["passkey_lengths"]]
        results = run_passkey(model, "byte", lengths, setting["depths"], setting["samples"], seed=0)
        passkey_acc[name] = []
        for L in lengths:
            scored = [r["correct"] for r in results if r["length"] == L and r["correct"] is not None]
            passkey_acc[name].append(sum(scored) / len(scored) if scored else None)
        if pos == "bam":
            bam_models[name] = model
            shapes[name] = [[round(x, 3) for x in b.attn.prior.shape.tolist()] for b in model.transformer.h]
        # (2) perplexity: train on tiny Shakespeare, evaluate on its held-out 10%
        data_dir = shakespeare_dir(os.path.join(args.out_dir if args.quick else os.path.join(ROOT, "data"),
                                                "shakespeare_byte"), args.input)
        model = train_variant(common + [f"--dataset={data_dir}", f"--max_iters={setting['shakespeare_iters']}",
                                        f"--lr_decay_iters={setting['shakespeare_iters']}", "--eval_interval=200",
                                        "--learning_rate=2e-3"],
                              os.path.join(args.out_dir, f"shakespeare-{name}"))
        val = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
        ppl[name] = []
        for m in setting["ppl_lengths"]:
            L = m * block_size
            if pos == "learned" and m > 1:
                ppl[name].append(None)  # learned positions stop at block_size (SPEC §4)
                continue
            windows = max(1, setting["ppl_tokens"] // L)
            ppl[name].append(evaluate_ppl(model, val, L, max_windows=windows)[1])
        print(f"{name}: passkey {passkey_acc[name]}, ppl {ppl[name]} ({time.time() - t_start:.0f} s so far)")

    wall = time.time() - t_start
    plot_lines(passkey_acc, setting["passkey_lengths"], "passkey accuracy", os.path.join(docs, "passkey.png"))
    plot_lines(ppl, setting["ppl_lengths"], "perplexity (byte level)", os.path.join(docs, "ppl.png"), logy=True)
    if bam_models:
        plot_priors(bam_models, block_size, os.path.join(docs, "bam_priors.png"))
    with open(os.path.join(args.out_dir, "sweep.json"), "w") as f:
        json.dump({"passkey": passkey_acc, "ppl": ppl, "bam_shapes": shapes, "setting": setting, "wall_s": wall}, f)
    command = "python sweep.py" + (" --quick" if args.quick else "")
    with open(os.path.join(docs, "results.md"), "w") as f:
        f.write(f"# Results: every variant at CPU scale\n\nMade by `{command}` in {wall / 60:.1f} minutes "
                f"on {os.cpu_count()} CPU cores ({time.strftime('%Y-%m-%d')}).\n\n")
        f.write(f"## Passkey retrieval (teacher-forced, {setting['depths']} depths x {setting['samples']} "
                f"samples per length; training length {block_size} bytes)\n\n")
        f.write(markdown_table(passkey_acc, setting["passkey_lengths"], "acc"))
        f.write("\n![passkey accuracy against length](passkey.png)\n\n")
        f.write(f"## Perplexity on held-out tiny Shakespeare (bytes; up to {setting['ppl_tokens']:,} tokens "
                f"per length)\n\n")
        f.write(markdown_table(ppl, setting["ppl_lengths"], "ppl"))
        f.write("\n![perplexity against length](ppl.png)\n\n")
        if shapes:
            f.write("## Learned GGD-BAM shapes β per layer (one value per head; init 1 = ALiBi)\n\n")
            for name, per_layer in shapes.items():
                f.write(f"- {name}: " + "; ".join(f"layer {i}: {s}" for i, s in enumerate(per_layer)) + "\n")
            f.write("\n![learned priors](bam_priors.png)\n")
    print(f"wrote {os.path.join(docs, 'results.md')} ({wall / 60:.1f} min)")


if __name__ == "__main__":
    run_script(main)
