"""
The evaluation machinery that passkey.py and niah.py share: prompts of any length scored exactly and cheaply
(chunked prefill through the KV cache; teacher-forced or greedy), the scoring loop with resumable results, and the
result files (JSON, CSV, a length x depth heatmap), plus the command-line options of both scripts.

Teacher-forced scoring needs the logits at the answer positions only, so the last layer runs for those queries
alone and the far keys that a local prior makes negligible (weight provably below e^-40) are left out
(docs/spec.md §5): one 1,024x prompt of the CPU demo (327,680 bytes) takes ~1.5 minutes on 2 cores.
"""
import argparse
import csv
import itertools
import os
import time
from contextlib import nullcontext

import torch
from tqdm import tqdm

from configurator import InputError, output_path, positive_int, resume_or_new, write_atomic, write_json
from data.passkey import passkey_depths
from data.tokenizer import get_tokenizer
from checkpoint import load_checkpoint


def parse_lengths(spec, block_size):
    """"1x,2x,512" -> [block_size, 2*block_size, 512]: multiples of block_size ("Nx") or token counts.

    Raises ValueError naming a malformed entry.
    """
    out = []
    for s in str(spec).split(","):
        s = s.strip().lower()
        try:
            out.append(int(round(float(s[:-1]) * block_size)) if s.endswith("x") else int(s))
        except ValueError:
            raise ValueError(f"bad length {s!r}: use Nx (N times block_size={block_size}) or a token count") from None
    return out


def prefill(model, ids, cache, chunk, keep_last=1, progress=False):
    """Run ids (B, T) through model in chunks of `chunk` tokens, extending `cache` in place.

    Returns the logits of the last keep_last positions (B, keep_last, V) (keep_last <= the
    last chunk's length), or of all T positions (B, T, V) for keep_last=None.
    Memory: the KV cache, and attention scores of at most 256 queries × (cached + T) keys per head.
    progress: a progress bar over the chunks (one long prompt).
    """
    T, out = ids.size(1), []
    for c0 in tqdm(range(0, T, chunk), desc="  prompt", unit="chunk", leave=False, disable=not progress):
        last = c0 + chunk >= T
        keep = last or keep_last is None
        logits, _ = model(ids[:, c0:c0 + chunk], cache=cache, keep_last=keep_last if keep else 1)
        if keep:
            out.append(logits)
    return torch.cat(out, dim=1)


@torch.no_grad()
def answer_logits(model, prompts, answers, chunk=4096, device="cpu", progress=False):
    """Logits that predict each answer under teacher forcing, for a batch of prompts.

    prompts, answers: lists (one entry per sequence) of token-id lists; lengths may differ.
    Each sequence prompt + answer[:-1] is right-padded to the longest (under causal
    attention a token's logits never depend on what follows, so padding changes nothing),
    and the batch is prefilled together through the KV cache in chunks of `chunk` tokens:
    one positional mask serves the whole batch. Returns a list of (A_i, V) tensors, the
    logits at positions P_i-1 .. P_i+A_i-2, equal to model(prompt + answer)[0, P_i-1 : P_i+A_i-1]
    of a full forward of each sequence alone, to float rounding. The cost is linear in T for local
    priors: the prefill runs the last layer for one query per chunk only (model.GPT.forward's keep_last),
    and with no gradient the attention leaves out the keys that an ALiBi or BAM prior with β > 0 makes
    negligible, by a bound (attention.first_needed_key). Memory: the KV cache (2 · n_layer · n_embd
    values per token and prompt) and 256 × T scores per head. progress: a bar over the prefill chunks.
    """
    seqs = [list(p) + list(a[:-1]) for p, a in zip(prompts, answers)]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)  # (B, T), right-padded with id 0
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    ids = ids.to(device)
    start = min(len(p) for p in prompts) - 1  # the first position that predicts an answer token
    cache = model.new_cache()
    if start:
        prefill(model, ids[:, :start], cache, chunk, progress=progress)
    tail = prefill(model, ids[:, start:], cache, chunk, keep_last=None)  # (B, T - start, V): every answer-predicting position
    return [tail[i, len(p) - 1 - start:len(p) - 1 - start + len(a)] for i, (p, a) in enumerate(zip(prompts, answers))]


