"""
Perplexity against context length (SPEC §6) for one or more checkpoints.

    python eval_ppl.py --out_dirs out-bam out-rope --lengths 1x,2x,4x,8x,16x
    python eval_ppl.py --ckpt out/ckpt.pt --lengths 512,4096 --stride 256 --max_windows 8

Full-window loss (default): non-overlapping windows of L tokens, every token
scored. Sliding window (--stride S, Press et al.): windows of L tokens moved by
S, only the last S tokens of each scored (the first window scores all of its
tokens). Windows run through the KV cache in chunks of --chunk tokens, so no
T × T score matrix is built. Writes a table, a JSON ({"meta", "results": one row per
checkpoint and length}) and a perplexity plot. The JSON is rewritten after every row: a
run cut short goes on from the rows it has when the same command runs again (same
checkpoints, data and settings); an earlier finished result is kept (ppl-2.json, ...).
"""
import argparse
import math
import os
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from checkpoint import checkpoint_digest, load_checkpoint, read_checkpoint
from configurator import (InputError, MissingFileError, output_path, positive_int, resume_or_new, run_script,
                          write_atomic, write_json)
from data.tokenizer import data_dir_of, read_meta
from evaluate import parse_lengths


def window_starts(n_tokens, length, stride=None):
    """Start offsets of the windows over n_tokens tokens: every window needs length + 1 tokens.

    stride None means stride = length (non-overlapping windows).
    """
    stride = stride or length
    return list(range(0, n_tokens - length, stride))


@torch.no_grad()
def evaluate_ppl(model, tokens, length, stride=None, max_windows=None, batch_size=1, chunk=1024,
                 device="cpu", ctx=None, progress=False):
    """Mean next-token loss of `model` on windows of `length` tokens (SPEC §6).

    tokens: 1-D int array (numpy memmap or tensor) of held-out ids. Window w covers inputs
    tokens[s_w : s_w + length] and targets tokens[s_w + 1 : s_w + length + 1], s_w = w * stride
    (stride None = length: non-overlapping, every token scored). With stride S < length
    only the last S targets of each window are scored, all of them in the first window,
    so every target is scored once. max_windows keeps the first windows only.
    Each window is fed in chunks of `chunk` tokens through the KV cache; chunks before
    the scored part skip the lm_head. Returns (mean loss in nats, perplexity, n_scored).
    Raises InputError (a ValueError) if tokens hold no full window, or (from the model) ValueError for
    pos='learned' past block_size.
    """
    stride = stride or length
    if not 0 < stride <= length:
        raise InputError(f"stride must be in 1..length={length}, got {stride}")
    starts = window_starts(len(tokens), length, stride)[:max_windows]
    if not starts:
        raise InputError(f"{len(tokens)} tokens hold no window of {length} + 1 tokens")
    model.eval()
    total, n_scored = 0.0, 0
    for b0 in tqdm(range(0, len(starts), batch_size), desc=f"L={length}", disable=not progress, leave=False):
        rows = [np.asarray(tokens[s:s + length + 1], dtype=np.int64) for s in starts[b0:b0 + batch_size]]
        xy = torch.from_numpy(np.stack(rows)).to(device)  # (B, length + 1)
        x, y = xy[:, :-1], xy[:, 1:].clone()  # (B, T), (B, T)
        for r, s in enumerate(starts[b0:b0 + batch_size]):
            if s > 0:  # not the first window: only its last `stride` targets are new
                y[r, :length - stride] = -1
        cache = model.new_cache()
        for c0 in range(0, length, chunk):
            yc = y[:, c0:c0 + chunk]  # (B, c)
            scored = bool((yc != -1).any())
            with ctx or nullcontext():
                logits, _ = model(x[:, c0:c0 + chunk], cache=cache, keep_last=None if scored else 1)
            if scored:
                total += F.cross_entropy(logits.float().flatten(0, 1), yc.flatten(), ignore_index=-1,
                                         reduction="sum").item()
                n_scored += int((yc != -1).sum())
    loss = total / n_scored
    return loss, math.exp(loss), n_scored


