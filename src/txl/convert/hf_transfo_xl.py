"""Hugging Face ``TransfoXLLMHeadModel`` checkpoints <-> txl checkpoints.

One table (:data:`KEY_MAP`) maps every parameter name; an unknown or missing key is an error, never
a silent skip. Conventions where the implementations differ:

- u/v (``r_w_bias``/``r_r_bias``): HF keeps them per layer when ``untie_r`` (its default), else one
  pair on the model; txl does the same (``untie_r`` default False, as the authors' PyTorch code).
- ``same_length``: both use the last ``mem_len`` keys up to and including the query. HF masks every
  key when ``mem_len == 0`` (NaN); txl then uses plain causal attention.
- Initial memory: HF 4.35 starts a sequence with ``mem_len`` zero vectors per layer as memory, so
  its first segment also attends to them; txl (like the authors' code) starts with no memory
  (``mems=None``). :func:`hf_initial_mems` builds HF's zeros for exact parity. HF's memories are
  time-first ``[M, B, d]``, txl's batch-first ``[B, M, d]``.
- Cluster order: HF's ``forward`` and txl both use natural order (row i-1 of ``cluster_weight``
  for tail cluster i), so weights copy unchanged. (The authors' PyTorch code uses reverse order.)
- Tied weights: HF omits the tied copies (``crit.out_layers.*.weight``, tied ``crit.out_projs.*``)
  from its files; txl stores each tied tensor once under its first name and re-ties on load.
- ``tie_projs``: HF expresses it as ``proj_share_all_but_first`` (``[False] + [flag] * n_clusters``);
  other txl patterns cannot be written as an HF config and are refused.
- ``transformer.pos_emb.inv_freq`` is a buffer HF stores; txl recomputes it and checks it matches.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from txl.errors import TxlError
from txl.runtime import memory_bytes
from txl.fileio import atomic_write, read_json_object, write_json
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.model.attention import inverse_frequencies

# (HF name pattern, txl name pattern): {l} a layer index, {i} a cluster index.
KEY_MAP: list[tuple[str, str]] = [
    ("transformer.word_emb.emb_layers.{i}.weight", "word_emb.emb_layers.{i}.weight"),
    ("transformer.word_emb.emb_projs.{i}", "word_emb.emb_projs.{i}"),
    ("transformer.r_w_bias", "r_w_bias"),
    ("transformer.r_r_bias", "r_r_bias"),
    ("transformer.layers.{l}.dec_attn.r_w_bias", "layers.{l}.attn.pos.r_w_bias"),
    ("transformer.layers.{l}.dec_attn.r_r_bias", "layers.{l}.attn.pos.r_r_bias"),
    ("transformer.layers.{l}.dec_attn.qkv_net.weight", "layers.{l}.attn.qkv_net.weight"),
    ("transformer.layers.{l}.dec_attn.r_net.weight", "layers.{l}.attn.pos.r_net.weight"),
    ("transformer.layers.{l}.dec_attn.o_net.weight", "layers.{l}.attn.o_net.weight"),
    ("transformer.layers.{l}.dec_attn.layer_norm.weight", "layers.{l}.attn.layer_norm.weight"),
    ("transformer.layers.{l}.dec_attn.layer_norm.bias", "layers.{l}.attn.layer_norm.bias"),
    ("transformer.layers.{l}.pos_ff.CoreNet.0.weight", "layers.{l}.ff.net.0.weight"),
    ("transformer.layers.{l}.pos_ff.CoreNet.0.bias", "layers.{l}.ff.net.0.bias"),
    ("transformer.layers.{l}.pos_ff.CoreNet.3.weight", "layers.{l}.ff.net.3.weight"),
    ("transformer.layers.{l}.pos_ff.CoreNet.3.bias", "layers.{l}.ff.net.3.bias"),
    ("transformer.layers.{l}.pos_ff.layer_norm.weight", "layers.{l}.ff.layer_norm.weight"),
    ("transformer.layers.{l}.pos_ff.layer_norm.bias", "layers.{l}.ff.layer_norm.bias"),
    ("crit.out_layers.{i}.weight", "crit.out_layers.{i}.weight"),
    ("crit.out_layers.{i}.bias", "crit.out_layers.{i}.bias"),
    ("crit.out_projs.{i}", "crit.out_projs.{i}"),
    ("crit.cluster_weight", "crit.cluster_weight"),
    ("crit.cluster_bias", "crit.cluster_bias"),
]
HF_BUFFERS = {"transformer.pos_emb.inv_freq"}


def _compile(pattern: str) -> re.Pattern:
    return re.compile(re.escape(pattern).replace(r"\{l\}", r"(?P<l>\d+)").replace(r"\{i\}", r"(?P<i>\d+)") + "$")


_HF_TO_TXL = [(_compile(hf), txl) for hf, txl in KEY_MAP]
_TXL_TO_HF = [(_compile(txl), hf) for hf, txl in KEY_MAP]


def _rename(name: str, table: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, target in table:
        match = pattern.match(name)
        if match:
            return target.format(**match.groupdict())
    return None


def txl_key_to_hf(name: str) -> str | None:
    """The HF parameter name for a txl one, or None if the table has no row for it."""
    return _rename(name, _TXL_TO_HF)


def _hf_flag(hf: dict[str, Any], key: str, default: Any, kind: type, where: str) -> Any:
    """``hf[key]`` (``default`` when absent) of Python type ``kind`` (int: not a bool; bool: true or false
    only, never a string like "false" that ``bool`` would read as true).

    Raises:
        TxlError: ``{where}: KEY must be ..., got VALUE``.
    """
    value = hf.get(key, default)
    ok = isinstance(value, bool) if kind is bool else isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        raise TxlError(f"{where}: {key} must be {'true or false' if kind is bool else 'an integer'}, got {value!r}")
    return value


def config_from_hf(hf: dict[str, Any], where: str = "the HF config.json") -> TransformerXLConfig:
    """A txl config from an HF ``config.json`` dict (``where``: the file, for messages). Values are taken
    as they are and checked by :meth:`TransformerXLConfig.from_dict` and its ``check()``, so a string, a
    fraction or a boolean where an integer belongs is refused, never rounded or read as true.

    Raises:
        TxlError: an attention type other than the relative one, sampled softmax, a missing field, or a
            field of the wrong type or out of range.
    """
    if _hf_flag(hf, "attn_type", 0, int, where) != 0:
        raise TxlError(f"only attn_type 0 (relative attention) HF checkpoints are supported, got {hf['attn_type']!r}")
    if _hf_flag(hf, "sample_softmax", -1, int, where) > 0:
        raise TxlError("HF checkpoints trained with sample_softmax are not supported")
    missing = [key for key in ("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "mem_len", "cutoffs")
               if key not in hf]
    if missing:
        raise TxlError(f"{where} has no {missing[0]!r} field")
    cutoffs = hf["cutoffs"]
    if not isinstance(cutoffs, list):
        raise TxlError(f"{where}: cutoffs must be a list of integers, got {cutoffs!r}")
    share = _hf_flag(hf, "proj_share_all_but_first", True, bool, where)
    clamp_len = _hf_flag(hf, "clamp_len", 0, int, where)
    values = {key: hf[key] for key in ("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "mem_len")}
    values.update(
        dropout=hf.get("dropout", 0.1), dropatt=hf.get("dropatt", 0.0), tgt_len=hf.get("tgt_len", 128),
        clamp_len=max(0, clamp_len),  # HF: <= 0 is no clamping
        same_length=hf.get("same_length", False), pre_lnorm=hf.get("pre_lnorm", False),
        untie_r=hf.get("untie_r", True), tie_weight=_hf_flag(hf, "tie_word_embeddings", True, bool, where),
        attn_type="rel", init_std=hf.get("init_std", 0.02), d_embed=hf.get("d_embed", hf["d_model"]), cutoffs=cutoffs,
        div_val=hf.get("div_val", 1), tie_projs=hf.get("tie_projs", [False] + [share] * len(cutoffs)),
        proj_init_std=hf.get("proj_init_std", 0.01))
    try:
        config = TransformerXLConfig.from_dict(values)
        config.check()
    except TxlError as err:
        raise TxlError(f"{where}: {str(err).removeprefix('model.')}") from None
    return config


def config_to_hf(config: TransformerXLConfig) -> dict[str, Any]:
    """An HF ``config.json`` dict (``TransfoXLConfig``, transformers 4.35) for a txl config.

    Raises:
        TxlError: ``attn_type="abs"``, a compressed memory (``cmem_len > 0``: HF's TransfoXL has no
            compression network) or a ``tie_projs`` pattern HF cannot express.
    """
    if config.cmem_len > 0:
        raise TxlError(f"this model has a compressed memory (cmem_len={config.cmem_len}, Compressive Transformer); "
                       "HF's TransfoXL has no such model, so it cannot be written as an HF checkpoint")
    if config.attn_type != "rel":
        raise TxlError("only attn_type='rel' models can be written as HF TransfoXL checkpoints")
    ties = config.tied_projections
    if ties[0] or len(set(ties[1:])) > 1:
        raise TxlError(f"tie_projs {ties} cannot be written as HF's proj_share_all_but_first "
                       "([False] + [flag] * n_clusters)")
    return {
        "architectures": ["TransfoXLLMHeadModel"], "model_type": "transfo-xl",
        "vocab_size": config.vocab_size, "cutoffs": list(config.cutoffs), "d_model": config.d_model,
        "d_embed": config.embed_dim, "n_head": config.n_head, "d_head": config.d_head, "d_inner": config.d_inner,
        "div_val": config.div_val, "pre_lnorm": config.pre_lnorm, "n_layer": config.n_layer,
        "mem_len": config.mem_len, "clamp_len": config.clamp_len, "same_length": config.same_length,
        "proj_share_all_but_first": bool(ties[1]) if len(ties) > 1 else True, "attn_type": 0,
        "sample_softmax": -1, "adaptive": True, "dropout": config.dropout, "dropatt": config.dropatt,
        "untie_r": config.untie_r, "init": "normal", "init_range": 0.01, "proj_init_std": config.proj_init_std,
        "init_std": config.init_std, "layer_norm_epsilon": 1e-5, "eos_token_id": 0,
        "tie_word_embeddings": config.tie_weight, "tgt_len": config.tgt_len, "tie_projs": ties,
    }


def _tied_groups(model: torch.nn.Module) -> dict[str, list[str]]:
    """First name of each parameter -> all names it has (more than one when tied)."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return {names[0]: names for names in groups.values()}


