"""
Passkey retrieval (SPEC §5): can a checkpoint find a 5-digit key hidden at a
given depth of a long prompt? Prompts come from data/passkey.py, the same
generator as the training data, in the checkpoint's tokenizer.

    python passkey.py --out_dir=out --lengths=1x,2x,4x,8x,16x,32x,64x --depths=5 --samples=2
    python passkey.py --ckpt=out/ckpt.pt --lengths=512,4096 --mode=generate

Long prompts are prefilled through the KV cache in chunks of --chunk tokens, and the
scoring is exact but does only the work the answer needs (docs/spec.md §5): the last
layer attends with the answer positions' queries alone, and a local prior's far keys,
whose weight is provably below e^-40, are left out (evaluate.py). One 1,024x prompt of the CPU demo
(327,680 bytes) takes ~90 s and ~2.4 GB on one thread (docs/lab-notes.md, "Cost of the exact fast
scoring"). Teacher-forced scoring runs the --batch_size prompts of one length together (right-padded).

Prints the accuracy per length and depth and, under it, where the misses are (miss_table: the key's first
character wrong, a failed fetch, or a later one, a failed copy). Writes every result to --out (JSON, plus a
CSV beside it) and an accuracy heatmap (length x depth) PNG. The JSON is rewritten after every batch: a run
cut short (Ctrl-C, a crash) goes on from where it stopped when the same command runs again (same checkpoint
and settings). An earlier finished result is kept (the new one goes to passkey-2.json, ...) unless --overwrite.
"""
import os
import random
import time

import torch

from checkpoint import checkpoint_digest
from configurator import positive_int, run_script
from data.passkey import KEY_SENTENCE, passkey_min_length, passkey_prompt, random_key
from evaluate import (eval_parser, format_table, load_eval, prefill, resume, run_jobs, tokenizer_and_depths,
                      write_results)


def run_passkey(model, tokenizer, lengths, depths=5, samples=2, seed=0, mode="teacher_forced",
                chunk=4096, device="cpu", n_digits=5, progress=True, ctx=None, batch_size=5, done=(), save=None):
    """Passkey accuracy of `model` at each length × depth × sample (SPEC §5).

    tokenizer: a data.tokenizer object or its name. lengths: target prompt + answer
    lengths in tokens (each prompt is within one filler sentence below it); depths: a number of equidistant
    depths or a list of depths in [0, 1]. The key of each (length, depth index, sample)
    comes from a Random seeded by (seed, length, depth index, sample), so runs with the
    same seed see the same prompts, whichever other lengths they include. Teacher-forced
    scoring runs the prompts of one length together, batch_size at a time and at most evaluate.BATCH_TOKENS
    tokens in all (greedy generation, one at a time): run_jobs. Returns a list of dicts (length, n_tokens, depth,
    sample, key, answer, predicted, correct), in that order; correct is None (n/a) for pos='learned'
    past block_size.
    done: results of an unfinished run with the same settings: those prompts are not scored again (the
    returned list equals an uninterrupted run's). save(results): called with the results so far after
    every batch (passkey.py writes them to disk, so a run cut short loses nothing it scored).
    progress: a bar over all prompts (in tokens) and, for a long prompt, one over its prefill.
    Raises ValueError for a length below the template's minimum (the message states
    the minimum) or an unknown mode.
    """
    tokenizer, depths = tokenizer_and_depths(tokenizer, depths)
    min_len = passkey_min_length(tokenizer, n_digits)
    if min(lengths) < min_len:
        raise ValueError(f"passkey length {min(lengths)} is below the minimum {min_len} tokens of the prompt "
                         f"template ({tokenizer.name} tokenizer, {n_digits}-digit key); use --lengths >= {min_len}")

    def make(job):
        L, d, s = job
        key = random_key(random.Random(f"{seed}:{L}:{d}:{s}"), n_digits)
        prompt, answer = passkey_prompt(tokenizer, L, depths[d], key)
        return prompt, answer, lambda pred: dict(
            length=L, n_tokens=len(prompt) + len(answer), depth=depths[d], sample=s, key=key,
            answer=tokenizer.decode(answer), predicted=None if pred is None else tokenizer.decode(pred),
            correct=None if pred is None else pred == answer)
    jobs = [(L, (L, d, s)) for L in lengths for d in range(len(depths)) for s in range(samples)]
    scored = {(r["length"], depths.index(r["depth"]), r["sample"]): r for r in done}  # what an earlier run has
    return run_jobs(model, jobs, scored, make, mode, chunk, device, progress, ctx, batch_size, save)


def key_positions(tokenizer, prompt, key):
    """Positions in `prompt` (token ids) of the tokens that spell the key inside the key sentence (SPEC §5):
    the tokens of " The pass key is K. Remember it. K is the pass key." whose text holds a digit.
    Raises ValueError if the key sentence is not in the prompt."""
    sent = tokenizer.encode(" " + KEY_SENTENCE.format(K=key))
    starts = [i for i in range(len(prompt) - len(sent) + 1) if prompt[i:i + len(sent)] == sent]
    if not starts:
        raise ValueError(f"the key sentence of key {key} is not in the prompt")
    return [starts[0] + j for j, t in enumerate(sent) if any(ch.isdigit() for ch in tokenizer.decode([t]))]


