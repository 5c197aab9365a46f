"""
Where one process of a training run computes: its device, its dtype (and the autocast context that
applies it), and its place in DDP (torchrun) with the collectives that keep every rank on the same
branch. train.py calls setup() once and passes the Process it returns around.

One process (python train.py): rank 0 of a world of 1, no collectives. Under torchrun (which sets
RANK, LOCAL_RANK and WORLD_SIZE) every rank runs the same loop on its own device (cuda:LOCAL_RANK, or
the CPU with the gloo backend), with its own random stream (seed + rank), saved by rank in checkpoints.
"""
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from configurator import InputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Process:
    """One process of a run. dev: its torch device string ("cpu", "cuda:0"); device_type: "cpu" or "cuda";
    dtype: the name of its compute dtype (a DTYPES key); ctx: autocast to it on CUDA, nothing on the CPU;
    ddp: launched by torchrun; rank and world: its index and the number of processes."""
    dev: str
    device_type: str
    dtype: str
    ctx: object
    ddp: bool = False
    rank: int = 0
    world: int = 1

    @property
    def master(self):
        """Rank 0: the process that logs, evaluates and writes checkpoints."""
        return self.rank == 0

    def any_rank(self, flag):
        """True if `flag` is true on any process: under DDP an all-reduce, so that every rank takes the same branch
        (one rank stopping alone would leave the others waiting for it)."""
        if not self.ddp:
            return flag
        t = torch.tensor([float(flag)], device=self.dev)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def rng_states(self):
        """(cpu, cuda) random state of every process, in rank order (a collective under DDP)."""
        own = (torch.get_rng_state(), torch.cuda.get_rng_state() if self.device_type == "cuda" else None)
        if not self.ddp:
            return [own]
        states = [None] * self.world
        torch.distributed.all_gather_object(states, own)
        return states

    def set_rng_states(self, rng_states, seed, iter_num):
        """Go on with this rank's random state from rng_states (one per rank, as rng_states() returns) if they
        come from as many processes as this run has; otherwise seed new streams (seed + rank + world·iter_num).
        Returns False in that case (the batches then differ from an uninterrupted run)."""
        if len(rng_states) != self.world:
            torch.manual_seed(seed + self.rank + self.world * iter_num)
            return False
        rng_cpu, rng_cuda = rng_states[self.rank]
        torch.set_rng_state(rng_cpu)
        if self.device_type == "cuda" and rng_cuda is not None:
            torch.cuda.set_rng_state(rng_cuda)
        return True

    def wrap(self, model):
        """The model as this process trains it: in DistributedDataParallel under DDP (on this rank's GPU on CUDA),
        else the model itself."""
        if not self.ddp:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if self.device_type == "cuda" else None)

    def barrier(self):
        """Wait for every rank (nothing without DDP)."""
        if self.ddp:
            torch.distributed.barrier()

    def close(self):
        """Leave the process group (DDP); safe to call twice."""
        if self.ddp:
            torch.distributed.destroy_process_group()
            self.ddp = False


def setup(cfg):
    """The Process of this run from cfg's device, dtype, backend and gradient_accumulation_steps (divided among
    the DDP ranks, in cfg). Seeds torch with seed + rank; allows TF32 matmuls on CUDA. Raises InputError for a
    gradient_accumulation_steps that the ranks cannot share, a half-precision dtype on the CPU, or
    attn_impl='triton' on the CPU outside TRITON_INTERPRET=1."""
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    dev = cfg["device"]
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    rank, world = 0, 1
    if ddp:
        torch.distributed.init_process_group(backend=cfg["backend"] if dev.startswith("cuda") else "gloo")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if dev.startswith("cuda"):
            dev = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(dev)
        if cfg["gradient_accumulation_steps"] % world != 0:
            raise InputError(f"gradient_accumulation_steps={cfg['gradient_accumulation_steps']} must be a "
                             f"multiple of the number of processes ({world})")
        cfg["gradient_accumulation_steps"] //= world
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    dtype = cfg["dtype"]
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if device_type == "cpu" and dtype != "float32":
        raise InputError(f"dtype={dtype} needs a CUDA device (on CPU nanoPE trains in float32): use --dtype=auto")
    if device_type == "cpu" and cfg["attn_impl"] == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError("attn_impl='triton' runs on CUDA (on CPU only under TRITON_INTERPRET=1, for testing): "
                         "use --attn_impl=torch")
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, DTYPES[dtype])
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg["seed"] + rank)
    return Process(dev, device_type, dtype, ctx, ddp, rank, world)