def model_from_hf_state(config: TransformerXLConfig, state: dict[str, torch.Tensor]) -> TransformerXLLM:
    """Build a txl model from an HF state dict (already loaded safely).

    Raises:
        TxlError: an HF key the table does not know, a txl parameter with no HF source, shape
            mismatches, tied copies that differ, or an ``inv_freq`` buffer txl would not compute.
    """
    model = TransformerXLLM(config)
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in HF_BUFFERS:
            expected = inverse_frequencies(config.d_model)
            if value.shape != expected.shape or not torch.allclose(value.float(), expected, rtol=1e-5):
                raise TxlError(f"{key} differs from the standard sinusoid frequencies txl uses")
            continue
        target = _rename(key, _HF_TO_TXL)
        if target is None:
            raise TxlError(f"unknown key {key!r} in the HF checkpoint (not in txl's key map)")
        renamed[target] = value
    if not config.untie_r:  # HF also registers the shared u/v under every layer: the same tensors
        for key in [k for k in renamed if re.fullmatch(r"layers\.\d+\.attn\.pos\.r_[wr]_bias", k)]:
            shared = renamed.get(key.rsplit(".", 1)[1])
            value = renamed.pop(key)
            if shared is not None and not torch.equal(shared, value):
                raise TxlError(f"{txl_key_to_hf(key)} differs from the shared bias although untie_r is false")
    own = dict(model.named_parameters(remove_duplicate=False))
    unknown = sorted(set(renamed) - set(own))
    if unknown:
        raise TxlError(f"the HF checkpoint has tensors this config does not use: {unknown[:5]}")
    loaded: dict[str, torch.Tensor] = {}
    for first, names in _tied_groups(model).items():
        present = [n for n in names if n in renamed]
        if not present:
            raise TxlError(f"the HF checkpoint has no tensor for {txl_key_to_hf(first) or first}")
        value = renamed[present[0]]
        for other in present[1:]:
            if not torch.equal(renamed[other], value):
                raise TxlError(f"{txl_key_to_hf(other)} and {txl_key_to_hf(present[0])} should be tied but differ")
        if value.shape != own[first].shape:
            raise TxlError(f"{txl_key_to_hf(first)} has shape {tuple(value.shape)}, the config implies "
                           f"{tuple(own[first].shape)}")
        loaded[first] = value
    model.load_state_dict(loaded, strict=False)
    return model


