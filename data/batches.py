"""
The batches a training run draws (train.py): random windows of a prepared dataset, the
document ids of packed documents (document_mask, SPEC §2), and the on-the-fly synthetic
passkey and NIAH sets. Datasets are prepared by their scripts in data/ (fineweb.py, shakespeare.py,
passkey.py); each leaves train.bin, val.bin (uint16 token ids) and meta.json.
"""

import os

import numpy as np
import torch

from configurator import InputError


def get_batch(data_dir, split, batch_size, block_size, meta, device, generator=None):
    """A random batch (x, y), each (B, T) int64, from data_dir/<split>.bin (uint16 memmap).

    With meta["example_len"] (the synthetic passkey set) windows start at example
    boundaries, and targets that are padding (the tokenizer's EOT) are −1, ignored by the loss;
    otherwise windows start anywhere. Raises InputError if the split is shorter than block_size + 1.
    """
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    if len(data) < block_size + 1:
        raise InputError(f"{split}.bin in {data_dir} has {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}")
    if "example_len" in meta:
        n_examples = (len(data) - block_size - 1) // meta["example_len"] + 1
        ix = torch.randint(n_examples, (batch_size,), generator=generator) * meta["example_len"]
    else:
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix.tolist()])
    if "example_len" in meta:  # passkey prompts are right-padded with EOT: the padding is not in the loss
        from data.tokenizer import TOKENIZERS
        y = y.masked_fill(y == TOKENIZERS[meta["tokenizer"]].eot, -1)
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def document_ids(x, eot):
    """The document id of every token of a batch: (B, T) int64, the number of EOT tokens up to and including it.

    x: (B, T) token ids whose documents each begin with the EOT id `eot` ([EOT] + tokens, as data/fineweb.py
    writes them). Tokens before a row's first EOT belong to a document that began before the window: it
    counts from the window's first token (its positions and SSMax's n start there). For
    GPT.forward(doc_ids=), SPEC §2.
    """
    return torch.cumsum(x == eot, dim=1)


def prepare_data(dataset_name):
    """Return (data_dir, meta). Makes the synthetic passkey set passkey_<tokenizer>_<length> if missing
    (passkey_<tokenizer>_<min>-<max>: prompts of lengths min..max, padded to max), and likewise the RULER NIAH
    set niah_<tokenizer>_<length> (data/niah.py).

    Other datasets must be prepared by their script; read_meta then raises
    FileNotFoundError naming the command.
    """
    from data.tokenizer import data_dir_of, read_meta
    data_dir = data_dir_of(dataset_name)
    parts = os.path.basename(os.path.normpath(dataset_name)).split("_")
    if (not os.path.isfile(os.path.join(data_dir, "meta.json")) and len(parts) == 3 and parts[0] in ("passkey", "niah")
            and parts[2].replace("-", "", 1).isdigit()):
        from data import niah, passkey
        print(f"making the synthetic {parts[0]} set {data_dir} (seconds)")
        lo, _, hi = parts[2].rpartition("-")
        {"passkey": passkey, "niah": niah}[parts[0]].build_dataset(
            parts[1], int(hi), n_train=20000, n_val=500, seed=0, out_dir=data_dir, min_length=int(lo) if lo else None)
    return data_dir, read_meta(data_dir)


class RunData:
    """The data of one training run (train.py): windows of cfg's dataset, and from phase_from on those of the last
    phase (phase_dataset, phase_train_block_size, phase_batch_size). Each dataset is made if missing (by rank 0
    under DDP: proc is distributed.Process) and checked (checks.check_data) before the run writes anything.
    data_dir, meta, window (tokens) and batch_size are those of the data in use; eot is the tokenizer's EOT id with
    document_mask (batches then carry doc_ids), else None. Raises MissingFileError / InputError naming the fix,
    also for a phase_dataset of another tokenizer."""

    def __init__(self, cfg, proc):
        from checks import check_data  # checks imports the model; data/ is imported without it elsewhere
        from data.tokenizer import TOKENIZERS

        def dataset(name, window, window_key):
            data_dir, meta = prepare_data(name) if proc.master else (None, None)
            proc.barrier()  # rank 0 may have just made the data: every other rank reads it after
            if not proc.master:
                data_dir, meta = prepare_data(name)
            check_data(data_dir, meta, window, window_key, cfg["document_mask"])
            return data_dir, meta, window

        self.dev, self.in_phase, self.batch_size = proc.dev, False, cfg["batch_size"]
        window_key = "train_block_size" if cfg["train_block_size"] else "block_size"
        self.data_dir, self.meta, self.window = dataset(cfg["dataset"], cfg["train_block_size"] or cfg["block_size"],
                                                        window_key)
        if cfg["phase_from"] is not None and cfg["phase_from"] < cfg["max_iters"]:  # a phase this run reaches
            window_key = "phase_train_block_size" if cfg["phase_train_block_size"] else window_key
            self.phase = dataset(cfg["phase_dataset"], cfg["phase_train_block_size"] or self.window, window_key) + (
                cfg["phase_batch_size"] or cfg["batch_size"],)
            if self.phase[1]["tokenizer"] != self.meta["tokenizer"]:
                raise InputError(f"phase_dataset={cfg['phase_dataset']!r} uses the {self.phase[1]['tokenizer']!r} "
                                 f"tokenizer, dataset={cfg['dataset']!r} {self.meta['tokenizer']!r}: use one tokenizer")
        self.eot = TOKENIZERS[self.meta["tokenizer"]].eot if cfg["document_mask"] else None

    def batch(self, split):
        """A batch (x, y, doc_ids) of `split` on the device, x and y (batch_size, window): doc_ids (document_ids) with
        document_mask, else None."""
        x, y = get_batch(self.data_dir, split, self.batch_size, self.window, self.meta, self.dev)
        return x, y, None if self.eot is None else document_ids(x, self.eot)

    def enter_phase(self):
        """From here on, batches (training and evaluation) of the last phase's data, window and batch size."""
        self.data_dir, self.meta, self.window, self.batch_size = self.phase
        self.in_phase = True