def label_of(ckpt_path, model):
    """Plot label: out_dir name and positional variant, e.g. "out-bam (bam+ssmax)"."""
    cfg = model.config
    return f"{os.path.basename(os.path.dirname(os.path.abspath(ckpt_path)))} ({cfg.pos}{'+ssmax' if cfg.ssmax else ''})"


def plot_ppl(rows, path, title=None):
    """Save perplexity against context length (log-x), one line per checkpoint label, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label in dict.fromkeys(r["label"] for r in rows):
        pts = [(r["length"], r["ppl"]) for r in rows if r["label"] == label and r["ppl"] is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lengths = sorted({r["length"] for r in rows})
    ax.set_xticks(lengths, [str(L) for L in lengths])
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if hi / lo < 10 else matplotlib.ticker.NullFormatter())
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title or "perplexity against context length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_table(rows):
    """Text table: one row per checkpoint, perplexity per length (n/a where not applicable)."""
    lengths = sorted({r["length"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    w = max(len(s) for s in labels + ["checkpoint"])
    lines = [f"{'checkpoint':<{w}} | " + " ".join(f"{L:>9}" for L in lengths)]
    for label in labels:
        cell = {r["length"]: r["ppl"] for r in rows if r["label"] == label}
        lines.append(f"{label:<{w}} | " + " ".join(
            f"{'n/a' if cell.get(L) is None else format(cell[L], '.3f'):>9}" for L in lengths))
    return "\n".join(lines)


def data_of(path, ckpt, data_dir, split):
    """(data_dir, split file) that checkpoint `path` (dict ckpt) is evaluated on: data_dir, else the folder of its
    training dataset. Raises InputError / MissingFileError naming the fix for a missing or empty split, a
    dataset in another tokenizer, or a checkpoint that names no dataset."""
    dataset = ckpt.get("config", {}).get("dataset")
    if not (data_dir or dataset):
        raise InputError(f"{path} names no dataset in its config: pass --data_dir")
    data_dir = data_dir or data_dir_of(dataset)  # as train.py found it (a folder, else data/<dataset>)
    meta = read_meta(data_dir)
    if meta["tokenizer"] != ckpt.get("tokenizer", meta["tokenizer"]):
        raise InputError(f"{path} uses tokenizer {ckpt['tokenizer']!r} but {data_dir} holds {meta['tokenizer']!r} "
                         f"tokens: pass a --data_dir in its tokenizer")
    split_file = os.path.join(data_dir, f"{split}.bin")
    if not os.path.isfile(split_file) or os.path.getsize(split_file) < 4:
        splits = sorted(f[:-4] for f in os.listdir(data_dir) if f.endswith(".bin") and os.path.getsize(
            os.path.join(data_dir, f)) >= 4)
        raise MissingFileError(f"no {split} split in {data_dir} ({split_file} missing or empty): use --split with "
                               f"one of {', '.join(splits) or 'none (prepare the data again)'}")
    return data_dir, split_file


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", nargs="*", default=[], help="checkpoint paths")
    p.add_argument("--out_dirs", nargs="*", default=[], help="training output folders holding ckpt.pt")
    p.add_argument("--data_dir", help="folder with <split>.bin (default data/<checkpoint's dataset>)")
    p.add_argument("--split", default="val")
    p.add_argument("--lengths", default="1x,2x,4x,8x,16x", help="multiples of block_size (Nx) or token counts")
    p.add_argument("--stride", type=positive_int, help="sliding-window stride S (default: full windows; S >= L: full)")
    p.add_argument("--max_tokens", type=positive_int, help="use only the first max_tokens held-out tokens")
    p.add_argument("--max_windows", type=positive_int, help="at most this many windows per length")
    p.add_argument("--batch_size", type=positive_int, default=1, help="windows per forward")
    p.add_argument("--chunk", type=positive_int, default=1024, help="tokens per chunked forward")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="autocast dtype on cuda (cpu runs float32)")
    p.add_argument("--out", help="results JSON (default <ckpt dir>/ppl.json for one checkpoint, else out-ppl/ppl.json); "
                   "an earlier result there is kept (this one goes to ppl-2.json, ...); a run cut short goes on")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier result at --out")
    args = p.parse_args(argv)
    paths = args.ckpt + [os.path.join(d, "ckpt.pt") for d in args.out_dirs]
    if not paths:
        p.error("give --ckpt PATH... or --out_dirs DIR...")
    use_amp = "cuda" in args.device and args.dtype != "float32"
    ctx = torch.autocast("cuda", dtype=getattr(torch, args.dtype)) if use_amp else None
    # everything is checked before the first evaluation: the output, then every checkpoint's data
    requested = args.out or os.path.join(os.path.dirname(paths[0]) if len(paths) == 1 else "out-ppl", "ppl.json")
    output_path(requested)
    data = {path: data_of(path, read_checkpoint(path, mmap=True), args.data_dir, args.split) for path in paths}
    # what makes two runs' rows the same: a run cut short goes on only under these settings
    settings = dict(ckpt_sha256=[checkpoint_digest(path) for path in paths], data=[data[path][1] for path in paths],
                    lengths=args.lengths, stride=args.stride, max_tokens=args.max_tokens, max_windows=args.max_windows,
                    dtype=args.dtype)
    out, done = resume_or_new(requested, settings, args.overwrite, (".png",))
    if done:
        print(f"{out}: an unfinished run of these settings, going on after the {len(done)} rows it has")
    elif out != requested:
        print(f"{requested} holds an earlier result: writing {out} (--overwrite replaces it)")
    title = "perplexity" + (f", stride {args.stride}" if args.stride else ", full windows")
    meta = dict(title=title, settings=settings)
    rows = list(done)
    for i, path in enumerate(paths):
        model, ckpt = load_checkpoint(path, args.device)
        cfg = model.config
        data_dir, split_file = data[path]
        tokens = np.memmap(split_file, dtype=np.uint16, mode="r")
        tokens = tokens[:args.max_tokens] if args.max_tokens else tokens
        label = label_of(path, model)
        for L in parse_lengths(args.lengths, cfg.block_size):
            if any(r["ckpt"] == path and r["length"] == L for r in done):
                continue  # scored by the run this one goes on from
            stride = min(args.stride or L, L)  # a stride >= L is plain full windows
            row = dict(ckpt=path, label=label, pos=cfg.pos, ssmax=cfg.ssmax, block_size=cfg.block_size,
                       data_dir=data_dir, length=L, stride=stride, loss=None, ppl=None, n_scored=0)
            if L > model.max_length:
                row["note"] = "n/a: learned positions stop at block_size"
            else:
                row["loss"], row["ppl"], row["n_scored"] = evaluate_ppl(
                    model, tokens, L, stride, args.max_windows, args.batch_size, args.chunk, args.device, ctx,
                    progress=True)
            print(f"{label} L={L}: " + ("n/a" if row["ppl"] is None else
                                        f"loss {row['loss']:.4f} ppl {row['ppl']:.3f} ({row['n_scored']} tokens)"))
            rows.append(row)
            write_json(out, dict(meta=dict(meta, finished=False), results=rows))  # cut short, nothing done is lost
    print(f"\n{title}")
    print(format_table(rows))
    png = os.path.splitext(out)[0] + ".png"
    write_atomic(png, lambda tmp: plot_ppl(rows, tmp, title))
    write_json(out, dict(meta=dict(meta, finished=True), results=rows))  # last: a finished JSON has its PNG
    print(f"wrote {out}, {png}")


if __name__ == "__main__":
    run_script(main)
