"""Multi-process runs on torch.distributed: which rank owns which streams, and the few collectives.

A run started by ``torchrun --nproc_per_node N -m txl train ...`` (or ``txl train --nproc N``) has N
ranks. The global batch of ``train.batch_size`` parallel streams is cut into N equal blocks of
consecutive streams; rank r owns block r, its own slice of the memory, and its own slice of the
evaluation streams. Gradients are averaged by DistributedDataParallel; losses are summed over ranks
and divided by the global token count, so the numbers equal those of one process on the whole batch.
The backend is gloo on CPU and NCCL on CUDA, chosen from the device.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from txl.errors import TxlError
from txl.runtime import busy_now, choose_threads, load_average, usable_cpus


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world`` (1 = a single process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes logs, metrics and checkpoints."""
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """The block of stream rows (of ``batch_size``) this rank owns; ranks may get empty blocks
        only for evaluation batches smaller than the world size."""
        per, extra = divmod(batch_size, self.world)
        start = self.rank * per + min(self.rank, extra)
        return slice(start, start + per + (1 if self.rank < extra else 0))


def from_environment() -> Dist:
    """The rank layout set by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one process otherwise.

    Raises:
        TxlError: malformed variables.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise TxlError("WORLD_SIZE, RANK and LOCAL_RANK must be integers (they are set by torchrun)") from None
    if world < 1 or not 0 <= rank < world:
        raise TxlError(f"bad torchrun layout: RANK={rank}, WORLD_SIZE={world}")
    return Dist(rank=rank, world=world, local_rank=local)


def device_for(d: Dist, device: torch.device) -> torch.device:
    """Each rank on a CUDA machine uses GPU ``LOCAL_RANK``; CPU ranks share the CPU."""
    if d.enabled and device.type == "cuda":
        return torch.device("cuda", d.local_rank)
    return device


def init(d: Dist, device: torch.device) -> None:
    """Join the process group (NCCL for CUDA, gloo otherwise) when there are several ranks."""
    if not d.enabled or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=d.rank, world_size=d.world)


def shutdown(d: Dist) -> None:
    """Leave the process group (a no-op for one process). Garbage is collected first: work objects of
    finished collectives still hold tensors, and freed only at interpreter exit they aborted a gloo
    rank ("terminate called without an active exception") in about one two-process run in ten; then
    every rank waits for the others, so none leaves while a peer still uses the group."""
    if d.enabled and dist.is_initialized():
        gc.collect()  # finished collectives' work objects hold tensors: release them while Python is alive
        dist.barrier()
        dist.destroy_process_group()


def all_sum(d: Dist, tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (identity for one process) and return it."""
    if d.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(d: Dist) -> None:
    """Wait for every rank (a no-op for one process)."""
    if d.enabled:
        dist.barrier()


def gather_rows(d: Dist, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's block of rows [b_r, ...] into the global [B, ...] (rank order).

    The blocks must have equal shapes (training blocks always do: the batch divides by the world).
    """
    if not d.enabled:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(d.world)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)


def gather_objects(d: Dist, obj):
    """A list of every rank's ``obj`` (picklable values made by txl itself, never user files)."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(d: Dist, obj):
    """Rank 0's ``obj`` on every rank."""
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``txl <argv>`` in ``nproc`` processes on this machine (torchrun's agent, standalone
    rendezvous); return 0 when every rank succeeded, else the failing rank's exit status.

    Each rank prints its own ``txl: error: ...`` line; the agent's report is not repeated. On
    Ctrl-C or SIGTERM the agent passes the signal on to the ranks (which finish the step and write
    ``last/``) and 130 is returned. Without ``OMP_NUM_THREADS`` set, each rank gets it as its share of
    the free CPUs (:func:`txl.runtime.choose_threads`, divided by ``nproc``, at least 1).

    Raises:
        TxlError: ``nproc`` < 1.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if nproc < 1:
        raise TxlError(f"--nproc must be >= 1, got {nproc}")
    for name in list(logging.root.manager.loggerDict):  # the ranks report failures themselves
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    shared = "OMP_NUM_THREADS" not in os.environ
    if shared:  # share the free CPUs between the ranks instead of oversubscribing them (the ranks inherit it)
        free, _ = choose_threads(None, cpus=usable_cpus(), load=load_average(), online=os.cpu_count(),
                                 now=busy_now())
        os.environ["OMP_NUM_THREADS"] = str(max(1, free // nproc))
    try:
        config = parse_args(["--standalone", f"--nproc_per_node={nproc}", "-m", "txl"])
        config.training_script_args = list(argv)  # txl's own arguments: never read by torchrun's parser
        run(config)
    except ChildFailedError as err:
        codes = [f.exitcode for f in err.failures.values()]
        return next((c for c in codes if c and c > 0), 1)
    except (SignalException, KeyboardInterrupt):  # Ctrl-C/SIGTERM: the ranks finished their step and wrote last/
        return 130
    finally:
        if shared:  # this process's own setting stays as it was
            os.environ.pop("OMP_NUM_THREADS", None)
    return 0
