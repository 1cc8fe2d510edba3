"""What kind each parameter of a model is, and the initialisation that follows from it.

A parameter's kind is decided by the module that owns it, never by substrings of its name:

    kind             parameters                                                     initialisation
    "linear"         ``nn.Linear`` weights (attention, feed-forward, classifier head)  normal(0, init_std)
    "bias"           ``nn.Linear``/``nn.LayerNorm`` biases, adaptive ``cluster_bias``,  zeros
                     the classifier's attention-pooling query ``pool_query``
    "norm"           ``nn.LayerNorm`` gains                                           ones
    "embedding"      ``nn.Embedding`` tables, the adaptive softmax's output tables     normal(0, init_std)
                     (``out_layers[i].weight``) and ``cluster_weight``
    "projection"     adaptive projections ``emb_projs`` / ``out_projs``                normal(0, proj_init_std)
    "position_bias"  u and v (``r_w_bias``, ``r_r_bias``, shared or per layer)         normal(0, init_std)
    "position_table" Shaw et al. (2018) relative-position tables ``r_emb``            normal(0, init_std)

Modules with parameters of their own (or containers whose contents are not what their type
says) declare them in a class attribute ``param_kinds``: ``{attribute: kind}``. A module may name
children in ``param_first`` whose own parameters come right after its own (the attention's
position scheme: the order, and so the draws of a seed, of the layout where they were the
attention's own). A kind declared for a
child module (e.g. ``out_layers: "embedding"``) applies to the weights below it; biases stay biases.
A parameter shared by two modules (tied weights) is listed once, under its first name in
``named_parameters`` order, with that owner's kind; the model ties only parameters of the same kind
(embedding with output table, projection with projection), so the kind does not depend on which
name comes first.

Used by the language model and the adaptive modules (initialisation) and by
:mod:`txl.training.optim` (weight-decay groups).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from txl.errors import TxlError

KINDS = ("linear", "bias", "norm", "embedding", "projection", "position_bias", "position_table")


def _kind(module: nn.Module, name: str, inherited: str | None) -> str | None:
    """Kind of ``module``'s own parameter ``name`` given a kind declared by an ancestor (or None)."""
    declared = getattr(module, "param_kinds", {})
    if name in declared:
        return declared[name]
    if isinstance(module, nn.LayerNorm):
        return "norm" if name == "weight" else "bias"
    if isinstance(module, (nn.Linear, nn.Embedding)):
        if name == "bias":
            return "bias"
        if inherited is not None:
            return inherited
        return "linear" if isinstance(module, nn.Linear) else "embedding"
    return inherited


def parameter_kinds(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, str]]:
    """Yield ``(name, parameter, kind)`` for every parameter of ``model``, each exactly once.

    Names are those of ``model.named_parameters()`` (a tied parameter under its first name); the order is
    its pre-order over modules but for the children a module names in ``param_first``, whose own
    parameters come right after the module's own. Optimizer groups and initialisation draw in this order.

    Raises:
        TxlError: a parameter whose kind no module declares (a new module must add it to its
            ``param_kinds``).
    """
    seen_params: set[int] = set()
    seen_modules: set[int] = set()

    def own(module: nn.Module, prefix: str, inherited: str | None):
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen_params:
                continue
            seen_params.add(id(param))
            kind = _kind(module, name, inherited)
            if kind not in KINDS:
                raise TxlError(f"parameter {prefix + name} of {type(module).__name__} has no known kind "
                               f"(got {kind!r}); declare it in {type(module).__name__}.param_kinds")
            yield prefix + name, param, kind

    def walk(module: nn.Module, prefix: str, inherited: str | None):
        if id(module) in seen_modules:
            return
        seen_modules.add(id(module))
        yield from own(module, prefix, inherited)
        declared = getattr(module, "param_kinds", {})
        for child_name in getattr(module, "param_first", ()):  # a child's own parameters drawn with its parent's
            yield from own(getattr(module, child_name), f"{prefix}{child_name}.", declared.get(child_name, inherited))
        for child_name, child in module.named_children():
            yield from walk(child, f"{prefix}{child_name}.", declared.get(child_name, inherited))

    yield from walk(model, "", None)


@torch.no_grad()
def init_weights(model: nn.Module, init_std: float, proj_init_std: float) -> None:
    """Initialise every parameter of ``model`` in place by its kind (see the module docstring).

    Draws from the global torch generator in ``named_parameters`` order: the same seed gives the same
    weights. ``init_std`` / ``proj_init_std`` are the ``TransformerXLConfig`` fields of those names.

    Raises:
        TxlError: a parameter of unknown kind (see :func:`parameter_kinds`).
    """
    for _, param, kind in parameter_kinds(model):
        if kind == "norm":
            nn.init.ones_(param)
        elif kind == "bias":
            nn.init.zeros_(param)
        elif kind == "projection":
            nn.init.normal_(param, 0.0, proj_init_std)
        else:  # linear, embedding, position_bias, position_table
            nn.init.normal_(param, 0.0, init_std)


__all__ = ["KINDS", "init_weights", "parameter_kinds"]
