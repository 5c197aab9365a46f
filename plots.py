"""
The figures train.py draws while it trains: the loss curve (out_dir/loss.png) and the
learned positional prior of every head (out_dir/priors.png); and one line per model against
the context length (sweep.py's figures, and passkey runs side by side):

    python plots.py --out far_end.png out-a/passkey.json out-b/passkey.json   # accuracy by length
    python plots.py --out a.png a=out-a/passkey.json a=out-a/far.json          # one line from two files
"""
import argparse
import json
import os

import numpy as np

from attention_bam import GGD_EPS
from configurator import InputError, MissingFileError


def plot_history(history, path):
    """Train/val loss against iteration (history: list of [iter, train, val]) to a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    it, tr, va = zip(*history)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(it, tr, label="train")
    ax.plot(it, va, label="val")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss (log scale)")
    ax.set_yscale("log")  # the passkey demo goes from 5.5 to 0.07, then to 0.04 when the copy forms
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_priors(prior_history, block_size, path):
    """The BAM prior of every head (from prior_history: [iter, model.prior_state()] per evaluation) to a PNG.

    Left: the penalty −b(d) = c·(d + ε)^β against distance d from 1 to 64 × block_size (log-log), at init
    (dashed) and at the last evaluation (solid), one colour per head, one panel row per layer.
    Right: β of every head against the iteration. Dotted lines: the training length.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    iters = [it for it, _ in prior_history]
    first, last = prior_history[0][1], prior_history[-1][1]
    n_layer = len(last["shape"])
    fig, axes = plt.subplots(n_layer, 2, figsize=(11, 3.2 * n_layer), squeeze=False)
    d = np.logspace(0, np.log10(64 * block_size), 200)
    for layer in range(n_layer):
        ax, ax_beta = axes[layer]
        for h, (beta, c) in enumerate(zip(last["shape"][layer], last["scale"][layer])):
            beta0, c0 = first["shape"][layer][h], first["scale"][layer][h]
            ax.plot(d, c0 * (d + GGD_EPS) ** beta0, color=f"C{h}", ls="--", lw=0.9, alpha=0.6)
            ax.plot(d, c * (d + GGD_EPS) ** beta, color=f"C{h}", label=f"head {h}: β={beta:.2f}, c={c:.2g}")
            ax_beta.plot(iters, [p["shape"][layer][h] for _, p in prior_history], color=f"C{h}", marker=".")
        ax.set(xscale="log", yscale="log", xlabel="distance i − j (tokens)", ylabel="penalty −b = c·(d+ε)^β",
               title=f"layer {layer}: prior at iteration {iters[-1]} (dashed: at {iters[0]})")
        ax.axvline(block_size, color="k", lw=0.8, ls=":")
        ax.legend(fontsize=7)
        ax_beta.axhline(0, color="k", lw=0.6)
        ax_beta.set(xlabel="iteration", ylabel="shape β", title=f"layer {layer}: β per head")
        for a in (ax, ax_beta):
            a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_lines(table, lengths, ylabel, path, logy=False):
    """One line per variant against lengths (multiples of block_size), log-x; saves a PNG. table[name][i], the
    value at lengths[i]: a number, None (not scored: no point), or a list of one value per seed (None entries
    skipped), drawn as their mean with their range shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, values) in enumerate(table.items()):
        per_length = [[y for y in (v if isinstance(v, list) else [v]) if y is not None] for v in values]
        pts = [(x, np.mean(ys), min(ys), max(ys)) for x, ys in zip(lengths, per_length) if ys]
        if pts:  # 10 colours: the 11th variant on takes a square marker, so no two lines look alike
            x, mean, lo, hi = zip(*pts)
            line, = ax.plot(x, mean, marker="o" if i < 10 else "s", label=name, ls="--" if "ssmax" in name else "-")
            if lo != hi:
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
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


def passkey_by_length(path):
    """{length in multiples of block_size: accuracy or None} of a passkey.py results JSON ({"meta": {"block_size"},
    "results": [{"length", "correct"}]}). Raises MissingFileError if path does not exist, InputError if it is not
    such a JSON."""
    if not os.path.isfile(path):
        raise MissingFileError(f"no file {path}: give the JSON that passkey.py --out wrote (out_dir/passkey.json)")
    try:
        with open(path) as f:
            res = json.load(f)
        block = res["meta"]["block_size"]
        res["results"][0]["length"], res["results"][0]["correct"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise InputError(f"{path} is not a passkey.py results JSON with results ({type(e).__name__}: {e}): give the "
                         f"file passkey.py --out wrote") from None
    by_length = {}
    for r in res["results"]:
        L = r["length"] // block if r["length"] % block == 0 else r["length"] / block
        by_length.setdefault(L, []).append(r["correct"])
    return {L: (sum(c) / len(c) if None not in c else None) for L, c in by_length.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description="passkey accuracy against length, one line per results JSON")
    p.add_argument("results", nargs="+", help="passkey.py JSON files; a line's label is name=path, or the folder's "
                   "name; files of one name make one line (e.g. 1x-64x in one, 128x-1024x in another)")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    if not args.out.endswith(".png") or not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise InputError(f"--out={args.out}: give a .png path in a folder that exists")
    table, lengths = {}, set()
    for item in args.results:
        name, path = item.split("=", 1) if "=" in item else (os.path.basename(os.path.dirname(os.path.abspath(item))), item)
        table.setdefault(name, {}).update(passkey_by_length(path))
        lengths |= set(table[name])
    lengths = sorted(lengths)
    plot_lines({n: [acc.get(L) for L in lengths] for n, acc in table.items()}, lengths, "passkey accuracy", args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    from configurator import run_script
    run_script(main)