@torch.no_grad()
def key_attention(model, tokenizer, length, depth, key, chunk=1024, device="cpu"):
    """The diagnostic of a retrieval failure: how much attention each head puts on the key, for one prompt.

    Builds the passkey prompt of `length` tokens with `key` at `depth`, runs prompt + answer[:-1]
    (teacher-forced), and measures, at every position that predicts an answer token, the attention
    probability mass on the key's tokens (key_positions). The mass is read off the model's own
    attention path (any pos, SSMax, chunked prefill): attention applied to a value that is 1 on the
    key's positions and 0 elsewhere returns exactly that mass.
    Returns (mass, correct): mass (n_layer, n_head, len(answer)), one column per answer position (the first
    predicts the answer's first token), correct as in score_teacher_forced.
    """
    model.eval()
    prompt, answer = passkey_prompt(tokenizer, length, depth, key)
    on_key = torch.zeros(len(prompt) + len(answer) - 1, device=device)  # (T,): 1 on the key's tokens
    on_key[key_positions(tokenizer, prompt, key)] = 1.0
    ids = torch.tensor([prompt + answer[:-1]], device=device)  # (1, T)
    start = len(prompt) - 1  # the first position that predicts an answer token
    cache = model.new_cache()
    if start:
        prefill(model, ids[:, :start], cache, chunk)
    mass = torch.zeros(model.config.n_layer, model.config.n_head, len(answer))
    for layer, block in enumerate(model.transformer.h):
        def attend_and_measure(q, k, v, t0, doc_start=None, layer=layer, attend=block.attn.attend):
            indicator = on_key[:k.shape[2]].expand(*v.shape[:2], -1)[..., None].expand_as(v).contiguous()  # (B, nh, Tk, hs)
            mass[layer] = attend(q, k, indicator, t0, doc_start)[0, :, :, 0].float().cpu()  # (nh, len(answer))
            return attend(q, k, v, t0, doc_start)
        block.attn.attend = attend_and_measure  # an instance attribute: shadows the method for this pass
    try:
        logits, _ = model(ids[:, start:], cache=cache, keep_last=None)  # (1, len(answer), V)
    finally:
        for block in model.transformer.h:
            del block.attn.attend
    return mass, logits[0].argmax(-1).tolist() == list(answer)


def attention_report(model, tokenizer, lengths, depths, seed=0, chunk=1024, device="cpu", path=None, block_size=None):
    """key_attention for one prompt per (length, depth): a text table (rows layer.head) and, with path, a PNG.

    Two numbers per head and prompt: "fetch", the mass at the query that predicts the key's first token (it must
    find the key from the question alone: the retrieval step), and "copy", the mean over the later answer
    positions (each has the key's previous token to go on). Returns the table as a string."""
    import numpy as np
    cols, fetch, copy = [], [], []
    for L in lengths:
        for d in depths:
            key = random_key(random.Random(f"{seed}:{L}:attention"))
            mass, ok = key_attention(model, tokenizer, L, d, key, chunk, device)
            answer = passkey_prompt(tokenizer, L, d, key)[1]
            first = next(i for i, t in enumerate(answer) if any(c.isdigit() for c in tokenizer.decode([t])))
            cols.append(f"{L / block_size:g}x d={d:.2f} {'ok' if ok else 'miss'}" if block_size else f"{L} d={d:.2f}")
            fetch.append(mass[..., first].flatten().numpy())
            copy.append(mass[..., first + 1:].mean(-1).flatten().numpy())
    fetch, copy = np.stack(fetch, axis=1), np.stack(copy, axis=1)  # (n_layer·n_head, columns)
    n_head = model.config.n_head
    rows = [f"{i // n_head}.{i % n_head}" for i in range(fetch.shape[0])]
    lines = ["attention mass on the key's tokens per layer.head, fetch / copy: at the query that predicts the key's "
             "first token / mean over the later answer positions",
             "head   " + " | ".join(f"{c:>16}" for c in cols)]
    lines += [f"{r:<6} " + " | ".join(f"{f'{x:.3f} / {y:.3f}':>16}" for x, y in zip(fetch[i], copy[i]))
              for i, r in enumerate(rows)]
    lines += ["fetch: the retrieval step, from the question alone; copy: the later digits, each with the key's previous "
              "token to go on.", "A column: the length (x the training length), d = the key's depth (0: the prompt's "
              "start), ok / miss = the answer was right / wrong." * bool(block_size),
              "A model that retrieves has a head with fetch near 1 at every length; a fetch mass that falls with the "
              "length is a key fading among the far keys."]
    if path:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 1, figsize=(2.5 + 1.1 * len(cols), 2 + 0.7 * len(rows)),
                                 gridspec_kw=dict(hspace=0.45))
        for ax, grid, what in zip(axes, (fetch, copy), ("fetch: the key's first token", "copy: the later ones")):
            im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
            for (r, c), x in np.ndenumerate(grid):
                ax.text(c, r, f"{x:.2f}", ha="center", va="center", fontsize=7, color="w" if x < 0.5 else "k")
            ax.set_xticks(range(len(cols)), [c.replace(" ", "\n", 1) for c in cols], fontsize=7)
            ax.set_yticks(range(len(rows)), rows)
            ax.set_ylabel("layer.head")
            ax.set_title(f"attention mass on the key, {what}", fontsize=9)
        fig.colorbar(im, ax=axes.tolist(), fraction=0.03)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    return "\n".join(lines)