def score_teacher_forced(model, prompts, answers, chunk=4096, device="cpu", progress=False):
    """Teacher-forced scoring as in the BAM code (SPEC §5): one pass over prompt + answer.

    prompts, answers: lists of token-id lists (answers non-empty), scored as one batch.
    Returns a list of (correct, predicted_ids), one per prompt: correct only if the argmax
    equals the true token at every answer position.
    """
    out = []
    for logits, a in zip(answer_logits(model, prompts, answers, chunk, device, progress), answers):
        pred = logits.argmax(-1).tolist()
        out.append((pred == list(a), pred))
    return out


@torch.no_grad()
def score_generate(model, prompt_ids, answer_ids, chunk=4096, device="cpu", progress=False):
    """Greedy generation (SPEC §5, the other common mode): decode len(answer_ids) tokens.

    Prefills prompt_ids in chunks, then decodes token by token through the KV cache.
    Returns (correct, predicted_ids): correct if the greedy tokens equal answer_ids.
    """
    cache = model.new_cache()
    logits = prefill(model, torch.tensor(prompt_ids, dtype=torch.long, device=device)[None], cache, chunk,
                     progress=progress)
    pred = [logits[0, -1].argmax().item()]
    while len(pred) < len(answer_ids):  # feed each new token (not the last one) to predict the next
        logits, _ = model(torch.tensor([pred[-1:]], device=device), cache=cache)  # (1, 1, V)
        pred.append(logits[0, -1].argmax().item())
    return pred == list(answer_ids), pred


# teacher-forced prompts of one length are scored together up to this many tokens in all (the KV cache of the
# CPU demo's model takes 4 KB a token); longer prompts go one at a time
BATCH_TOKENS = 2 ** 17