def hf_state_from_model(model: TransformerXLLM) -> dict[str, torch.Tensor]:
    """HF-named tensors for a txl model (tied copies once, under HF's embedding names, plus ``inv_freq``)."""
    state = {}
    for first in _tied_groups(model):
        state[txl_key_to_hf(first)] = model.get_parameter(first).detach().cpu().contiguous()
    d = model.config.d_model
    state["transformer.pos_emb.inv_freq"] = inverse_frequencies(d)
    return state


def read_hf_checkpoint(directory: str | Path) -> tuple[TransformerXLConfig, dict[str, torch.Tensor]]:
    """Read ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``, loaded with
    ``weights_only=True``) from an HF model directory.

    Raises:
        TxlError: missing files, invalid JSON, or weights that cannot be read safely.
    """
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise TxlError(f"{directory} has no config.json: not a Hugging Face model directory")
    config = config_from_hf(read_json_object(directory / "config.json"), str(directory / "config.json"))
    config.check_fits(memory_bytes(), str(directory / "config.json"))  # before reading or building anything
    if (directory / "model.safetensors").is_file():
        from safetensors.torch import load_file

        try:
            state = load_file(str(directory / "model.safetensors"))
        except Exception as err:
            raise TxlError(f"cannot read {directory / 'model.safetensors'}: {err}") from None
    elif (directory / "pytorch_model.bin").is_file():
        try:
            state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as err:
            raise TxlError(f"refusing or unable to read {directory / 'pytorch_model.bin'} with weights_only=True: "
                           f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    else:
        raise TxlError(f"{directory} has neither model.safetensors nor pytorch_model.bin")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TxlError("the HF weights file does not hold a flat dict of tensors")
    return config, state


def write_hf_checkpoint(model: TransformerXLLM, directory: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` that ``TransfoXLLMHeadModel.from_pretrained`` reads.

    Raises:
        TxlError: what :func:`config_to_hf` refuses (e.g. a compressed memory), before anything is written.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    config = config_to_hf(model.config)  # refuses what HF cannot express before anything is written
    directory.mkdir(parents=True, exist_ok=True)
    state = hf_state_from_model(model)
    atomic_write(directory / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    write_json(directory / "config.json", config)


def hf_initial_mems(config: TransformerXLConfig, batch_size: int, dtype=torch.float32, device="cpu") -> list[torch.Tensor]:
    """HF's starting memory for ``batch_size`` streams: ``n_layer`` zero tensors [B, mem_len, d_model]."""
    return [torch.zeros(batch_size, config.mem_len, config.d_model, dtype=dtype, device=device)
            for _ in range(config.n_layer)]
