"""The parameter-group rule and optimizer shared by language-model training and classification.

Weight decay (AdamW, decoupled) applies to linear maps only: ``nn.Linear`` weights (attention,
feed-forward, classifier head) and the adaptive projections ``emb_projs``/``out_projs``. No decay on
biases (``cluster_bias`` included), LayerNorm gains, u/v (``r_w_bias``/``r_r_bias``), Shaw tables
(``r_emb``), embedding tables, and the adaptive softmax's output tables and ``cluster_weight``.

Output tables count as embeddings whether or not ``tie_weight`` shares them with the input
embedding, so tying never changes which group a parameter is in; a tied projection is a projection
on both sides. Kinds come from :func:`txl.model.parameters.parameter_kinds` (declared by module
type, not found by substrings of names).
"""

from __future__ import annotations

import torch
from torch import nn

from txl.model.parameters import parameter_kinds

DECAY_KINDS = frozenset({"linear", "projection"})


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW parameter groups, always in this order: ``[decay, no_decay]``.

    Each is ``{"params": [...], "weight_decay": float, "param_names": [...]}``; every parameter of
    ``model`` (each tied parameter once) is in exactly one, in ``named_parameters`` order. The fixed
    number and order of groups is what trainer checkpoints (:mod:`txl.training.resume`) rely on.

    Raises:
        TxlError: ``model`` has a parameter of unknown kind.
    """
    decay: dict = {"params": [], "weight_decay": weight_decay, "param_names": []}
    no_decay: dict = {"params": [], "weight_decay": 0.0, "param_names": []}
    for name, param, kind in parameter_kinds(model):
        group = decay if kind in DECAY_KINDS else no_decay
        group["params"].append(param)
        group["param_names"].append(name)
    return [decay, no_decay]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups` with learning rate ``lr`` (float).

    With ``weight_decay == 0`` both groups are updated exactly as one plain AdamW would update them.

    Raises:
        TxlError: as :func:`parameter_groups`.
    """
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr)


__all__ = ["DECAY_KINDS", "make_optimizer", "parameter_groups"]
