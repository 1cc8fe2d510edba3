"""Run by tests/training/test_distributed.py under torchrun: one train_step of a tiny model with plain SGD.

SGD (unlike AdamW with clipping) moves the weights in proportion to the gradient, so the saved
weights show whether the ranks' gradients add up to the whole batch's mean-loss gradient.
Usage: torchrun --nproc_per_node N tests/training/ddp_step_worker.py OUT.safetensors CHUNKS
"""

import sys

import torch
from safetensors.torch import save_file

from txl.model import TransformerXLConfig, TransformerXLLM
from txl import distributed
from txl.training.step import train_step


def main(out: str, chunks: int) -> None:
    d = distributed.from_environment()
    device = torch.device("cpu")
    distributed.init(d, device)
    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(vocab_size=29, n_layer=2, d_model=16, n_head=2, d_head=8,
                                                d_inner=32, dropout=0.0, dropatt=0.0, tgt_len=6, mem_len=6))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 29, (4, 6), generator=g)
    y = torch.randint(0, 29, (4, 6), generator=g)
    y[0, 3:] = -100  # unequal target counts per rank: the scaling must use the global count
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if d.enabled else model
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    rows = d.rows(4)
    mems = model(x[rows]).mems  # a memory for this rank's streams
    out_step = train_step(wrapped, x[rows], y[rows], mems, n_global=(y != -100).sum(), optimizer=opt,
                          scaler=scaler, clip=0.0, dtype="float32", chunks=chunks, d=d)
    if d.is_main:
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        state["loss_sum"] = out_step.loss_sum.reshape(1)
        save_file(state, out)
    distributed.shutdown(d)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
