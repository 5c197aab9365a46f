"""
Checkpoint files of train.py: read with one-line errors, resume with a fallback to the
earlier checkpoint kept beside ckpt.pt, written atomically with one-line disk errors.

out_dir/ckpt.pt is the run's checkpoint. A new run (init_from=scratch) in an out_dir that
holds one moves it to ckpt.pt.prev when it writes its own first checkpoint; train.py refuses
to start such a run while ckpt.pt.prev is taken too, so no run overwrites another's checkpoint.
An out_dir belongs to one run at a time (hold_out_dir): a second run there stops at once.
"""
import hashlib
import json
import os
import shutil
import socket
import sys
import time

import filelock
import torch

from configurator import InputError, MissingFileError, NanoPEError, write_json

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
