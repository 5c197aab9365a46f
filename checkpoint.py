"""
Checkpoint files of train.py: read with one-line errors, resume with a fallback to the
earlier checkpoint kept beside ckpt.pt (the settings and the model of a resumed run are the
checkpoint's: resume_config, resume_checkpoint), written atomically with one-line disk errors.

out_dir/ckpt.pt is the run's checkpoint. A new run (init_from=scratch) in an out_dir that
holds one moves it to ckpt.pt.prev when it writes its own first checkpoint; train.py refuses
to start such a run while ckpt.pt.prev is taken too, so no run overwrites another's checkpoint.
An out_dir belongs to one run at a time (hold_out_dir): a second run there stops at once.
Ctrl-C while a run trains asks for a checkpoint at the end of the iteration (CtrlC).
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time

import filelock
import torch
from tqdm import tqdm

from configurator import InputError, MissingFileError, NanoPEError, check_device, get_config, write_json

OWNER = "running.json"  # in out_dir while a run holds it: who (pid, host, command, start time)


def _owner(path):
    """'pid 123 on host, started <time>: <command>' from a running.json, or a note that it is unreadable."""
    try:
        with open(path) as f:
            o = json.load(f)
        return f"pid {o['pid']} on {o['host']}, started {o['started']}: {o['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that left no readable " + OWNER


def hold_out_dir(out_dir):
    """Make out_dir this process's until it calls the returned release() or dies: an OS lock on out_dir/.lock
    (filelock; the operating system drops it when the process ends, kill -9 included) and out_dir/running.json
    (pid, host, command, start time) while the run lasts. A running.json whose lock is gone (a run that was
    killed) is taken over, with a note on stdout. Raises InputError (one line: the other run's process and
    command, the fix) if a live process holds out_dir; nothing in out_dir is changed then.
    """
    os.makedirs(out_dir, exist_ok=True)
    owner = os.path.join(out_dir, OWNER)
    lock = filelock.FileLock(os.path.join(out_dir, ".lock"), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise InputError(f"{out_dir} is in use by another run ({_owner(owner)}): wait for it to end or stop it, "
                         f"or give this run another --out_dir") from None
    if os.path.exists(owner):
        print(f"{out_dir}: taking over from a run that ended without letting go ({_owner(owner)}; "
              f"its process is gone)")
    write_json(owner, dict(pid=os.getpid(), host=socket.gethostname(), command=" ".join(sys.argv),
                           started=time.strftime("%Y-%m-%d %H:%M:%S")))

    def release():
        if os.path.exists(owner):
            os.remove(owner)
        lock.release()
    return release


class CtrlC:
    """Ctrl-C while a run trains, in one process (not DDP) and its main thread: the first sets `requested` (the run
    checkpoints at the end of its iteration, then stops), a second raises KeyboardInterrupt at once. Elsewhere
    (DDP, another thread) it does nothing. close() puts the earlier SIGINT handler back."""

    def __init__(self, active):
        self.requested = False
        self.active = active and threading.current_thread() is threading.main_thread()
        if self.active:
            self.previous = signal.signal(signal.SIGINT, self.on_sigint)

    def on_sigint(self, signum, frame):
        if self.requested:
            self.close()
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write("Ctrl-C: checkpointing at the end of this iteration (Ctrl-C again to stop at once)")

    def close(self):
        if self.active:
            signal.signal(signal.SIGINT, self.previous)
            self.active = False


PREV = ".prev"  # suffix of the earlier checkpoint kept beside ckpt.pt


def prev_path(path):
    """Where the checkpoint at `path` keeps the earlier one: path + ".prev"."""
    return path + PREV


def _read(path, map_location, mmap):
    """torch.load(path, weights_only=True) of a train.py checkpoint; NanoPEError naming the problem (no fix)."""
    if not os.path.isfile(path):
        raise MissingFileError(f"no checkpoint at {path}")
    size = os.path.getsize(path)
    if size == 0:
        raise InputError(f"{path} is empty (0 bytes: an interrupted copy or a full disk?)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # EOFError, KeyError, RuntimeError (zip), UnpicklingError ... for a bad file
        reason = (str(e).splitlines() or [""])[0][:90]
        raise InputError(f"{path} ({size:,} bytes) is truncated, damaged or not a PyTorch checkpoint "
                         f"({type(e).__name__}: {reason})") from None
    if not isinstance(ckpt, dict) or not {"model", "model_args"} <= ckpt.keys():
        raise InputError(f"{path} is not a checkpoint written by train.py (no model and model_args in it)")
    return ckpt


def read_checkpoint(path, map_location="cpu", mmap=False):
    """The dict train.py saved at `path` (torch.load with weights_only=True; mmap=True reads lazily).

    Raises MissingFileError if there is no file, InputError if it is empty, truncated, damaged
    or not a train.py checkpoint; the one-line message names the fix (path.prev if it exists).
    """
    try:
        return _read(path, map_location, mmap)
    except NanoPEError as e:
        prev = path + PREV
        if os.path.isfile(prev):
            fix = f"the earlier checkpoint {prev} is kept beside it (--ckpt={prev})"
        elif isinstance(e, MissingFileError):
            fix = "train one first, e.g. `python train.py --out_dir=...`"
        else:
            fix = "restore it from a copy, or train again"
        raise type(e)(f"{e}; {fix}") from None


def load_resume_checkpoint(out_dir, mmap=False):
    """The checkpoint a resumed run goes on from: (path, checkpoint dict, note).

    out_dir/ckpt.pt; if it is missing or unreadable, the earlier out_dir/ckpt.pt.prev, with a
    note (one line) that says so (else note is None). Raises MissingFileError or InputError,
    naming both files, if neither can be read.
    """
    path = os.path.join(out_dir, "ckpt.pt")
    prev = path + PREV
    try:
        return path, _read(path, "cpu", mmap), None
    except NanoPEError as e:
        problem = e
    if not os.path.isfile(prev):
        raise type(problem)(f"init_from=resume but {problem} (nor {prev}): train a run there first "
                            f"(--init_from=scratch)") from None
    try:
        ckpt = _read(prev, "cpu", mmap)
    except NanoPEError as e:
        raise InputError(f"init_from=resume but neither checkpoint can be read: {problem}; {e}. Start a new run "
                         f"(--init_from=scratch)") from None
    return prev, ckpt, (f"resume: {problem}; going on from {prev}, the earlier checkpoint kept beside it "
                        f"(iteration {ckpt.get('iter_num')})")


def _nbytes(obj):
    """Bytes of the tensors in obj (nested dicts, lists and tuples)."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def _size(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def save_checkpoint(path, ckpt, keep_previous=False):
    """Write ckpt to path atomically: torch.save to path.tmp, then a rename, so a crash never
    leaves a half-written checkpoint. keep_previous: an existing path becomes path.prev.

    Raises NanoPEError (one line naming the path, the space it needs and the space free) if
    the write fails, e.g. on a full disk; the .tmp file is removed and path is as it was.
    """
    tmp = path + ".tmp"
    try:
        torch.save(ckpt, tmp)
    except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as a RuntimeError
        if os.path.exists(tmp):
            os.remove(tmp)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else (str(e).splitlines() or [""])[0][:90]
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        raise NanoPEError(f"could not write {path} ({reason}): a checkpoint needs about {_size(_nbytes(ckpt))}, "
                          f"{_size(free)} are free there; free some space and go on with --init_from=resume "
                          f"({os.path.basename(path)} is as it was, the partial .tmp removed)") from None
    if keep_previous and os.path.isfile(path):
        os.replace(path, path + PREV)
    os.replace(tmp, path)


