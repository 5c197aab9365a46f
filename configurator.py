"""
nanoGPT-style configurator for train.py: defaults, then config files (Python files of
key = value), then --key=value overrides, each checked against the default's type.

    cfg = get_config(sys.argv[1:], defaults)

Also what every script shares: nanoPE's error classes, run_script (those errors as one
line), positive_int (an argparse type), output_path (an output file checked before a
long run), resume_or_new (an evaluation cut short goes on), write_atomic and write_json (a
result file written whole or not at all).
"""
import argparse
import ast
import itertools
import json
import os
import sys


class NanoPEError(Exception):
    """An error found by nanoPE's own checks. Its message is one line that names the fix:
    run_script prints it without a traceback and exits with status 1."""


class InputError(NanoPEError, ValueError):
    """A bad setting, argument, input file or dataset (also a ValueError)."""


class MissingFileError(NanoPEError, FileNotFoundError):
    """A missing checkpoint, dataset or input file (also a FileNotFoundError)."""


# the type a value must have for the keys whose default is None (unset)
NONE_DEFAULT_TYPES = {"wandb_run_name": str, "vocab_size": int, "lr_decay_iters": int, "min_lr": float,
                      "train_block_size": int, "phase_from": int, "phase_dataset": str,
                      "phase_train_block_size": int, "phase_batch_size": int, "phase_lr": float, "ssmax_layers": list}
# keys that take a number, a word or a list (e.g. --bam_shape_init=linear, =0.5 or =[0,0.5,1,1]);
# model.GPTConfig checks their values
MIXED_KEYS = ("bam_scale_init", "bam_shape_init", "ssmax_max_n")


def parse_value(key, text, default):
    """Convert the string of --key=value to the type of the key's default.

    bool: True/False (also true/false, 1/0); int: an integer literal; float: any
    number (so --learning_rate=1 works); str: taken as is; a None default: the
    type in NONE_DEFAULT_TYPES (or None). Raises ValueError naming the key.
    """
    if default is None:
        default = NONE_DEFAULT_TYPES.get(key, str)()  # a sample of the expected type: "", 0 or 0.0
        if text == "None":
            return None
    if isinstance(default, bool):
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise InputError(f"--{key} expects True or False, got {text!r}")
    if isinstance(default, str) and key not in MIXED_KEYS:
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if key in MIXED_KEYS:
            if not text.lstrip().startswith(("[", "(")):
                return text  # a word: "linear", "alibi"
            raise InputError(f"--{key}={text} is not a Python literal: write numbers, not expressions "
                             f"(1/3 as 0.3333)") from None
        raise InputError(f"--{key} expects {type(default).__name__}, got {text!r}") from None
    return check_type(key, value, default)


def check_type(key, value, default):
    """Return value if it fits the type of default (int is accepted for float); else ValueError.

    For a None default the type comes from NONE_DEFAULT_TYPES (keys not there take any value)."""
    if value is None or (default is None and key not in NONE_DEFAULT_TYPES):
        return value
    if default is None:
        default = NONE_DEFAULT_TYPES[key]()
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if key in MIXED_KEYS:
        return value
    if type(value) is not type(default):
        raise InputError(f"{key} expects {type(default).__name__}, got {value!r} ({type(value).__name__})")
    return value


def run_config_file(path):
    """Execute the config file `path` (Python, key = value lines); returns its namespace (a dict).

    Raises InputError naming the file and line for a syntax error, or any error while it runs.
    """
    namespace = {}
    with open(path) as f:
        source = f.read()
    try:
        exec(compile(source, path, "exec"), namespace)
    except SyntaxError as e:
        raise InputError(f"config file {path}, line {e.lineno}: {e.msg}: fix its Python syntax "
                         f"(lines of key = value)") from None
    except Exception as e:
        raise InputError(f"config file {path} failed: {type(e).__name__}: {e}") from None
    return namespace


def get_config(argv, defaults):
    """The run's config: defaults, then config files, then --key=value overrides, in argv order.

    argv: list of strings (sys.argv[1:]); defaults: dict of key -> default value.
    Raises InputError (a ValueError) for an unknown key (listing the valid ones), a wrong
    type, a malformed argument or a config file that does not run; MissingFileError (a
    FileNotFoundError) for a missing config file.
    """
    config = dict(defaults)
    valid = ", ".join(sorted(defaults))
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                raise MissingFileError(f"config file {arg} not found (arguments are config files or --key=value)")
            namespace = run_config_file(arg)
            for key, value in namespace.items():
                if key.startswith("_") or type(value).__name__ == "module":
                    continue
                if key not in defaults:
                    raise InputError(f"unknown key {key!r} in {arg}; valid keys: {valid}")
                config[key] = check_type(key, value, defaults[key])
        else:
            if "=" not in arg:
                raise InputError(f"malformed argument {arg!r}: use --key=value")
            key, text = arg[2:].split("=", 1)
            if key not in defaults:
                raise InputError(f"unknown key {key!r}; valid keys: {valid}")
            config[key] = parse_value(key, text, defaults[key])
    return config


