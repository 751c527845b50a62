"""Distributed training setup, shared by every driver: DDP (parallelism=ddp) and FSDP2
(parallelism=fsdp).

`torchrun --nproc_per_node=N train.py ...` sets RANK / LOCAL_RANK / WORLD_SIZE; we then use NCCL
on CUDA and gloo on CPU. Without those variables a DDP run is a single process and the helpers
below are no-ops; an FSDP run gets a process group of its own process (world size 1), so that it
takes the same code path with or without torchrun.

FSDP2 (the section at the end): `torch.distributed.fsdp.fully_shard` per TransformerBlock, then
the root (embedding, final norm and the tied head); on CUDA with dtype=bfloat16 the blocks
compute in bf16 and reduce gradients in fp32 (MixedPrecisionPolicy). Checkpoints gather the full
state on rank 0 and are ordinary ckpt.pt files (docs/training.md).
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tinylab.core.errors import UserError

PARALLELISMS = ("ddp", "fsdp")


@dataclass
class DistInfo:
    enabled: bool
    rank: int
    local_rank: int
    world_size: int
    device: str

    @property
    def is_master(self):
        return self.rank == 0


def init_distributed(device: str, own_group: bool = False) -> DistInfo:
    """Initialise the process group when launched by torchrun; pick this rank's device.
    Without torchrun, `own_group` (FSDP) makes a process group of this process alone."""
    if int(os.environ.get("RANK", -1)) == -1:
        if not own_group:
            return DistInfo(False, 0, 0, 1, device)
        if device.startswith("cuda"):
            device = f"cuda:{torch.device(device).index or 0}"
            torch.cuda.set_device(device)
        if dist.is_initialized():  # left by an earlier run in this process that stopped with an error
            dist.destroy_process_group()
        # an in-process store: no address or port to agree on
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)
        return DistInfo(True, 0, 0, 1, device)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return DistInfo(True, rank, local_rank, world_size, device)


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= info.world_size
    return t


def all_reduce_max(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def all_gather_object(obj, info: DistInfo) -> list:
    """Every rank's `obj`, in rank order (a one-element list without DDP)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo):
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo):
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------- FSDP2
# (torch.distributed.fsdp and friends are imported where used: importing them costs ~1.5 s,
# which DDP and single-process runs need not pay)

def check_fsdp_setting(device: str, dtype: str):
    """parallelism=fsdp runs on CUDA (NCCL) or the CPU (gloo), in fp32/fp64 or bf16."""
    if device.startswith("mps"):
        raise UserError("parallelism=fsdp needs CUDA (NCCL) or the CPU (gloo); there is no process-group backend "
                        "for mps: use parallelism=ddp (one process) or --device=cpu")
    if dtype == "float16":
        raise UserError("parallelism=fsdp does not train in float16 (GradScaler's inf check would differ between "
                        "shards): use dtype=bfloat16 or float32, or parallelism=ddp")


def shard_model(model, info: DistInfo, param_dtype=None):
    """fully_shard every block, then the root (in place; before the optimizer is built, so that
    it holds the sharded DTensor parameters). `param_dtype` (bf16 on CUDA): the dtype blocks
    compute in after the all-gather; gradients are reduce-scattered in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(torch.device(info.device).type, (info.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the root group: embedding (tied head), final norm
    return model


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a sharded (DTensor) tensor; a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def gather_model_state(model) -> dict:
    """The full model state dict on rank 0 (CPU tensors), {} on the others. Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gather_optimizer_state(optimizer, info: DistInfo):
    """optimizer.state_dict() with every sharded tensor gathered (CPU): the ordinary layout
    (state keyed by parameter index, as a one-process run saves it) on rank 0, None on the
    others. Every rank calls it: each DTensor's full_tensor() is an all-gather."""
    sd = optimizer.state_dict()
    state = {}
    for i in sorted(sd["state"]):  # the same order on every rank: the collectives pair up
        full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in sd["state"][i].items()}
        if info.is_master:
            state[i] = {k: v.cpu() if torch.is_tensor(v) else v for k, v in full.items()}
    return {"state": state, "param_groups": sd["param_groups"]} if info.is_master else None


def shard_optimizer_state(optimizer, state: dict) -> dict:
    """A full optimizer state dict laid out for `optimizer` (optim.state_for of a checkpoint's,
    written by gather_optimizer_state or a one-process run) with each parameter-shaped tensor cut
    like its (sharded) parameter, for optimizer.load_state_dict (which would keep a plain full
    tensor as it is). Every rank holds the full state, so each takes its own shard without
    communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for g in optimizer.param_groups for p in g["params"]]
    out = {}
    for i, s in state["state"].items():
        p = params[i]
        if isinstance(p, DTensor):
            s = {k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
                 if torch.is_tensor(v) and tuple(v.shape) == tuple(p.shape) else v for k, v in s.items()}
        out[i] = s
    return {**state, "state": out}