def checkpoint_digest(path):
    """sha256 of a checkpoint file (hex): an evaluation resumed from its results must score the same weights."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def truncate_log(path, size):
    """Cut log.txt back to `size` bytes, its size when the checkpoint a run resumes from was written: the
    lines a killed run wrote after it go (the resumed run writes them again). size None: leave it."""
    if size is not None and os.path.isfile(path) and os.path.getsize(path) > size:
        with open(path, "r+b") as f:
            f.truncate(size)


def resume_config(argv, defaults, out_dir):
    """The config of --init_from=resume: the settings saved in out_dir/ckpt.pt (or ckpt.pt.prev), then
    what argv names. So the learning-rate schedule is the saved run's unless argv names one of its keys.

    A run saved before lr_decay_iters had a fixed default (lr_decay_iters=None) keeps its max_iters as it.
    """
    path, ckpt, _ = load_resume_checkpoint(out_dir, mmap=True)
    saved = {k: v for k, v in ckpt.get("config", {}).items() if k in defaults}
    if "lr_decay_iters" in saved and saved["lr_decay_iters"] is None:
        saved["lr_decay_iters"] = saved.get("max_iters")
    cfg = get_config(argv, dict(defaults, **saved))
    print(f"resume: the settings of {path}, with {' '.join(argv)}")
    changed = [f"{k}={saved[k]} -> {cfg[k]}" for k in ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters",
                                                       "decay_lr") if k in saved and cfg[k] != saved[k]]
    if changed:
        print(f"resume: the learning-rate schedule changes from iteration {ckpt.get('iter_num')} on: "
              f"{', '.join(changed)}")
    return cfg


def resume_checkpoint(cfg, tokenizer, master=True):
    """The checkpoint a resumed run (init_from=resume) goes on from: out_dir/ckpt.pt, or ckpt.pt.prev if that cannot
    be read (load_resume_checkpoint). The model is the checkpoint's: its model_args go into cfg (a model key that cfg
    sets otherwise is ignored, with a note from rank 0 (master)). Returns (path, ckpt, finished): finished is the
    last evaluation's losses {"train", "val"} if the checkpoint is at max_iters already (nothing to train; not for
    eval_only), else None. Raises InputError if the checkpoint was trained with another tokenizer than `tokenizer`
    (the dataset's)."""
    path, ckpt, note = load_resume_checkpoint(cfg["out_dir"])
    if note and master:
        print(note)
    if ckpt["tokenizer"] != tokenizer:
        raise InputError(f"the checkpoint was trained with the {ckpt['tokenizer']!r} tokenizer but dataset "
                         f"{cfg['dataset']!r} uses {tokenizer!r}: pick a dataset in the checkpoint's tokenizer")
    ignored = [f"{k}={cfg[k]!r} (checkpoint: {v!r})" for k, v in ckpt["model_args"].items()
               if cfg.get(k) is not None and cfg[k] != v]
    if ignored and master:
        print(f"resume: the model is the checkpoint's; ignoring {', '.join(ignored)}")
    cfg.update({k: v for k, v in ckpt["model_args"].items() if k in cfg})
    if ckpt["iter_num"] >= cfg["max_iters"] and not cfg["eval_only"]:
        if master:
            print(f"{path} is at iteration {ckpt['iter_num']}, max_iters={cfg['max_iters']}: nothing to train (raise "
                  f"--max_iters to go on)")
        _, train_loss, val_loss = ckpt["history"][-1]
        return path, ckpt, {"train": train_loss, "val": val_loss}
    return path, ckpt, None


def keeps_previous(cfg, master=True):
    """Whether a new run (init_from=scratch) in cfg's out_dir keeps the run already there: True if out_dir/ckpt.pt
    exists and the new run will save (max_iters > 0, not eval_only); that ckpt.pt then becomes ckpt.pt.prev at the
    new run's first save (save_checkpoint(keep_previous=True)), with a note from rank 0 (master). Raises InputError
    if ckpt.pt.prev is taken too: the new run would replace one of them."""
    path = os.path.join(cfg["out_dir"], "ckpt.pt")
    if not (os.path.isfile(path) and cfg["max_iters"] > 0 and not cfg["eval_only"]):
        return False
    if os.path.exists(prev_path(path)):
        raise InputError(f"{cfg['out_dir']} holds a run (ckpt.pt) and an earlier one (ckpt.pt.prev): a new run there "
                         f"would replace one. Go on with it (--init_from=resume), use a new --out_dir, or delete "
                         f"{prev_path(path)}")
    if master:
        print(f"{cfg['out_dir']} holds another run: its ckpt.pt becomes ckpt.pt.prev when this run saves its first "
              f"checkpoint (to go on with that run use --init_from=resume; for a new one, a new --out_dir)")
    return True


def load_checkpoint(path, device="cpu"):
    """Load a checkpoint written by train.py: returns (model, checkpoint dict).

    Reads with torch.load(weights_only=True) (checkpoint.read_checkpoint); strips torch.compile's
    '_orig_mod.' prefixes. Raises MissingFileError naming the training command if path is missing,
    InputError (one line, naming the fix) for an unreadable file, a device this torch cannot use,
    or non-finite weights (a run that diverged).
    """
    from model import GPT, GPTConfig  # here: the model is not needed to read or write checkpoints
    check_device(device)
    ckpt = read_checkpoint(path, map_location=device)
    try:
        model = GPT(GPTConfig(**ckpt["model_args"]))
    except ValueError as e:  # settings this version refuses
        raise InputError(f"{path}: {e}") from None
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise InputError(f"{path} holds NaN or infinite weights ({bad[0]}, ...): its run diverged; use an earlier "
                         f"checkpoint (e.g. {path}.prev) or train again with a lower learning_rate")
    model.load_state_dict(state)
    return model.to(device), ckpt
