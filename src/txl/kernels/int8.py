"""Int8 weights for inference: every linear product of a trained model with one byte per weight.

A decoding step reads every weight once per token, so at batch 1 its time is the weights' bytes over
the memory bandwidth; int8 weights are a quarter of float32's bytes. Reading a segment is bound by
the products' arithmetic, which int8 products with int32 sums do faster on CPUs with VNNI/AMX.

:func:`quantize_int8` replaces the model's ``nn.Linear`` layers (attention ``qkv_net``/``o_net``/``r_net``,
the feed-forward nets, the softmax's ``out_layers``) with :class:`Int8Linear`: symmetric int8 weights
with one float32 scale per output channel (``scale = max |w_row| / 127``). Embeddings, LayerNorms,
biases, the u/v biases and the adaptive softmax's projections and cluster weights stay in float: they
are few bytes and the embedding's rows are read one per token. The saved names stay those of the
float model (``...qkv_net.weight``, now int8) plus ``...weight_scale``, so a quantised checkpoint is
recognised from its weights' names (:func:`txl.fileio.model_files.int8_names`) and loads without
quantising again.

Quantised models are for inference: they have no gradients and cannot be trained or fine-tuned.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from txl.errors import TxlError

MIN_TORCH = (2, 6)  # the first torch whose CPU int8 product (torch._int_mm) is right on every x86 CPU


def check_torch(version: str | None = None) -> None:
    """Refuse int8 products on a torch older than :data:`MIN_TORCH` (``version`` defaults to the installed one).

    Raises:
        TxlError: naming the installed version and the one needed.
    """
    version = version or torch.__version__
    try:
        found = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:  # a development build's odd version string: let it run
        return
    if found < MIN_TORCH:
        raise TxlError(f"int8 weights need torch {MIN_TORCH[0]}.{MIN_TORCH[1]} or later (earlier CPU int8 products "
                       f"are missing or sum wrongly on CPUs without AVX512-VNNI); this is torch {version}: "
                       "upgrade torch, or use a float checkpoint without --quantize int8")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights [out, in], a float32 scale per output channel [out], and an
    optional float bias [out]: y = x @ (weight * scale[:, None]).T + bias (:func:`int8_product`), called
    as :class:`~txl.kernels.cpu.Linear` is: ``forward(x, rows=None, skip_rows=0)``, x [..., in]
    float32/bfloat16/float16 -> [..., out] (``rows``: a slice of the output rows; ``skip_rows`` has
    nothing to skip here, int8 layers have no gradient).

    Buffers (saved in ``model.safetensors``): ``weight`` (int8), ``weight_scale`` (float32), ``bias``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, device=None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> "Int8Linear":
        """The int8 layer closest to ``layer`` (rounding each weight to its channel's nearest step)."""
        w = layer.weight.detach().float()
        out = cls(layer.in_features, layer.out_features, layer.bias is not None, device=w.device)
        scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
        out.weight.copy_(torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8))
        out.weight_scale.copy_(scale)
        if layer.bias is not None:
            out.bias = layer.bias.detach().clone()
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [out, in] this layer stands for."""
        return self.weight.to(dtype) * self.weight_scale.to(dtype)[:, None]

    def forward(self, x: torch.Tensor, rows: slice | None = None, skip_rows: int = 0) -> torch.Tensor:
        weight, scale, bias = self.weight, self.weight_scale, self.bias
        if rows is not None:
            weight, scale, bias = weight[rows], scale[rows], None if bias is None else bias[rows]
        return int8_product(x, weight, scale, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def int8_product(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] (float32, bfloat16 or float16) times the int8 weight [out, in] with per-channel ``scale``
    [out], transposed, plus ``bias`` -> [..., out] in x's dtype.

    On a CPU each row of x is quantised with its own symmetric scale (max |x_row| / 127, dynamic
    quantisation) and multiplied by the int8 weight with exact int32 sums (``torch._int_mm``), then scaled
    back by the row's and the output channel's scales: a row's result does not depend on the other rows,
    so a decoding step and a whole segment give a token the same numbers. Other dtypes (float64) and
    devices multiply by the dequantised weight (the weight's rounding only, no saving).
    """
    lead, flat = x.shape[:-1], x.reshape(-1, x.size(-1))
    if flat.device.type != "cpu" or flat.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        out = F.linear(flat, weight.to(flat.dtype) * scale.to(flat.dtype)[:, None])
    else:
        wide = flat.float()
        row_scale = wide.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(127.0)  # [N, 1]
        q = wide.div(row_scale).round_().to(torch.int8)  # |q| <= 127 by construction
        out = torch._int_mm(q, weight.t()).to(torch.float32).mul_(row_scale).mul_(scale)
        out = out.to(flat.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.view(*lead, out.size(-1))


def quantize_int8(model: nn.Module, names: Iterable[str] | None = None, *, empty: bool = False) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` named in ``names`` (default: every one) by
    :class:`Int8Linear`, in place, and put the model in eval mode with no gradients; returns ``model``.

    ``empty=True`` builds the int8 layers without quantising (their buffers are filled by loading a
    quantised checkpoint, :meth:`~txl.model.transformer.TransformerXLLM.from_pretrained`).

    Raises:
        TxlError: a name that is not an ``nn.Linear`` of ``model`` (e.g. weights of another model); a torch
            older than :data:`MIN_TORCH` (its CPU ``torch._int_mm`` is missing, or sums wrongly on CPUs
            without AVX512-VNNI: pytorch issue 136746, fixed in 2.6).
    """
    modules = dict(model.named_modules())
    wanted = [name for name, layer in modules.items() if isinstance(layer, nn.Linear)] if names is None else list(names)
    if wanted:  # a float checkpoint's load asks for no layer: any torch will do
        check_torch()
    for name in wanted:
        layer = modules.get(name)
        if not isinstance(layer, nn.Linear):
            raise TxlError(f"cannot quantise {name!r}: not a linear layer of this model")
        if empty:
            new = Int8Linear(layer.in_features, layer.out_features, layer.bias is not None, device=layer.weight.device)
        else:
            new = Int8Linear.from_linear(layer)
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        if isinstance(parent, (nn.ModuleList, nn.Sequential)):
            parent[int(child)] = new
        else:
            setattr(parent, child, new)
    model.eval()
    model.requires_grad_(False)
    return model


def to_bfloat16(model: nn.Module) -> nn.Module:
    """Cast every floating-point weight of ``model`` to bfloat16, in place (half of float32's bytes; the
    products then run in bfloat16, natively on CPUs with AVX512-BF16 or AMX), eval mode, no gradients;
    returns ``model``. Log-probabilities are still computed in float32 (the softmax widens half logits)."""
    model.to(torch.bfloat16)
    model.eval()
    model.requires_grad_(False)
    return model


def check_float_model(model: nn.Module, what: str) -> None:
    """Refuse a model with int8 weights where it would be trained (``what`` names the operation).

    Raises:
        TxlError: ``model`` has an :class:`Int8Linear`.
    """
    if is_quantized(model):
        raise TxlError(f"{what} adapts the weights; this model holds int8 weights, which are for inference only: "
                       "use the float model it was made from")


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of ``model`` is an :class:`Int8Linear`."""
    return any(isinstance(m, Int8Linear) for m in model.modules())