def miss_table(results, block_size=None):
    """Where the wrong answers go wrong (docs/results.md, "The far end at 6,000 steps"): a text table, one row per
    length with misses. Columns: the misses; those with the first character wrong and every later one right (the
    fetch failed: the first character has only the question to go on); those with a later character wrong (the
    copy failed; teacher-forced, each later character has the key's previous one to go on); and the character
    put most often where the key has another, with its count (a default the model falls back on).
    results: run_passkey's dicts (answer and predicted compared character by character, spaces stripped).
    Returns "" if no answer is wrong."""
    from collections import Counter
    lines = []
    for L in sorted({r["length"] for r in results}):
        wrong = Counter()
        first_only = later = misses = 0
        for r in results:
            if r["length"] != L or r["correct"] is not False:
                continue
            a, p = r["answer"].strip(), r["predicted"].strip().ljust(len(r["answer"].strip()))
            bad = [i for i in range(len(a)) if p[i] != a[i]]
            misses += 1
            first_only += bad == [0]
            later += any(i > 0 for i in bad)
            wrong.update(p[i] for i in bad)
        if misses:
            ch, n = wrong.most_common(1)[0] if wrong else ("", 0)
            mult = f"{L / block_size:g}x" if block_size else ""
            lines.append(f"{L:>8} {mult:>6} | {misses:>6} {first_only:>12} {later:>12} | {ch!r:>5} x {n}")
    if not lines:
        return ""
    return "\n".join([f"{'length':>8} {'x':>6} | {'misses':>6} {'first only':>12} {'a later one':>12} | "
                      "most common wrong character"] + lines)


def main(argv=None):
    p = eval_parser(__doc__, "passkey", "teacher_forced")
    p.add_argument("--n_digits", type=positive_int, default=5)
    p.add_argument("--attention", action="store_true",
                   help="diagnostic instead of accuracy: attention mass of every head on the key, at the query that "
                        "predicts the key's first token (fetch) and over the later answer positions (copy), one prompt per length and depth (table, and "
                        "<ckpt dir>/key_attention.png)")
    args = p.parse_args(argv)
    ev = load_eval(p, args, "passkey")
    model, block_size = ev.model, ev.block_size
    if args.attention:
        png = os.path.join(os.path.dirname(ev.ckpt_path), "key_attention.png")
        try:
            print(attention_report(model, ev.tokenizer, ev.lengths, ev.depths, args.seed, args.chunk, args.device,
                                   png, block_size))
        except ValueError as e:
            p.error(str(e))
        print(f"wrote {png} ({time.time() - ev.t0:.1f} s)")
        return
    settings = dict(ckpt_sha256=checkpoint_digest(ev.ckpt_path), lengths=ev.lengths, depths=ev.depths,
                    samples=args.samples, seed=args.seed, mode=args.mode, n_digits=args.n_digits, dtype=args.dtype)
    out, done = resume(ev, settings, args.overwrite)
    cfg = model.config
    meta = dict(ckpt=ev.ckpt_path, pos=cfg.pos, ssmax=cfg.ssmax, block_size=block_size, tokenizer=ev.tokenizer.name,
                iter_num=ev.ckpt.get("iter_num"), mode=args.mode, seed=args.seed, n_digits=args.n_digits,
                title=f"passkey accuracy (%), {ev.name}, block_size {block_size}", settings=settings)
    try:
        results = run_passkey(model, ev.tokenizer, ev.lengths, ev.depths, args.samples, args.seed, args.mode,
                              args.chunk, args.device, args.n_digits, ctx=ev.ctx, batch_size=args.batch_size,
                              done=done, save=lambda rs: write_results(rs, out, meta, finished=False))
    except ValueError as e:
        p.error(str(e))
    print(f"\npasskey accuracy, {ev.name}, {ev.ckpt_path}, block_size {block_size}, mode {args.mode}, "
          f"{args.samples} samples per cell, {time.time() - ev.t0:.1f} s")
    print(format_table(results, block_size))
    misses = miss_table(results, block_size)
    if misses:
        print("\nwhere the misses are (first only: the key's first character wrong, the fetch; a later one: the copy)")
        print(misses)
    paths = write_results(results, out, meta)
    print("wrote " + ", ".join(paths))


if __name__ == "__main__":
    run_script(main)
