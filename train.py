"""
Train a nanoPE GPT. With no arguments it runs the CPU demo (a small byte-level
model with GGD-BAM + SSMax on the synthetic passkey set, then a last phase on longer prompts; about 10
minutes on 2 CPU cores, after which it retrieves the passkey at its training length and far past it). Examples:

    python train.py                                   # the CPU demo
    python train.py --pos=rope --ssmax=False --out_dir=out-rope   # the demo with another variant
    python train.py config/shakespeare_byte.py        # a preset (a Python file of key = value)
    python train.py config/fineweb_gpt2s.py --pos=alibi --ssmax=True
    torchrun --standalone --nproc_per_node=8 train.py config/fineweb_gpt2s.py   # DDP

Every key below, and every field of model.GPTConfig (the model keys, with GPTConfig's defaults;
the demo's own values are in config/cpu_demo.py), can be set in a config file or as --key=value; unknown keys and
values of the wrong type are refused with the list of valid keys (`--help` lists
them). `--init_from=resume` goes on with the run in --out_dir, with that run's
settings: the command line changes only the keys it names (e.g. --max_iters). The
learning-rate schedule does not depend on max_iters, so a run stopped at 20 iterations
and resumed to 40 equals a run of 40 (docs/training.md, "Checkpoints and resuming").
"""

import json
import math
import os
import sys
import time
from dataclasses import fields

import torch
from tqdm import tqdm

import distributed
from checkpoint import (CtrlC, hold_out_dir, keeps_previous, prev_path, resume_checkpoint, resume_config,
                        save_checkpoint, truncate_log)
from checks import (NonFiniteError, build_model, check_settings, finite, model_args_of, model_config,
                    nonfinite_message)
from data.batches import RunData
from configurator import InputError, get_config, run_script
from attention_tapa import TAPA_PHASES
from model import ATTN_IMPLS, POS_VARIANTS, GPTConfig
from plots import plot_history, plot_priors

# -----------------------------------------------------------------------------
# defaults of the training keys. The model keys are model.GPTConfig's fields, with its defaults (default_config).
# `python train.py` with no config file runs the CPU demo: these defaults, then config/cpu_demo.py (DEMO_CONFIG),
# the one place that holds the demo's own values.
# I/O
out_dir = "out"
eval_interval = 500
log_interval = 10
eval_iters = 20
eval_only = False
always_save_checkpoint = True  # save at every eval (needed for an exact resume); else only on a better val loss
init_from = "scratch"  # "scratch" or "resume" (from out_dir/ckpt.pt)
wandb_log = False
wandb_project = "nanope"
wandb_run_name = None  # default: "<pos>[+ssmax]"
# data
# a folder under data/ (or a path); the synthetic passkey_<tokenizer>_<length> is made if missing
dataset = "passkey_byte_320"
gradient_accumulation_steps = 1
batch_size = 8
# tokens per training window; None: block_size. Longer windows train the model past block_size, the length passkey.py
# calls 1x (not for pos=learned); the phase_ keys below set the window of a last phase on longer prompts
train_block_size = None
# a last phase on other data, in one run (the demo's: 300 steps on prompts of 320-1,280 bytes after 2,000 on 320):
# from iteration phase_from on, batches of phase_batch_size windows of phase_train_block_size tokens from
# phase_dataset, at the constant learning rate phase_lr. Evaluation uses the data being trained on. The run equals a
# run stopped at phase_from and resumed with those settings (--dataset, --train_block_size, --batch_size, and
# --min_lr once the cosine has ended). phase_from=None: no phase (the other phase_ keys are then unused)
phase_from = None
phase_dataset = None
phase_train_block_size = None  # None: train_block_size
phase_batch_size = None  # None: batch_size
phase_lr = None  # None: the schedule's (get_lr)
document_mask = False  # attend only within each document of a window; documents begin with EOT (see document_ids)
# AdamW and the learning-rate schedule (warmup, then cosine decay to min_lr)
learning_rate = 1e-3
max_iters = 2000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
max_bad_steps = 0  # > 0: skip a step with a non-finite loss or gradient, up to this many (checks every step); 0: stop
decay_lr = True
# learning-rate multipliers of the positional parameters (no weight decay on them; SPEC §1, §2)
bam_shape_lr_mult = 1.0  # β of the BAM prior
bam_scale_lr_mult = 1.0  # θ_scale = log c of the BAM prior
ssmax_lr_mult = 1.0  # SSMax's s
warmup_iters = 100
lr_decay_iters = 2000  # the cosine reaches min_lr here, whatever max_iters is (a longer run stays at min_lr after)
min_lr = None  # default: learning_rate / 10
# system
device = "auto"  # "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", ...
dtype = "auto"  # "auto" (bfloat16 on CUDA where supported, else float32), "float32", "bfloat16", "float16"
compile = False
backend = "nccl"  # DDP backend on CUDA; gloo is used on CPU
seed = 1337
# -----------------------------------------------------------------------------
TRAIN_KEYS = [k for k, v in list(globals().items())
              if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))]
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
DEMO_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "cpu_demo.py")


