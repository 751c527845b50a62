"""Distributed data parallel setup, shared by every driver.

`torchrun --nproc_per_node=N train.py ...` sets RANK / LOCAL_RANK / WORLD_SIZE; we then use NCCL
on CUDA and gloo on CPU. Without those variables everything runs as a single process and the
helpers below are no-ops.
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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


def init_distributed(device: str) -> DistInfo:
    """Initialise the process group when launched by torchrun; pick this rank's device."""
    if int(os.environ.get("RANK", -1)) == -1:
        return DistInfo(False, 0, 0, 1, device)
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
