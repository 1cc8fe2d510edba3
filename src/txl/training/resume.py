"""Everything besides the weights that a run needs to continue bit for bit after a stop.

Stored in the ``last/`` checkpoint: ``trainer.safetensors`` (optimizer moments, torch RNG states,
the memory of every stream) and ``trainer.json`` (optimizer hyper-parameters, python and numpy RNG
states, the data position and step). Loaded with safetensors and JSON only: nothing is unpickled.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from txl.errors import TxlError
from txl.fileio import atomic_write, read_json_object, write_json
from txl.model.parameters import parameter_kinds
from txl.fileio.model_files import current_name
from txl import distributed
from txl.training.checkpoint import checkpoint_step, load_into, quarantine, saved_vocabulary
from txl.training.checkpoint_files import TRAINER_JSON as JSON_NAME
from txl.training.checkpoint_files import TRAINER_TENSORS as TENSORS_NAME
from txl.training.checkpoint_files import checkpoint_candidates, first_good_checkpoint
from txl.training.fingerprint import STATE_KEY, check_resumed_data


def rank_rng_state(device: torch.device) -> list[torch.Tensor]:
    """This process's torch RNG states: CPU, then (on CUDA) its own device's."""
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def save_trainer_state(directory: Path, *, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                       generator: torch.Generator, mems: list[torch.Tensor] | None, position: int,
                       step: int, state: dict[str, Any], rank_rng: list[list[torch.Tensor]] | None = None) -> None:
    """Write the trainer state of the run at ``step`` (just completed) into ``directory``.

    ``mems`` is the memory of all streams [B, M, d_model] per layer; ``rank_rng`` holds
    :func:`rank_rng_state` of every torchrun rank (rank order) for a multi-process run.
    """
    opt = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for index, slots in opt["state"].items():
        for key, value in slots.items():
            tensors[f"optim.{index}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.generator"] = generator.get_state()
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    for r, states in enumerate(rank_rng or []):
        for k, value in enumerate(states):
            tensors[f"rng.rank{r}.{k}"] = value.cpu()
    for i, m in enumerate(mems or []):
        tensors[f"mems.{i}"] = m.detach().cpu().contiguous()
    np_state = np.random.get_state()
    meta = {
        "step": step, "position": position, "n_mems": len(mems or []), "state": state,
        "world_size": len(rank_rng) if rank_rng else 1,
        "param_groups": opt["param_groups"], "scaler": scaler.state_dict(),
        "rng_python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "rng_numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    atomic_write(directory / TENSORS_NAME, lambda tmp: save_file(tensors, tmp))
    write_json(directory / JSON_NAME, meta)


def _legacy_names(model: torch.nn.Module) -> list[list[str]]:
    """Parameter names per group of trainer states written before :mod:`txl.training.optim`
    (groups without ``param_names``): [decay, no_decay] by the old rule, matrices whose name lacks
    "emb" first, in the order of :func:`~txl.model.parameters.parameter_kinds` (that of the layouts that
    wrote them, where a layer's position parameters came first). Used only to read such files."""
    named = [(n, p) for n, p, _ in parameter_kinds(model)]
    return [[n for n, p in named if p.dim() >= 2 and "emb" not in n],
            [n for n, p in named if not (p.dim() >= 2 and "emb" not in n)]]


def _reorder(optimizer: torch.optim.Optimizer, groups: list[dict], slots: dict[int, dict],
             model: torch.nn.Module | None) -> tuple[list[dict], dict[int, dict]]:
    """Saved groups and per-parameter state renumbered to ``optimizer``'s layout, matched by
    parameter name, when the saved layout names its parameters (or is the legacy one and ``model`` is
    given) and holds the same names in another order; otherwise unchanged."""
    current = [g.get("param_names") for g in optimizer.param_groups]
    if all("param_names" in g for g in groups):  # (names of an older layout in today's, see current_name)
        saved = [[current_name(n) for n in g["param_names"]] for g in groups]
        groups = [dict(g, param_names=names) for g, names in zip(groups, saved)]
    elif model is not None and len(groups) == 2:
        saved = _legacy_names(model)
    else:
        return groups, slots
    flat_saved = [n for names in saved for n in names]
    flat_current = [n for names in current if names for n in names]
    if None in current or len(saved) != len(current) or flat_saved == flat_current \
            or sorted(flat_saved) != sorted(flat_current):
        return groups, slots
    old_index = {name: i for i, name in enumerate(flat_saved)}
    new_slots = {i: slots[old_index[n]] for i, n in enumerate(flat_current) if old_index[n] in slots}
    new_groups, start = [], 0
    for group, names in zip(groups, current):
        new_groups.append(dict(group, params=list(range(start, start + len(names))), param_names=list(names)))
        start += len(names)
    return new_groups, new_slots


def load_trainer_state(directory: Path, *, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                       generator: torch.Generator, device: torch.device, rank: int = 0,
                       model: torch.nn.Module | None = None) -> dict[str, Any]:
    """Restore optimizer, scaler, every RNG; return ``{step, position, mems, state, own_rng}``.

    ``mems`` is the memory of all streams; a torchrun rank keeps its own rows. Rank ``rank`` gets
    its own saved RNG states when the run had that rank (otherwise those of rank 0).
    The optimizer state is matched to parameters by name when the file names them (the groups of
    :func:`txl.training.optim.parameter_groups`); files from before that, without names, are
    matched through the old grouping rule when ``model`` (the unwrapped model) is given.

    Raises:
        TxlError: missing or unreadable trainer files, or an optimizer state that does not fit.
    """
    if not (directory / JSON_NAME).is_file() or not (directory / TENSORS_NAME).is_file():
        raise TxlError(f"{directory} has no trainer state ({JSON_NAME}, {TENSORS_NAME}): it cannot be resumed")
    meta = read_json_object(directory / JSON_NAME, "trainer state")
    try:
        tensors = load_file(str(directory / TENSORS_NAME))
    except Exception as err:
        raise TxlError(f"cannot read the trainer state in {directory}: {err}") from None
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            slots.setdefault(int(index), {})[name] = value.to(device) if name != "step" else value
    try:
        groups, slots = _reorder(optimizer, meta["param_groups"], slots, model)
        optimizer.load_state_dict({"state": slots, "param_groups": groups})
    except (ValueError, KeyError) as err:
        raise TxlError(f"the optimizer state in {directory} does not fit this model: {err}") from None
    scaler.load_state_dict(meta["scaler"])
    torch.set_rng_state(tensors["rng.torch"])
    generator.set_state(tensors["rng.generator"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = meta["rng_python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = meta["rng_numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    own = [tensors[k] for k in sorted(k for k in tensors if k.startswith(f"rng.rank{rank}."))]
    if own:
        torch.set_rng_state(own[0])
        if len(own) > 1 and device.type == "cuda":
            torch.cuda.set_rng_state(own[1], device)
    mems = [tensors[f"mems.{i}"].to(device) for i in range(meta["n_mems"])] or None
    return {"step": meta["step"], "position": meta["position"], "mems": mems, "state": meta["state"],
            "own_rng": bool(own)}


def saved_step(run_dir: str | Path) -> int | None:
    """The step at which the newest intact resumable checkpoint (``last*/``) of ``run_dir`` was
    written (its ``state.json`` and ``trainer.json`` record the same step); None when the run has none.
    Torn or corrupt checkpoints are skipped silently (the resumed run reports them)."""
    candidates = checkpoint_candidates(run_dir, "last")
    try:
        folder = first_good_checkpoint(candidates, required=JSON_NAME, warn=lambda message: None)
    except TxlError:
        return None
    return checkpoint_step(folder)


def restore_run(trainer) -> tuple[int, int, list[torch.Tensor] | None, dict[str, Any], float]:
    """Bring the run of ``trainer`` (the ``_Trainer`` of :func:`txl.training.loop.train`, set up and not yet
    started) back to its checkpoint ``resume_dir`` (the first intact one of its ``candidates``, newest first):
    the weights of its ``model``, its ``optimizer``, ``scaler``, ``generator`` and the other RNG states, the
    data position and this rank's ``rows`` of the memory; the newer torn or corrupt candidates are set aside
    (rank 0).

    Its ``task``'s tokenizer must give the saved vocabulary; its ``fingerprint`` (the data's) is compared
    with the saved one (``allow_data_change`` lets a change through with a warning, through ``log``).

    Returns:
        ``(step, position, mems, state, best)``: the saved step, the data position, the memory (this
        rank's rows, float [b, M, d_model] per layer, or None), ``state.json``'s dict updated for the run
        from now on (unit, data fingerprint, threads) and the best validation loss so far (inf if none).

    Raises:
        TxlError: another vocabulary, changed data (without ``allow_data_change``), another batch size,
            or what loading the checkpoint raises.
    """
    resume_dir, model, d, t = trainer.resume_dir, trainer.model, trainer.d, trainer.run.train
    saved_tokenizer, saved_state = saved_vocabulary(resume_dir)
    if saved_tokenizer.to_dict() != trainer.task.tokenizer.to_dict():
        raise TxlError(f"the corpus now gives a different vocabulary than {resume_dir} was trained with (the data "
                       "changed, or the checkpoint comes from another run); data settings cannot change when "
                       "resuming (start a new run instead)")
    check_resumed_data(saved_state.get(STATE_KEY), trainer.fingerprint, checkpoint=resume_dir,
                       allow=trainer.allow_data_change, warn=lambda m: trainer.log(f"txl: warning: {m}"))
    load_into(model, resume_dir, map_location=str(trainer.device))
    restored = load_trainer_state(resume_dir, optimizer=trainer.optimizer, scaler=trainer.scaler,
                                  generator=trainer.generator, device=trainer.device, rank=d.rank, model=model)
    start_step, pos, mems, state = restored["step"], restored["position"], restored["mems"], restored["state"]
    if mems is not None and mems[0].size(0) != t.batch_size:
        raise TxlError(f"{resume_dir} holds the memory of {mems[0].size(0)} streams but train.batch_size is now "
                       f"{t.batch_size}; the batch size cannot change when resuming (start a new run instead)")
    if mems is not None:
        # memory saved under another train.dtype: the model takes its parameter dtype or the autocast one
        weight_dtype = model.word_emb.emb_layers[0].weight.dtype
        allowed = {weight_dtype, getattr(torch, t.dtype)}
        mems = [m[trainer.rows] if m.dtype in allowed else m[trainer.rows].to(weight_dtype) for m in mems]
    if d.rank and not restored["own_rng"]:  # a rank the saved run did not have: its own dropout stream
        torch.manual_seed(t.seed + 7919 * d.rank + start_step)
    distributed.barrier(d)  # every rank has read it
    candidates = trainer.candidates
    if d.is_main and resume_dir != candidates[0]:
        quarantine(candidates[:candidates.index(resume_dir)])  # the torn/corrupt newer ones
    best = state["best_val_loss"] if state.get("best_val_loss") is not None else float("inf")
    state["unit"] = trainer.unit  # (a byte model's checkpoint may say "bpc": evaluation.stream.stored_unit)
    state[STATE_KEY] = trainer.fingerprint  # the data the checkpoints from now on were trained on
    state["threads"] = torch.get_num_threads()
    return start_step, pos, mems, state, best
