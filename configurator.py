"""
nanoGPT-style configurator for train.py: defaults, then config files (Python files of
key = value), then --key=value overrides, each checked against the default's type.

    cfg = get_config(sys.argv[1:], defaults)

Also the command-line helpers every script uses: run_script (nanoPE's own errors as one
line) and positive_int (an argparse type).
"""
import argparse
import ast
import os
import sys
import traceback

# the type a value must have for the keys whose default is None (unset)
NONE_DEFAULT_TYPES = {"wandb_run_name": str, "vocab_size": int, "lr_decay_iters": int, "min_lr": float}
# keys that take a number, a word or a list (e.g. --bam_shape_init=linear, =0.5 or =[0,0.5,1,1]);
# model.GPTConfig checks their values
MIXED_KEYS = ("bam_scale_init", "bam_shape_init")


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
        raise ValueError(f"--{key} expects True or False, got {text!r}")
    if isinstance(default, str) and key not in MIXED_KEYS:
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if key in MIXED_KEYS:
            return text
        raise ValueError(f"--{key} expects {type(default).__name__}, got {text!r}") from None
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
        raise ValueError(f"{key} expects {type(default).__name__}, got {value!r} ({type(value).__name__})")
    return value


def get_config(argv, defaults):
    """The run's config: defaults, then config files, then --key=value overrides, in argv order.

    argv: list of strings (sys.argv[1:]); defaults: dict of key -> default value.
    Raises ValueError for an unknown key (listing the valid ones), a wrong type or
    a malformed argument; FileNotFoundError for a missing config file.
    """
    config = dict(defaults)
    valid = ", ".join(sorted(defaults))
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                raise FileNotFoundError(f"config file {arg} not found (arguments are config files or --key=value)")
            namespace = {}
            with open(arg) as f:
                exec(f.read(), namespace)
            for key, value in namespace.items():
                if key.startswith("_") or type(value).__name__ == "module":
                    continue
                if key not in defaults:
                    raise ValueError(f"unknown key {key!r} in {arg}; valid keys: {valid}")
                config[key] = check_type(key, value, defaults[key])
        else:
            if "=" not in arg:
                raise ValueError(f"malformed argument {arg!r}: use --key=value")
            key, text = arg[2:].split("=", 1)
            if key not in defaults:
                raise ValueError(f"unknown key {key!r}; valid keys: {valid}")
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


def run_script(main):
    """Run a script's main() (train.py, sample.py, passkey.py, eval_ppl.py, sweep.py, data/*.py).

    A ValueError or FileNotFoundError raised by nanoPE's own checks (code in this repository:
    a bad config, a missing checkpoint or dataset) ends the script with its one-line message,
    which names the fix, and exit status 1; one raised inside torch or another library keeps
    its traceback. Ctrl-C ends the script with status 130 and no traceback.
    """
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except (ValueError, FileNotFoundError) as e:
        where = os.path.abspath(traceback.extract_tb(e.__traceback__)[-1].filename)
        if not where.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep):
            raise
        sys.exit(f"{os.path.basename(sys.argv[0])}: {e}")