def run_jobs(model, jobs, scored, make, mode="teacher_forced", chunk=4096, device="cpu", progress=True, ctx=None,
             batch_size=5, save=None, desc="passkey"):
    """The scoring loop of run_passkey and niah.run_niah: score the prompts of `jobs` not yet in `scored`.

    jobs: [(length, job id)] in the order of an uninterrupted run (job ids hashable); consecutive jobs of one length
    are scored together, teacher-forced batch_size at a time and at most BATCH_TOKENS tokens in all (greedy
    generation, one at a time, len(answer) tokens). make(job id) -> (prompt ids, answer ids, result), where
    result(predicted ids, or None when the prompt is past model.max_length: n/a) is the job's result dict, with
    "length" and "correct" (a score in [0, 1], None for n/a). scored: {job id: result}, an earlier unfinished run's
    results (filled in place). save(results so far, in run order) after every batch. Returns the results in run
    order. progress: a bar over all prompts (in tokens) and, for a long prompt, one over its prefill. Puts model in
    eval mode. Raises InputError (a ValueError) for an unknown mode.
    """
    if mode not in ("teacher_forced", "generate"):
        raise InputError(f"unknown mode {mode!r}; valid: teacher_forced, generate")
    model.eval()
    order = [job for _, job in jobs]
    results = lambda: [scored[job] for job in order if job in scored]  # in the order of an uninterrupted run
    bar = tqdm(total=sum(L for L, _ in jobs), initial=sum(L for L, job in jobs if job in scored), desc=desc,
               unit="tok", unit_scale=True, disable=not progress)
    for L, group in itertools.groupby(jobs, key=lambda lj: lj[0]):
        group = [job for _, job in group]
        todo = [(job,) + tuple(make(job)) for job in group if job not in scored]  # (job, prompt, answer, result)
        n = 1 if mode == "generate" else max(1, min(batch_size, BATCH_TOKENS // L))
        for b0 in range(0, len(todo), n):
            batch = todo[b0:b0 + n]
            preds = [None] * len(batch)  # n/a: pos='learned' past block_size
            longest = max(len(j[1]) + len(j[2]) for j in batch) - 1  # tokens fed: prompt + answer[:-1]
            long_prompt = progress and longest > 8 * chunk  # a bar of its own
            if longest <= model.max_length:
                with ctx or nullcontext():
                    if mode == "teacher_forced":
                        preds = [pred for _, pred in score_teacher_forced(
                            model, [j[1] for j in batch], [j[2] for j in batch], chunk, device, long_prompt)]
                    else:
                        preds = [score_generate(model, batch[0][1], batch[0][2], chunk, device, long_prompt)[1]]
            for (job, _, _, result), pred in zip(batch, preds):
                scored[job] = result(pred)
            if save is not None:
                save(results())
            hits = [scored[job]["correct"] for job in group if job in scored and scored[job]["correct"] is not None]
            bar.set_postfix(length=L, acc=f"{sum(hits):g}/{len(hits)}")
            bar.update(L * len(batch))
    bar.close()
    return results()


def tokenizer_and_depths(tokenizer, depths):
    """(tokenizer, depths list) of an evaluation's arguments: a data.tokenizer object or its name; a number of
    equidistant depths (passkey_depths) or a list of depths in [0, 1]."""
    tokenizer = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    return tokenizer, passkey_depths(depths) if isinstance(depths, int) else list(depths)


def accuracy_table(results):
    """{length: {depth: accuracy or None}} and {length: accuracy or None} (None: n/a)."""
    def acc(rs):
        ok = [r["correct"] for r in rs if r["correct"] is not None]
        return sum(ok) / len(ok) if ok else None
    lengths = sorted({r["length"] for r in results})
    depths = sorted({r["depth"] for r in results})
    by_ld = {L: {d: acc([r for r in results if r["length"] == L and r["depth"] == d]) for d in depths}
             for L in lengths}
    return by_ld, {L: acc([r for r in results if r["length"] == L]) for L in lengths}


def format_table(results, block_size=None):
    """Text table: one row per length, accuracy per depth and overall (n/a where not applicable)."""
    by_ld, by_l = accuracy_table(results)
    depths = sorted({r["depth"] for r in results})
    fmt = lambda a: "   n/a" if a is None else f"{100 * a:5.0f}%"
    lines = [f"{'length':>8} {'x':>6} | " + " ".join(f"d={d:<4.2f}" for d in depths) + " |    all"]
    for L in by_ld:
        mult = f"{L / block_size:g}x" if block_size else ""
        lines.append(f"{L:>8} {mult:>6} | " + " ".join(f"{fmt(by_ld[L][d]):>6}" for d in depths)
                     + f" | {fmt(by_l[L])}")
    return "\n".join(lines)


def plot_heatmap(results, path, title=None, block_size=None, ax=None, label="accuracy"):
    """Save a length × depth accuracy heatmap (the papers' figure) as a PNG at `path`; n/a cells grey.

    With block_size, the length labels also show the multiple of it ("4096\n8x"). ax: draw into this
    matplotlib Axes instead (one panel of a larger figure, niah.py's); path is then unused. label: what
    the cells show (the colour bar's label).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    by_ld, _ = accuracy_table(results)
    lengths, depths = list(by_ld), sorted({r["depth"] for r in results})
    grid = np.array([[np.nan if by_ld[L][d] is None else 100 * by_ld[L][d] for L in lengths] for d in depths])
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5.5, 1.5 + 0.8 * len(lengths)), 1.5 + 0.45 * len(depths)))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgrey")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for (r, c), a in np.ndenumerate(grid):
        ax.text(c, r, "n/a" if np.isnan(a) else f"{a:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [f"{L}\n{L / block_size:g}x" if block_size else str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("key depth")
    ax.set_title(title or "passkey accuracy (%)", fontsize=10)
    ax.figure.colorbar(im, ax=ax, label=f"{label} (%)")
    if fig is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def write_results(results, path, meta=None, finished=True, plot=None):
    """Write results to `path` (JSON: {"meta": meta + {"finished": finished}, "results": [...]}), and, when
    finished, a CSV and a heatmap PNG beside it (drawn by plot(results, png path, meta); default plot_heatmap).
    Each file is written whole or not at all (configurator.write_atomic); the JSON comes last, so one marked
    finished has its CSV and PNG.
    Returns the paths written. Raises NanoPEError (one line) if a file cannot be written (a full disk).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    stem, paths = os.path.splitext(path)[0], []
    if finished:
        def write_csv(tmp):
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(results[0]))
                w.writeheader()
                w.writerows(results)
        write_atomic(stem + ".csv", write_csv)
        meta = meta or {}
        plot = plot or (lambda rs, tmp, m: plot_heatmap(rs, tmp, m.get("title"), m.get("block_size")))
        write_atomic(stem + ".png", lambda tmp: plot(results, tmp, meta))
        paths = [stem + ".csv", stem + ".png"]

    write_json(path, {"meta": dict(meta or {}, finished=finished), "results": results})
    return [path] + paths


def eval_parser(doc, what, default_mode):
    """The command-line options passkey.py and niah.py share; what: the results' name ("passkey", "niah")."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", help="checkpoint path (default <out_dir>/ckpt.pt)")
    p.add_argument("--out_dir", default="out", help="training output folder holding ckpt.pt")
    p.add_argument("--lengths", default="1x,2x,4x,8x,16x,32x,64x", help="multiples of block_size (Nx) or token counts")
    p.add_argument("--depths", type=positive_int, default=5, help="number of equidistant key depths in [0, 1]")
    p.add_argument("--samples", type=positive_int, default=2, help="prompts (keys) per length and depth")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["teacher_forced", "generate"], default=default_mode)
    p.add_argument("--chunk", type=positive_int, default=4096, help="prefill chunk size (tokens)")
    p.add_argument("--batch_size", type=positive_int, default=5,
                   help="prompts of one length scored together (teacher-forced); memory grows with it (KV cache)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="autocast dtype on cuda (cpu runs float32)")
    p.add_argument("--out", help=f"results JSON (default <ckpt dir>/{what}.json); CSV and PNG beside it. An earlier "
                   f"result there is kept: this one goes to {what}-2.json, -3, ... (--overwrite replaces it). The "
                   "JSON is written after every batch: the same command again goes on where a run was cut short")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier result at --out")
    return p


def load_eval(p, args, what):
    """What an evaluation of eval_parser's args works on. A bad --out, --lengths or --depths is a usage error of
    `p` (one line), a missing or broken checkpoint a one-line NanoPEError (checkpoint.load_checkpoint). Returns a
    Namespace: ckpt_path, requested (the results JSON asked for), model, ckpt, tokenizer, block_size, lengths,
    depths, ctx (autocast or None), name ("bam+ssmax"), t0 (the start time)."""
    ckpt_path = args.ckpt or os.path.join(args.out_dir, "ckpt.pt")
    requested = args.out or os.path.join(os.path.dirname(ckpt_path), f"{what}.json")
    output_path(requested)  # a bad --out is refused now, not after the evaluation
    model, ckpt = load_checkpoint(ckpt_path, args.device)
    use_amp = "cuda" in args.device and args.dtype != "float32"
    ev = argparse.Namespace(ckpt_path=ckpt_path, requested=requested, model=model, ckpt=ckpt, t0=time.time(),
                            tokenizer=get_tokenizer(ckpt.get("tokenizer", "byte")), block_size=model.config.block_size,
                            ctx=torch.autocast("cuda", dtype=getattr(torch, args.dtype)) if use_amp else None,
                            name=f"{model.config.pos}{'+ssmax' if model.config.ssmax else ''}")
    try:
        ev.lengths, ev.depths = parse_lengths(args.lengths, ev.block_size), passkey_depths(args.depths)
    except ValueError as e:
        p.error(str(e))
    return ev


def resume(ev, settings, overwrite):
    """(path, results done): where the results JSON goes and what it goes on from (configurator.resume_or_new,
    settings: what makes two runs' results the same), with a line saying which it chose."""
    out, done = resume_or_new(ev.requested, settings, overwrite, (".csv", ".png"))
    if done:
        print(f"{out}: an unfinished run of these settings, going on after the {len(done)} prompts it scored")
    elif out != ev.requested:
        print(f"{ev.requested} holds an earlier result: writing {out} (--overwrite replaces it)")
    return out, done