def positive_int(text):
    """argparse type: an int >= 1, else argparse's usage error naming the value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def check_device(device):
    """Raise InputError unless device is "auto" or a cpu/cuda torch device that this machine has."""
    if device == "auto":
        return
    import torch  # here: the other helpers run without it
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InputError(f"device={device!r} is not a torch device: use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"device={device}: nanoPE runs on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device={device} but this torch sees no CUDA GPU: use --device=cpu (or auto)")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise InputError(f"device={device} but this machine has {torch.cuda.device_count()} GPU(s)")


def check_folder_writable(folder, what):
    """Raise InputError (naming `what`, e.g. "out_dir") unless `folder` is a writable folder, or
    can be made as one (its nearest existing parent is a writable folder). Creates nothing."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise InputError(f"{what} {folder} cannot be a folder: {existing} is a file; pick another {what}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{what} {folder}: no permission to write in {existing}; pick another {what}")


def output_path(path, siblings=(), overwrite=True):
    """Check, before a long evaluation, that the file `path` can be written; returns the path to write.

    siblings: the extensions of the files written beside it (e.g. (".csv", ".png")). With
    overwrite=False an earlier result is kept: if path or a sibling exists, the first free
    name <stem>-2<ext>, <stem>-3<ext>, ... is returned instead. Creates nothing. Raises
    InputError naming the path if it is a folder or its folder cannot be written.
    """
    if os.path.isdir(path):
        raise InputError(f"--out {path} is a folder: give a file name, e.g. {os.path.join(path, 'results.json')}")
    check_folder_writable(os.path.dirname(os.path.abspath(path)), "--out folder")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise InputError(f"--out {path} is read-only: pick another --out")
    stem, ext = os.path.splitext(path)
    candidate, n = stem, 1
    while not overwrite and any(os.path.exists(candidate + e) for e in (ext,) + tuple(siblings)):
        n += 1
        candidate = f"{stem}-{n}"
    return candidate + ext


def resume_or_new(requested, settings, overwrite, siblings=()):
    """Where an evaluation writes its results JSON, and what it goes on from: (path, results already done).

    The JSON is {"meta": {..., "settings": settings, "finished": bool}, "results": [...]}, rewritten as
    results come (passkey.py, eval_ppl.py). An unfinished one with the same settings at `requested`, or at
    the -2, -3, ... names beside it, is resumed. Every other earlier file is kept: an unfinished run with
    other settings too (never mixed in); this run then takes the first free name (output_path, with the
    sibling extensions written beside it). overwrite: write at `requested` from scratch. Raises InputError
    as output_path.
    """
    if overwrite:
        return output_path(requested, siblings, True), []
    stem, ext = os.path.splitext(requested)
    for n in itertools.count(1):
        candidate = requested if n == 1 else f"{stem}-{n}{ext}"
        if not os.path.exists(candidate):
            break
        try:
            with open(candidate) as f:
                earlier = json.load(f)
            meta, done = earlier["meta"], earlier["results"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not such a result: kept
        if meta.get("finished") is False:
            if meta.get("settings") == settings:
                return candidate, done
            print(f"{candidate} holds an unfinished run with other settings: kept as it is")
    return output_path(requested, siblings, False), []


def write_atomic(path, write):
    """Write the file `path` all at once or not at all: write(tmp) fills a temporary file beside it (same
    extension, so a plot library infers the format; the process id in its name, so two processes writing the
    same file never share one), which then replaces `path` in one rename. A crash or a full disk never
    leaves a partial file that looks complete. Raises NanoPEError (one line: the path, the reason, the fix)
    if the write fails; the temporary file is removed and `path` is as it was.
    """
    stem, ext = os.path.splitext(path)
    tmp = f"{stem}.tmp{os.getpid()}{ext}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise NanoPEError(f"could not write {path} ({e.strerror or e}): free some space or pick another --out, "
                          f"then run the same command again ({os.path.basename(path)} is as it was)") from None


def write_json(path, obj, indent=1):
    """Write obj as JSON to path, whole or not at all (write_atomic; raises NanoPEError as it)."""
    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
    write_atomic(path, dump)


def run_script(main):
    """Run a script's main() (train.py, sample.py, passkey.py, eval_ppl.py, sweep.py, data/*.py).

    nanoPE's own errors (NanoPEError and its subclasses InputError and MissingFileError:
    a bad config, a missing checkpoint or dataset, a diverged run, a full disk) end the script
    with their one-line message, which names the fix, and exit status 1. Any other exception,
    such as a ValueError raised inside torch or another library, keeps its traceback. Ctrl-C
    ends the script with status 130 and no traceback.
    """
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except NanoPEError as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {e}")
