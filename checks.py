"""
What train.py checks before it writes anything to out_dir (the settings, the device, the
data, the model), and while it trains (a NaN or infinite loss, gradient or weight).
Every failure is one line that names the fix (configurator.run_script prints it).
"""
import math
import os
from dataclasses import fields

import torch

from configurator import InputError, MissingFileError, NanoPEError, check_device, check_folder_writable
from model import GPT, GPTConfig


def check_settings(cfg):
    """Raise InputError, naming the key, for a setting train() cannot run with. Writes nothing.

    The model's settings are checked by GPTConfig (build_model), the data by check_data.
    """
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if cfg[key] < 1:
            raise InputError(f"{key} must be >= 1, got {cfg[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip", "max_bad_steps",
                "bam_shape_lr_mult", "bam_scale_lr_mult", "ssmax_lr_mult", "phase_from", "phase_lr"):
        if cfg[key] is not None and not cfg[key] >= 0:
            raise InputError(f"need {key} >= 0, got {key}={cfg[key]}")
    for key in ("train_block_size", "phase_train_block_size", "phase_batch_size"):
        if cfg[key] is not None and cfg[key] < 1:
            raise InputError(f"{key} must be >= 1 (or None), got {cfg[key]}")
    in_reach = cfg["phase_from"] is not None and cfg["phase_from"] < cfg["max_iters"]  # a last phase this run trains
    if in_reach and not cfg["phase_dataset"]:
        raise InputError(f"phase_from={cfg['phase_from']} needs the phase's data: set --phase_dataset (e.g. "
                         f"passkey_byte_320-1280), or --phase_from=None for no phase")
    windows = {"train_block_size": cfg["train_block_size"]}
    if in_reach:
        windows["phase_train_block_size"] = cfg["phase_train_block_size"]
    for key, window in windows.items():
        if cfg["pos"] == "learned" and (window or 0) > cfg["block_size"]:
            raise InputError(f"pos='learned' has embeddings for block_size={cfg['block_size']} positions: "
                             f"{key}={window} must not exceed it" +
                             (" (or --phase_from=None: no last phase)" if key.startswith("phase") else ""))
    if not cfg["learning_rate"] > 0:
        raise InputError(f"need learning_rate > 0, got learning_rate={cfg['learning_rate']} "
                         f"(e.g. --learning_rate=1e-3)")
    for key in ("beta1", "beta2", "dropout"):
        if not 0 <= cfg[key] < 1:
            raise InputError(f"need 0 <= {key} < 1, got {key}={cfg[key]}")
    if cfg["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
        raise InputError(f"dtype must be auto, float32, bfloat16 or float16, got {cfg['dtype']!r}")
    if cfg["init_from"] not in ("scratch", "resume"):
        raise InputError(f"init_from must be 'scratch' or 'resume', got {cfg['init_from']!r}")
    if not cfg["out_dir"]:
        raise InputError("out_dir must not be empty: name a folder, e.g. --out_dir=out")
    check_device(cfg["device"])
    check_folder_writable(cfg["out_dir"], "out_dir")


def check_data(data_dir, meta, window, window_key="block_size", document_mask=False):
    """Raise MissingFileError or InputError, naming the command that makes the data or the key to change, unless
    data_dir holds train.bin and val.bin of at least window + 1 tokens each (uint16: 2 bytes a token), a passkey
    or NIAH set (meta["example_len"]) holds examples of exactly window + 1 tokens, and document_mask is asked
    only of documents that begin with EOT (not of those sets, padded with EOT). window_key: the key that sets
    the window (block_size, train_block_size or phase_train_block_size), for the messages."""
    from data.tokenizer import PREPARE_COMMANDS
    remake = meta.get("prepare") or " or ".join(PREPARE_COMMANDS)
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise MissingFileError(f"no {path}: prepare the data again with: {remake}")
        n_tokens = os.path.getsize(path) // 2
        if n_tokens < window + 1:
            raise InputError(f"{path} holds {n_tokens} tokens, fewer than {window_key} + 1 = {window + 1}: prepare "
                             f"the data again ({remake}) or lower --{window_key}")
    if "example_len" in meta and window != meta["example_len"] - 1:
        # windows start at example boundaries: a longer one would not exist, a shorter one would cut off the
        # key and the answer, which come last
        raise InputError(f"{data_dir} holds examples of {meta['example_len'] - 1} tokens (+1 for the targets), "
                         f"not {window_key}={window}: use --{window_key}={meta['example_len'] - 1} or a passkey "
                         f"set of that length (--dataset=passkey_{meta['tokenizer']}_{window}, made on the fly)")
    if document_mask and "example_len" in meta:
        raise InputError(f"document_mask=True needs documents that begin with EOT; {data_dir} pads its passkey "
                         f"prompts with EOT instead: use --document_mask=False")


def model_args_of(cfg, meta):
    """The GPTConfig arguments of a new model: every GPTConfig field from cfg, vocab_size from the dataset's
    tokenizer (meta) unless cfg sets it. Raises InputError if cfg's vocab_size is smaller than the tokenizer's."""
    vocab = meta["vocab_size"] if cfg["vocab_size"] is None else cfg["vocab_size"]
    if cfg["vocab_size"] is None and meta["vocab_size"] > 1000:
        vocab = (vocab + 63) // 64 * 64  # pad GPT-2's 50257 to 50304 for faster matmuls
    if vocab < meta["vocab_size"]:
        raise InputError(f"vocab_size={vocab} is smaller than the dataset's tokenizer ({meta['vocab_size']})")
    return dict({f.name: cfg[f.name] for f in fields(GPTConfig)}, vocab_size=vocab)


def model_config(model_args):
    """GPTConfig(**model_args); its ValueError for a bad model setting becomes an InputError."""
    try:
        return GPTConfig(**model_args)
    except ValueError as e:
        raise InputError(str(e)) from None


def build_model(model_args):
    """GPT(GPTConfig(**model_args)); InputError for a bad model setting (model_config)."""
    return GPT(model_config(model_args))


class NonFiniteError(NanoPEError):
    """The loss, the gradient or the weights became NaN or infinite: train() stopped without saving."""


def finite(*values):
    """True if no value (numbers or 0-d tensors; None is skipped) is NaN or infinite. A GPU sync per tensor."""
    return all(math.isfinite(float(v.detach() if torch.is_tensor(v) else v)) for v in values if v is not None)


def nonfinite_message(what, iter_num, cfg, dtype, last_saved):
    """NonFiniteError's line: what went non-finite at which iteration, the likely causes, the last good
    checkpoint (last_saved: (path, iteration) or None) and what to do."""
    causes = [f"learning_rate={cfg['learning_rate']:g} too high"]
    shape = cfg["bam_shape_init"]
    if cfg["pos"] == "bam" and isinstance(shape, (int, float)) and shape < 0:
        causes.append(f"bam_shape_init={shape} very negative")
    if dtype == "float16":
        causes.append("float16 overflow (--dtype=bfloat16 has float32's range)")
    todo = (f"the last good checkpoint is {last_saved[0]} (iteration {last_saved[1]}): change the setting and go on "
            f"with --init_from=resume" if last_saved else "this run saved no checkpoint: change the setting and start "
            "again")
    return (f"{what} at iteration {iter_num}: training stopped, nothing saved. Likely causes: {', '.join(causes)}; "
            f"{todo} (or let --max_bad_steps=N skip a few bad steps)")