def default_config():
    """Every key train.py takes, at its default: the training keys above, then every model.GPTConfig field at its
    default there, except vocab_size: None here, i.e. the dataset's (padded to a multiple of 64 for GPT-2's BPE)."""
    cfg = {k: globals()[k] for k in TRAIN_KEYS}
    cfg.update({f.name: f.default for f in fields(GPTConfig)}, vocab_size=None)
    return cfg


def demo_config(argv=()):
    """The config of `python train.py argv` when argv names no config file: default_config(), then
    config/cpu_demo.py, then argv (--key=value)."""
    return get_config([DEMO_CONFIG] + list(argv), default_config())


CONFIG_KEYS = list(default_config())


def get_lr(it, cfg):
    """Learning rate at iteration it: linear warmup, cosine decay to min_lr, then min_lr; phase_lr in the last
    phase (from phase_from on) if it is set."""
    if cfg["phase_from"] is not None and it >= cfg["phase_from"] and cfg["phase_lr"] is not None:
        return cfg["phase_lr"]
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    lr, min_lr, warmup, decay_iters = cfg["learning_rate"], cfg["min_lr"], cfg["warmup_iters"], cfg["lr_decay_iters"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / max(1, decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


PRIOR_NAMES = {"shape": "BAM shape beta", "scale": "BAM scale c", "ssmax": "SSMax s"}


def train(cfg):
    """Run training with the config dict cfg (as get_config returns). Returns the final eval losses.

    Raises InputError / MissingFileError for a bad setting, dataset or checkpoint before anything is written
    to out_dir; NonFiniteError if the loss, gradient or weights become NaN/inf (nothing non-finite is saved);
    NanoPEError if a checkpoint cannot be written (a full disk). All are one line for run_script.
    """
    run = Run(cfg)
    run.setup()  # settings checked; device, dtype, DDP
    run.load_data()  # the dataset (the synthetic passkey set is made if missing), checked
    finished = run.init_or_resume()  # model and optimizer: from scratch or from out_dir/ckpt.pt
    if finished is not None:  # a resumed run that has nothing left to train
        return finished
    try:
        run.start()  # out_dir held (one run at a time), the first write there: log.txt, Ctrl-C handler, progress bar
        return run.loop()  # evaluate and checkpoint every eval_interval, train in between
    finally:
        run.close()  # progress bar, Ctrl-C handler and DDP put back, also after an error


class Run:
    """The state one training run shares between the steps of train(): self.cfg (the settings, completed),
    this process (proc: distributed.Process: device, dtype, DDP rank), the data (data: data.batches.RunData), the
    model (model: compiled/DDP-wrapped; raw_model: the GPT itself), the optimizer, and the
    progress (iter_num, best_val_loss, history, prior_history, last_saved)."""

    def __init__(self, cfg):
        self.cfg = dict(cfg)
        self.settings = dict(cfg)  # what checkpoints record: the settings as given, the model's own below
        self.bar, self.ctrl_c, self.release_out_dir = None, None, None

    # ---------------------------------------------------------------- setup: settings, device, dtype, DDP

    def setup(self):
        cfg = self.cfg
        check_settings(cfg)  # everything is checked (settings, data, checkpoint, model) before out_dir is written
        cfg["lr_decay_iters"] = cfg["lr_decay_iters"] or cfg["max_iters"]
        cfg["min_lr"] = cfg["learning_rate"] / 10 if cfg["min_lr"] is None else cfg["min_lr"]
        self.proc = distributed.setup(cfg)  # device, dtype, DDP; divides gradient_accumulation_steps among ranks

    @property
    def tokens_per_iter(self):
        """Tokens of one iteration over all processes (the last phase's window and batch size once it has begun)."""
        return self.cfg["gradient_accumulation_steps"] * self.proc.world * self.data.batch_size * self.data.window

    def load_data(self):
        """The dataset (and the last phase's), made if missing and checked against the training window."""
        self.data = RunData(self.cfg, self.proc)

    def enter_phase(self):
        """From here on train (and evaluate) on the last phase's data, windows and batch size."""
        cfg = self.cfg
        self.data.enter_phase()
        lr = "the schedule's learning rate" if cfg["phase_lr"] is None else f"learning rate {cfg['phase_lr']:g}"
        self.log(f"phase from iteration {self.iter_num} (phase_from={cfg['phase_from']}): {self.data.data_dir}, "
                 f"{self.data.batch_size} windows of {self.data.window} tokens ({self.tokens_per_iter:,} tokens per "
                 f"iteration), {lr}")

    # ---------------------------------------------------------------- init or resume

    def init_or_resume(self):
        """Build the model and optimizer, from scratch or from out_dir/ckpt.pt (or the earlier ckpt.pt.prev if that
        cannot be read). Returns the final losses if a resumed run has nothing left to train, else None."""
        cfg = self.cfg
        self.ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
        self.keep_previous, self.last_saved, self.log_size = False, None, None
        ckpt = None
        if cfg["init_from"] == "resume":  # the model is the checkpoint's: its settings go into cfg
            self.resumed_from, ckpt, finished = resume_checkpoint(cfg, self.data.meta["tokenizer"], self.proc.master)
            if finished is not None:
                return finished
            self.model_args = ckpt["model_args"]
        else:
            self.model_args = model_args_of(cfg, self.data.meta)
        model = build_model(self.model_args)  # InputError for a bad model setting
        if cfg["init_from"] == "scratch":  # an earlier run's ckpt.pt becomes ckpt.pt.prev at this run's first save
            self.keep_previous = keeps_previous(cfg, self.proc.master)
        self.settings.update({k: v for k, v in self.model_args.items() if k in self.settings})
        if ckpt is not None:
            model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
        model.to(self.proc.dev)
        self.lr_mults = {"bam_shape": cfg["bam_shape_lr_mult"], "bam_scale": cfg["bam_scale_lr_mult"],
                         "ssmax": cfg["ssmax_lr_mult"]}
        self.optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                                    (cfg["beta1"], cfg["beta2"]), self.proc.device_type, self.lr_mults)
        self.iter_num, self.best_val_loss, self.history, self.prior_history = 0, 1e9, [], []
        if ckpt is not None:
            self.restore(ckpt)
        self.scaler = torch.amp.GradScaler(self.proc.device_type, enabled=(self.proc.dtype == "float16"))
        self.raw_model = model
        self.model = self.proc.wrap(torch.compile(model) if cfg["compile"] else model)  # DDP under torchrun
        return None

    def restore(self, ckpt):
        """The optimizer, the progress and every process's random state from the checkpoint."""
        self.optimizer.load_state_dict(ckpt["optimizer"])
        for group in self.optimizer.param_groups:  # the multipliers of this run's settings
            group["lr_mult"] = self.lr_mults.get(group["name"], 1.0)
        self.iter_num, self.best_val_loss, self.history = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["history"]
        self.prior_history = ckpt.get("prior_history", [])
        # every process goes on with its own random state (batches, dropout), saved by rank
        rng_states = ckpt.get("rng_states") or [(ckpt["rng_cpu"], ckpt.get("rng_cuda"))]
        if not self.proc.set_rng_states(rng_states, self.cfg["seed"], self.iter_num) and self.proc.master:
            print(f"resume: the checkpoint was written by {len(rng_states)} process(es), this run has "
                  f"{self.proc.world}: new random streams (batches differ from an uninterrupted run)")
        self.last_saved = (self.resumed_from, self.iter_num)
        # log.txt back to where this checkpoint was written (not for eval_only, or from ckpt.pt.prev: kept whole)
        if self.resumed_from == self.ckpt_path and not self.cfg["eval_only"]:
            self.log_size = ckpt.get("log_size")
        if self.proc.master:
            print(f"resuming {self.resumed_from} at iteration {self.iter_num} of {self.cfg['max_iters']}")

    # ---------------------------------------------------------------- start and end: log, Ctrl-C, DDP

    def start(self):
        cfg = self.cfg
        if self.proc.master:  # out_dir is this run's until it ends; a second run there stops here (checkpoint.py)
            self.release_out_dir = hold_out_dir(cfg["out_dir"])
        if cfg["wandb_log"] and self.proc.master:
            try:
                import wandb
            except ImportError:
                raise InputError("wandb_log=True needs wandb (not in requirements.txt): pip install wandb") from None
            wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"] or
                       f"{cfg['pos']}{'+ssmax' if cfg['ssmax'] else ''}", config=cfg)
        os.makedirs(cfg["out_dir"], exist_ok=True)  # the first write to out_dir
        self.log_file = os.path.join(cfg["out_dir"], "log.txt")
        if cfg["init_from"] == "resume" and self.proc.master:
            truncate_log(self.log_file, self.log_size)
        self.log(f"nanoPE: pos={cfg['pos']} ssmax={cfg['ssmax']} | {self.raw_model.get_num_params() / 1e6:.2f}M "
                 f"parameters | device {self.proc.dev} ({self.proc.dtype}) | {self.proc.world} process(es) | "
                 f"{self.tokens_per_iter:,} tokens per iteration | data {self.data.data_dir} "
                 f"({self.data.meta['tokenizer']})")
        phase_sets_lr = cfg["phase_from"] is not None and cfg["phase_lr"] is not None
        if cfg["decay_lr"] and cfg["max_iters"] > cfg["lr_decay_iters"] and not (
                phase_sets_lr and cfg["phase_from"] <= cfg["lr_decay_iters"]):
            self.log(f"note: the learning rate reaches min_lr at lr_decay_iters={cfg['lr_decay_iters']} and stays "
                     f"there to max_iters={cfg['max_iters']} (--lr_decay_iters={cfg['max_iters']} stretches the "
                     f"cosine)")
        self.bar = tqdm(total=cfg["max_iters"], initial=self.iter_num, disable=not self.proc.master, dynamic_ncols=True,
                        desc="train")
        # Ctrl-C (one process, not DDP): finish the iteration, write a checkpoint that resumes exactly, stop.
        # A second Ctrl-C stops at once.
        self.ctrl_c = CtrlC(active=not self.proc.ddp)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.release_out_dir is not None:
            self.release_out_dir()
            self.release_out_dir = None
        if self.ctrl_c is not None:
            self.ctrl_c.close()
        self.proc.close()  # DDP's process group

    def log(self, msg):
        if self.proc.master:
            tqdm.write(msg)
            with open(self.log_file, "a") as f:
                f.write(msg + "\n")

    # ---------------------------------------------------------------- the loop

    def loop(self):
        """Evaluate (and checkpoint) every eval_interval iterations and at the end, train in between.
        Returns the last evaluation's losses."""
        cfg = self.cfg
        self.start_iter, self.losses, self.bad_steps = self.iter_num, None, 0
        self.t_last = time.time()
        while True:
            # evaluate and checkpoint (not at the iteration a resumed run starts from: it did that already)
            if self.iter_num % cfg["eval_interval"] == 0 and (self.iter_num != self.start_iter or self.iter_num == 0) \
                    or self.iter_num == cfg["max_iters"] or cfg["eval_only"]:
                self.evaluate_and_save()
            if self.iter_num >= cfg["max_iters"] or cfg["eval_only"]:
                return self.losses
            if cfg["phase_from"] is not None and self.iter_num >= cfg["phase_from"] and not self.data.in_phase:
                self.enter_phase()  # after the evaluation at phase_from, which is still on the first data
            if self.ctrl_c.requested:
                self.stop_interrupted()
            self.step()

    @torch.no_grad()
    def estimate_loss(self):
        """Mean loss over eval_iters batches of each split (rank 0 evaluates alone: no DDP collectives)."""
        cfg, eval_model = self.cfg, self.model.module if self.proc.ddp else self.model
        out = {}
        self.model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(cfg["eval_iters"])
            for k in range(cfg["eval_iters"]):
                X, Y, doc_ids = self.data.batch(split)
                with self.proc.ctx:
                    _, loss = eval_model(X, Y, doc_ids=doc_ids)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        self.model.train()
        return out

    def evaluate_and_save(self):
        """Evaluate; log the losses and the positional parameters (β, c, s); plot; checkpoint (rank 0)."""
        cfg, t_eval = self.cfg, time.time()
        bad = False
        if self.proc.master:
            losses = self.losses = self.estimate_loss()
            bad = not finite(losses["train"], losses["val"])
        if self.proc.any_rank(bad):  # stop before it is logged or saved, every rank (the others would wait for rank 0)
            self.fail("non-finite evaluation loss " + (f"(train {losses['train']}, val {losses['val']})"
                                                       if self.proc.master else "(rank 0's evaluation)"), self.iter_num)
        if self.proc.master:
            self.history.append([self.iter_num, losses["train"], losses["val"]])
            self.log(f"step {self.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if cfg["wandb_log"]:
                import wandb
                wandb.log({"iter": self.iter_num, "train/loss": losses["train"], "val/loss": losses["val"]})
            prior = self.raw_model.prior_state()
            if prior:  # β, c and s per layer and head: in log.txt, and out_dir/priors.png for BAM
                self.prior_history.append([self.iter_num, prior])
                for key, per_layer in prior.items():
                    self.log(f"  {PRIOR_NAMES[key]}: " + " | ".join(
                        f"layer {i}: " + " ".join(f"{x:.3g}" for x in row) for i, row in enumerate(per_layer)
                        if row is not None))
            if len(self.history) > 1:
                plot_history(self.history, os.path.join(cfg["out_dir"], "loss.png"))
                if "shape" in prior:
                    plot_priors(self.prior_history, cfg["block_size"], os.path.join(cfg["out_dir"], "priors.png"))
            self.best_val_loss = min(self.best_val_loss, losses["val"])
        rng_states = self.proc.rng_states()  # after rank 0's evaluation, which draws batches too
        if self.proc.master and self.iter_num > 0 and not cfg["eval_only"] and (
                cfg["always_save_checkpoint"] or self.losses["val"] <= self.best_val_loss):
            self.save(rng_states)
        self.t_last += time.time() - t_eval  # tok_s counts training time only
        self.proc.barrier()

    def step(self):
        """One iteration: forward/backward with gradient accumulation, clipping, the non-finite guard, the update."""
        cfg, model = self.cfg, self.model
        lr = get_lr(self.iter_num, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_mult"]
        # DDP syncs gradients on the last micro step only
        for micro_step in range(cfg["gradient_accumulation_steps"]):
            if self.proc.ddp:
                model.require_backward_grad_sync = micro_step == cfg["gradient_accumulation_steps"] - 1
            X, Y, doc_ids = self.data.batch("train")
            with self.proc.ctx:
                _, loss = model(X, Y, doc_ids=doc_ids)
                loss = loss / cfg["gradient_accumulation_steps"]
            self.scaler.scale(loss).backward()
        grad_norm = None
        if cfg["grad_clip"] > 0 or cfg["max_bad_steps"]:
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"] or math.inf)
            grad_norm = None if self.scaler.is_enabled() else grad_norm  # float16: GradScaler skips overflowing steps
        if cfg["max_bad_steps"] and self.proc.any_rank(not finite(loss, grad_norm)):  # the guard: a sync every step
            self.bad_steps += 1
            self.log(f"iteration {self.iter_num + 1}: non-finite loss or gradient, step skipped ({self.bad_steps} of "
                     f"max_bad_steps={cfg['max_bad_steps']})")
            if self.bad_steps > cfg["max_bad_steps"]:
                self.fail(f"more than max_bad_steps={cfg['max_bad_steps']} non-finite steps", self.iter_num + 1)
        else:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        self.bar.update(1)
        if self.iter_num % cfg["log_interval"] == 0:
            lossf = loss.item() * cfg["gradient_accumulation_steps"]
            # every log step (the guard: every step); a NaN on any rank stops every rank at the same iteration
            if not cfg["max_bad_steps"] and self.proc.any_rank(not finite(lossf, grad_norm)):
                self.fail(f"non-finite training loss ({lossf}, gradient norm "
                          f"{None if grad_norm is None else float(grad_norm)})", self.iter_num)
        if self.iter_num % cfg["log_interval"] == 0 and self.proc.master:
            dt, self.t_last = time.time() - self.t_last, time.time()
            tok_s = self.tokens_per_iter * cfg["log_interval"] / dt
            self.bar.set_postfix(loss=f"{lossf:.4f}", lr=f"{lr:.1e}", tok_s=f"{tok_s:,.0f}")

    # ---------------------------------------------------------------- save, interrupt, fail

    def checkpoint(self, rng_states):
        """The run's state; rng_states: one (cpu, cuda) random state per process, in rank order."""
        return {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "model_args": self.model_args, "iter_num": self.iter_num, "best_val_loss": self.best_val_loss,
                "config": self.settings, "history": self.history, "prior_history": self.prior_history,
                "tokenizer": self.data.meta["tokenizer"], "rng_states": rng_states,
                "log_size": os.path.getsize(self.log_file) if os.path.isfile(self.log_file) else 0}

    def save(self, rng_states):
        """Write the checkpoint of iteration iter_num (rank 0); never one with non-finite weights."""
        if not all(torch.isfinite(p).all() for p in self.raw_model.parameters()):
            self.fail("non-finite weights", self.iter_num)
        save_checkpoint(self.ckpt_path, self.checkpoint(rng_states), self.keep_previous)  # NanoPEError: one line
        if self.keep_previous:
            self.log(f"the earlier run's checkpoint is now {prev_path(self.ckpt_path)}")
        self.keep_previous, self.last_saved = False, (self.ckpt_path, self.iter_num)

    def stop_interrupted(self):
        """After Ctrl-C: save, then stop the caller too (sweep.py must not go on with a half-trained model)."""
        if self.iter_num == self.start_iter:  # no step taken: out_dir already holds this state, or nothing to keep
            self.log(f"interrupted at iteration {self.iter_num}, before any step of this run: nothing to save")
        elif self.cfg["always_save_checkpoint"]:
            self.save(self.proc.rng_states())
            self.log(f"interrupted: saved {self.ckpt_path} at iteration {self.iter_num}; resume with "
                     f"--init_from=resume")
        else:  # ckpt.pt holds the model of the best validation loss: keep it
            self.log(f"interrupted at iteration {self.iter_num}; not saved (always_save_checkpoint=False keeps "
                     f"{self.ckpt_path} for the best validation loss)")
        raise KeyboardInterrupt

    def fail(self, what, iter_num):
        """Stop the run with a NonFiniteError naming what went non-finite and the last good checkpoint."""
        raise NonFiniteError(nonfinite_message(what, iter_num, self.cfg, self.proc.dtype, self.last_saved))


def main():
    argv = sys.argv[1:]
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__.strip() + "\n\nKeys and their defaults (the CPU demo: train.py's defaults, then "
              "config/cpu_demo.py):")
        choices = dict(pos=POS_VARIANTS, attn_impl=ATTN_IMPLS, tapa_phase=TAPA_PHASES, init_from=("scratch", "resume"))
        print("\n".join(f"  --{k}={v}" + (f"   (one of: {', '.join(choices[k])})" if k in choices else "")
                        for k, v in demo_config().items()))
        return
    defaults = default_config()
    # no config file: the CPU demo (config/cpu_demo.py) under the command line's overrides
    cfg = get_config(argv, defaults) if any(not a.startswith("--") for a in argv) else demo_config(argv)
    if cfg["init_from"] == "resume":  # the run goes on with its own settings, changed only where argv says
        cfg = resume_config(argv, defaults, cfg["out_dir"])
    check_settings(cfg)  # a bad setting is one line, before the settings are printed
    model_config(dict({k: cfg[k] for k in MODEL_KEYS}, vocab_size=cfg["vocab_size"] or 1))  # a dataset's comes later
    print(json.dumps(cfg))
    train(cfg)  # Ctrl-C: train() says what it saved, run_script exits with status 130


if __name__ == "__main__":
    run_script(main)  # nanoPE's own errors (bad config, missing data, a diverged run) as one line, no traceback
