"""One optimizer step of segment-level recurrent training, with gradient accumulation and several ranks.

The step's loss is the mean negative log-likelihood (nats) over every target token of the global
batch (all ranks, all accumulation chunks): each chunk back-propagates ``sum of its token losses ×
world / global count``, DistributedDataParallel averages over the ``world`` ranks, and the gradient
is exactly that of one process on the whole batch (up to float summation order).

With a compressed memory (Rae et al. 2019) each chunk also back-propagates ``recon_loss_weight ×
recon_loss / chunks``: the attention-reconstruction loss, whose gradient reaches only the compression
networks; DistributedDataParallel averages it over ranks, so the step trains them on the mean over
the global batch's chunks. It is not part of ``loss_sum``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from txl.config import AttentionSpan
from txl.runtime import autocast
from txl.distributed import Dist, all_sum


@dataclass
class StepResult:
    """Outcome of :func:`train_step`.

    Attributes:
        loss_sum: float64 scalar tensor on the device, summed NLL (nats) over the global batch's targets.
        finite: whether that loss is finite; when not, no update was made and ``mems`` is the old memory.
        mems: the memory for the next segment (this rank's rows), detached.
        stop: some rank was asked to stop (SIGINT/SIGTERM) during this step.
        recon_loss: float64 scalar tensor, this rank's attention-reconstruction loss (mean over the
            chunks, unweighted), or None without compressed memory.
        recon_finite: whether ``recon_loss_weight ×`` that loss (the term back-propagated, summed over
            the ranks) is finite; ``finite`` is false when it is not (e.g. an overflowing weight).
    """

    loss_sum: torch.Tensor
    finite: bool
    mems: list[torch.Tensor] | None
    stop: bool
    recon_loss: torch.Tensor | None = None
    recon_finite: bool = True


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, mems: list[torch.Tensor] | None, *,
               n_global: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               clip: float, dtype: str, chunks: int = 1, d: Dist = Dist(), stop: bool = False,
               span: AttentionSpan | None = None) -> StepResult:
    """Forward and backward this rank's rows in ``chunks`` pieces, then (if the loss is finite) clip and step.

    Args:
        model: the model, or its DistributedDataParallel wrapper (``no_sync`` on all but the last chunk).
        x, y: int64 [b, T] inputs and targets of this rank's streams (``-100`` = not scored).
        mems: this rank's memory, ``n_layer`` tensors [b, M, d_model], or None.
        n_global: number of scored targets in the whole global batch (int tensor).
        chunks: gradient-accumulation pieces the rows are split into (``train.grad_accum_steps``).
        stop: this rank received a stop signal; the flag is combined over ranks in the same collective
            as the loss, so that every rank stops after the same step.
        span: the :class:`~txl.model.AttentionSpan` in force (e.g. a phase of
            ``train.tgt_len_schedule``: its ``mem_len`` is the length of the memory returned);
            None: the model's training span.

    The update is made only when the loss and, with a compressed memory, the weighted reconstruction
    term are both finite over the global batch: a non-finite term would put NaN into the gradients.
    One host synchronisation per step (that check), one all-reduce of three numbers.
    """
    device = x.device
    module = model.module if hasattr(model, "module") else model
    scale = d.world / n_global.clamp(min=1).to(torch.float32)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    pieces_x, pieces_y = torch.tensor_split(x, chunks), torch.tensor_split(y, chunks)
    pieces_m = [torch.tensor_split(m, chunks) for m in mems] if mems is not None else None
    new_mems = []
    recon_sum = None
    recon_weighted = torch.zeros((), dtype=torch.float64, device=device)  # the reconstruction term back-propagated
    # the language model itself, or the one a task objective wraps (e.g. fine-tuning on pairs)
    lm = module if hasattr(module, "config") else getattr(module, "model", module)
    weight = float(getattr(getattr(lm, "config", None), "recon_loss_weight", 0.0))
    for i in range(chunks):
        sync = i == chunks - 1 or not hasattr(model, "no_sync")
        with contextlib.nullcontext() if sync else model.no_sync():
            with autocast(device, dtype):
                out = model(pieces_x[i], mems=None if pieces_m is None else [m[i] for m in pieces_m],
                            labels=pieces_y[i], span=span)
            chunk_sum = out.token_loss.float().sum()
            objective = chunk_sum * scale
            if getattr(out, "recon_loss", None) is not None:
                weighted = out.recon_loss.float() * (weight / chunks)
                objective = objective + weighted
                recon_weighted += weighted.detach().double()
                term = out.recon_loss.detach().double() / chunks
                recon_sum = term if recon_sum is None else recon_sum + term
            scaler.scale(objective).backward()
        loss_sum += chunk_sum.detach().double()
        new_mems.append(out.mems)
    combined = all_sum(d, torch.stack([loss_sum, torch.tensor(float(stop), dtype=torch.float64, device=device),
                                       recon_weighted]))
    total, flag, recon_total = combined.tolist()  # the step's one host synchronisation
    recon_finite = math.isfinite(recon_total)
    loss_sum, stopping, finite = combined[0], flag > 0, math.isfinite(total) and recon_finite
    if finite:
        if clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        mems = None if new_mems[0] is None else [torch.cat(layer, dim=0) for layer in zip(*new_mems)]
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum=loss_sum, finite=finite, mems=mems, stop=stopping, recon_loss=recon_sum,
                      recon_finite=recon_finite)
