"""``txl classify``: fine-tune a language model into a long-document classifier, and predict with it.

``txl classify train LM --data DATA --out RUN`` reads labelled documents (a folder per
label, or JSON Lines ``{"text": ..., "label": ...}``), holds out a seeded stratified part (or reads the
held-out documents from ``--valid``), fine-tunes
a :class:`~txl.classification.TransformerXLForSequenceClassification` initialised from the LM through
the shared training loop (the run folder RUN: ``best/`` and ``last/`` checkpoints, ``metrics.csv``,
``--resume``, ``--dtype``) and writes the held-out report ``RUN/heldout.json``. ``txl classify predict
RUN FILE...`` prints one JSON line per document with the predicted label and the probabilities.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from txl.cli.checks import check_exists, check_range, finite_float, flag_name
from txl.cli.common import (Command, add_batch_size, add_checkpoint, add_data, add_device, add_dtype, add_option,
                            add_span, checkpoint_arg, note_threads, print_notes, underscore, use_threads)
from txl.cli.train import launch_ranks
from txl.config import CONFIG_NAME, HEAD_INITS, MODES, POOLINGS, RECURRENCES, RUN_NAME
from txl.errors import TxlError, counted, listed
from txl.fileio import continue_command
from txl_recipes.classify.config import ClassifyTrainConfig, check_classification_run

NAME = "classify"
HELDOUT_NAME = "heldout.json"  # the held-out report of a run (txl classify train)
HELP = "long-document classification with memory (fine-tune an LM)"
EXAMPLE = "txl classify train runs/wt103 --data reviews.jsonl --out runs/reviews"
# the settings of `txl classify train` a --config file's [classify] table may give: name -> built-in default,
# read from ClassifyTrainConfig. A flag on the command line wins over the file, the file over the default.
TRAIN_SETTINGS: dict[str, object] = {f.name: f.default for f in dataclasses.fields(ClassifyTrainConfig)}


def _add_train(t: argparse.ArgumentParser) -> None:
    add_checkpoint(t, option_alias=True, text="txl LM checkpoint, or a run directory (uses its best/)")
    add_data(t, "folder DIR/LABEL/FILE... or a .jsonl file of {\"text\", \"label\"}", required=True)
    t.add_argument("--out", "-o", help="new or empty folder for the run (checkpoints best/ and last/, metrics.csv, "
                                       "heldout.json)")
    t.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped classification run from its last/ checkpoint; give the same checkpoint, "
                        "data, --config and flags as when it started (other settings are refused)")
    add_option(t, "--allow-data-change", aliases=underscore("--allow-data-change"), action="store_true",
               help="with --resume: continue on documents that differ from those the run was trained on")
    t.add_argument("--config", "-c", metavar="FILE",
                   help="TOML file whose [classify] table sets any of the settings below (steps = 300, mode = "
                        "\"memory\", ...); a flag given here wins over the file, and the defaults shown apply "
                        "where neither gives a value")
    t.add_argument("--mode", choices=MODES, default=None,
                   help="memory: whole document with the memory; first / last: the first / last tgt_len tokens "
                        "only (default: memory, or first for an attn_type=abs model)")
    t.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="document: mean state over every token of the document; attention: their average "
                        "weighted by a learnt score; last / mean: the last token's state / the mean over the last "
                        "segment, which reach only n_layer x mem_len tokens back (default document)")
    add_option(t, "--grad-segments", aliases=underscore("--grad-segments"), type=int, default=None, metavar="K",
               help="back-propagate through the last K segments of each document (0: all; default 1)")
    t.add_argument("--passes", type=int, choices=(1, 2), default=None,
                   help="2: read each document twice, the second reading starting from the memory the first left "
                        "(ERNIE-Doc's retrospective feed; --mode memory; default 1)")
    t.add_argument("--recurrence", choices=RECURRENCES, default=None,
                   help="same_layer: each layer's memory is its own output (ERNIE-Doc's enhanced recurrence: no "
                        "n_layer x mem_len bound; --mode memory); default previous_layer, the paper's")
    add_option(t, "--head-init", aliases=underscore("--head-init"), choices=HEAD_INITS, default=None,
               help="probe: standardize the pooled vectors and start the head from a logistic regression fitted on "
                    "the training documents (one reading of them first); random: a random head (default probe)")
    add_span(t, ("tgt_len", "mem_len"), default_text="the LM's")
    add_option(t, "--max-tokens", aliases=underscore("--max-tokens"), type=int, default=None, metavar="N",
               help="cut documents to their first N tokens (0: whole documents)")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default 200)")
    add_option(t, "--batch-size", aliases=underscore("--batch-size"), type=int, default=None, metavar="N",
               help="documents per step (default 8)")
    t.add_argument("--lr", type=finite_float, default=None,
                   help="peak learning rate (AdamW, warm-up then cosine; default 3e-4)")
    add_option(t, "--warmup-steps", aliases=("--warmup", "--warmup_steps"), type=int, default=None, metavar="N",
               help="learning-rate warm-up steps (default 10)")
    add_option(t, "--weight-decay", aliases=underscore("--weight-decay"), type=finite_float, default=None,
               help="AdamW weight decay (default 0)")
    t.add_argument("--clip", type=finite_float, default=None, help="max gradient norm (0: none; default 1)")
    t.add_argument("--dropout", type=finite_float, default=None, help="dropout before the linear head (default 0.1)")
    add_option(t, "--valid-fraction", aliases=underscore("--valid-fraction"), type=finite_float, default=None,
               help="held-out fraction per label of --data (default 0.2; not with --valid)")
    t.add_argument("--valid", metavar="DATA",
                   help="held-out documents (same forms as --data): train on all of --data, report on these")
    add_option(t, "--save-interval", aliases=underscore("--save-interval"), type=int, default=None, metavar="N",
               help="write last/ (what --resume continues from) every N steps (0: only at the end; default 50)")
    t.add_argument("--seed", type=int, default=None, metavar="N",
                   help="seeds the split, the batches and the head (default: 0)")
    add_device(t)
    add_dtype(t)
    t.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train in N processes (torchrun; one per GPU, or gloo on CPU): --batch-size splits over them")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _add_predict(q: argparse.ArgumentParser) -> None:
    q.add_argument("run", metavar="CHECKPOINT", help="run folder written by `txl classify train` (its best/), or a "
                                                     "classifier checkpoint folder")
    q.set_defaults(_more="inputs")  # later items of the list, after an option (see txl.cli.main)
    q.add_argument("inputs", nargs="+", metavar="FILE",
                   help="text files (one document each) or .jsonl files (one {\"text\": ...} per line)")
    add_batch_size(q, default=8, text="documents per forward pass")
    add_device(q)


def resolve_settings(args: argparse.Namespace) -> None:
    """Fill each training setting of ``args`` left unset on the command line (None) from the ``--config``
    file's ``[classify]`` table, else from :data:`TRAIN_SETTINGS`'s default; torch-free. A value taken
    from the file is named in later errors as ``[classify] KEY of FILE`` (through ``args._flags``, see
    :func:`~txl.cli.checks.flag_name`), not as the flag nobody typed. ``--valid`` on the command line
    wins over the file's ``valid_fraction``.

    Raises:
        TxlError: the file is missing or not TOML, holds anything but one ``[classify]`` table, an
            unknown key (naming the nearest known one), or a value of the wrong type (the rules of every
            config file: :func:`~txl.config.check_fields`). Ranges and choices are checked after, flags
            and file alike, by :meth:`~txl_recipes.classify.config.ClassifyTrainConfig.check`.
    """
    from txl.config import check_fields
    from txl.fileio import read_toml

    given: dict = {}
    if args.config is not None:
        tables = read_toml(args.config)
        extra = sorted(set(tables) - {"classify"})
        if extra or not isinstance(tables.get("classify"), dict):
            raise TxlError(f"config file {args.config} must hold one [classify] table of txl classify train settings"
                           + (f" (found: {', '.join(repr(k) for k in extra)})" if extra else ""))
        try:  # the rules of every config file: classify.steps must be an integer, ...
            given = check_fields(ClassifyTrainConfig, tables["classify"], "classify")
        except TxlError as err:
            raise TxlError(f"config file {args.config}: {err}") from None
    if getattr(args, "valid", None) is not None:  # held-out documents given: the file's held-out fraction does not apply
        given.pop("valid_fraction", None)
    flags = dict(getattr(args, "_flags", None) or {})
    for key, default in TRAIN_SETTINGS.items():
        if getattr(args, key) is None:
            if key in given:
                flags[key] = f"[classify] {key} of {args.config}"
            setattr(args, key, given.get(key, default))
    args._flags = flags


def _check_args(args: argparse.Namespace) -> None:
    """Reject out-of-range training settings before anything is loaded (naming the flag, or the config
    file's key the value came from)."""
    settings = {key: getattr(args, key) for key in TRAIN_SETTINGS}
    ClassifyTrainConfig(**settings).check(lambda key: flag_name(args, key))
    if args.valid is not None and args.valid_fraction is not None:
        raise TxlError("give --valid (held-out documents) or --valid-fraction (a held-out part of --data), not both")
    if args.resume is not None and args.out is not None and Path(args.out).resolve() not in (
            Path(args.resume).resolve(), Path(args.resume).resolve().parent if Path(args.resume).name == "last" else None):
        raise TxlError("--resume continues the run in its own folder: give --resume RUN_DIR without --out")
    if args.allow_data_change and args.resume is None:
        raise TxlError("--allow-data-change applies to --resume only")
    if args.resume is None and args.out is None:
        raise TxlError("give --out (a new or empty folder for the run) or --resume RUN_DIR")
    if args.nproc is not None and (args.nproc < 1 or args.batch_size % args.nproc):
        raise TxlError(f"--nproc must be >= 1 and divide --batch-size {args.batch_size}, got {args.nproc}")
    check_exists(args.checkpoint, "checkpoint", kind="folder")  # paths too, before torch is imported
    check_exists(args.data, "--data")
    check_exists(args.valid, "--valid")
    check_exists(args.resume, "--resume", kind="folder")
    if args.resume is not None:  # a checkpoint (RUN/last) stands for its run
        resume = Path(args.resume)
        check_classification_run(resume.parent if (resume / CONFIG_NAME).is_file() else resume)


@dataclass
class _Documents:
    """The labelled documents of a run: ``docs`` (those of ``--data``, then those of ``--valid``), the
    sorted label ``names``, each document's label index (``targets``), the positions in ``docs`` trained on
    (``train_idx``) and held out (``valid_idx``), and the token ids of each document (``encoded``)."""

    docs: list
    names: list
    targets: list[int]
    train_idx: list[int]
    valid_idx: list[int]
    encoded: list = field(default_factory=list)


def _language_model(args: argparse.Namespace):
    """``(lm_dir, lm_config, mode)``: the LM checkpoint folder of ``args.checkpoint``, its model config and
    the classifier's mode (``--mode``, else memory for a model with memory, else first).

    Raises:
        TxlError: weights that cannot be trained, no vocabulary, or mode memory for a model without memory.
    """
    from txl.config import VOCAB_NAME
    from txl.fileio.model_files import read_model_config
    from txl.training.checkpoint import resolve_checkpoint_dir
    from txl.training.checkpoint_files import verify_checkpoint

    lm_dir = resolve_checkpoint_dir(args.checkpoint)
    lm_config = read_model_config(lm_dir)
    from txl.fileio.model_files import check_trainable
    from txl.fileio.model_files import weight_shapes

    try:
        shapes = weight_shapes(lm_dir)  # from the weights' header: nothing loaded yet
    except TxlError:
        verify_checkpoint(lm_dir)  # a damaged file is named by its checksum, as every command names it
        raise
    check_trainable(shapes, str(lm_dir))
    if not (lm_dir / VOCAB_NAME).is_file():
        raise TxlError(f"{lm_dir} has no {VOCAB_NAME}: cannot encode the documents for this language model")
    mode = args.mode or ("memory" if lm_config.has_memory else "first")
    if mode == "memory" and not lm_config.has_memory:
        said = "--mode memory" if flag_name(args, "mode").startswith("-") else f'mode = "memory" in {args.config}'
        raise TxlError(f"{said} needs a model with memory; the attn_type={lm_config.attn_type!r} model at "
                       f"{lm_dir} has no memory: use --mode first or last (one window of tgt_len tokens)")
    return lm_dir, lm_config, mode


def _load_documents(args: argparse.Namespace, main_rank: bool) -> _Documents:
    """The documents of ``--data`` split into trained-on and held-out ones (``--valid``'s, or a stratified
    ``--valid-fraction`` of ``--data``), not yet encoded; warns on stderr (``main_rank`` only) of labels with
    one document.

    Raises:
        TxlError: unreadable documents, or a ``--valid`` label that ``--data`` lacks.
    """
    from txl_recipes.classify.documents import label_names, load_labelled, stratified_split

    docs = load_labelled(args.data)
    names = label_names(docs)
    if args.valid is None:
        train_idx, valid_idx = stratified_split([d.label for d in docs], args.valid_fraction or 0.2, args.seed)
    else:
        held = load_labelled(args.valid, min_labels=1)
        label_names(docs + held)  # 1 in one file and "1" in the other: refused, not merged
        unknown = [label for label in label_names(held) if label not in names]
        if unknown:
            raise TxlError(f"--valid {args.valid} has label(s) that --data {args.data} lacks: "
                           f"{listed(unknown)}; every held-out label needs training documents")
        train_idx, valid_idx = list(range(len(docs))), list(range(len(docs), len(docs) + len(held)))
        docs = docs + held
    targets = [names.index(d.label) for d in docs]
    alone = [name for name in names if sum(d.label == name for d in docs) == 1 and args.valid is None]
    if alone and main_rank:
        print(f"txl: warning: label(s) {listed(alone, 5)} have one document: trained on, never held out",
              file=sys.stderr)
    return _Documents(docs, names, targets, train_idx, valid_idx)


def _fit(args: argparse.Namespace, lm_dir: Path, classifier, data: _Documents, out: Path):
    """Seed torch with ``--seed`` and fine-tune ``classifier`` from the LM at ``lm_dir`` on the documents
    of ``data`` through the training loop (run folder ``out``); returns its fit result."""
    import torch

    from txl_recipes.classify.train import fit_classifier

    torch.manual_seed(args.seed)
    return fit_classifier(lm_dir, classifier, ([data.encoded[i] for i in data.train_idx],
                                               [data.targets[i] for i in data.train_idx]),
                          ([data.encoded[i] for i in data.valid_idx], [data.targets[i] for i in data.valid_idx]),
                          out_dir=out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, clip=args.clip,
                          seed=args.seed, tgt_len=args.tgt_len, mem_len=args.mem_len, dtype=args.dtype or "float32",
                          device=args.device or "auto", threads=args.threads or 0, data=args.data,
                          save_interval=args.save_interval, resume=args.resume is not None,
                          allow_data_change=args.allow_data_change, progress=not args.quiet,
                          inputs=[lm_dir] + ([args.valid] if args.valid else []))


def _report(args: argparse.Namespace, fit, data: _Documents, settings: dict, out: Path) -> None:
    """Score the fitted model on the held-out documents of ``data``, write ``out/heldout.json`` (with the
    run's ``settings``) and print the summary."""
    from txl_recipes.classify.train import classification_metrics, predict_labels
    from txl.evaluation.intervals import accuracy, bootstrap_interval, macro_f1
    from txl.fileio import write_json

    names, valid_idx = data.names, data.valid_idx
    y_true = [data.targets[i] for i in valid_idx]
    y_pred = predict_labels(fit.model, [data.encoded[i] for i in valid_idx], args.batch_size).argmax(1).tolist()
    metrics = classification_metrics(y_true, y_pred, len(names))
    intervals = {name: bootstrap_interval((y_true, y_pred), fn, n=1000, seed=args.seed)
                 for name, fn in (("accuracy", accuracy), ("macro_f1", lambda t, p: macro_f1(t, p, len(names))))}
    heldout = {k: metrics[k] for k in ("accuracy", "macro_f1", "n", "confusion")}
    heldout.update({f"{k}_interval": [round(v.low, 6), round(v.high, 6)] for k, v in intervals.items()})
    heldout["loss"] = fit.final_loss
    report = {"settings": settings, "heldout": heldout,
              "train": {"steps": fit.steps, "documents": fit.documents, "tokens": fit.tokens,
                        "wall_s": round(fit.wall_s, 1)},
              "checkpoint": str(fit.run_dir / "best"),
              "heldout_sources": [data.docs[i].source for i in valid_idx],
              "heldout_predictions": [names[p] for p in y_pred]}
    write_json(out / HELDOUT_NAME, report)
    print(f"trained {fit.steps} steps ({fit.documents} documents, {fit.tokens:,} tokens) in {fit.wall_s:.0f} s")
    acc, f1 = intervals["accuracy"], intervals["macro_f1"]
    print(f"held-out: accuracy {metrics['accuracy']:.4f} [{acc.low:.4f}, {acc.high:.4f}], macro-F1 "
          f"{metrics['macro_f1']:.4f} [{f1.low:.4f}, {f1.high:.4f}] ({metrics['n']} documents; 95% bootstrap "
          "intervals over them)")
    print(f"run: {out} (classifier: {out / 'best'}; report: {out / HELDOUT_NAME})")


def _train(args: argparse.Namespace) -> int:
    """``txl classify train``: fine-tune through the training loop, report held-out accuracy."""
    from txl.fileio import check_output_folder

    checkpoint_arg(args)
    resolve_settings(args)  # the --config file's settings where no flag gave one
    _check_args(args)  # the flags and paths, before torch is imported
    out = Path(args.resume or args.out)
    main_rank = os.environ.get("RANK", "0") == "0"  # torchrun: rank 0 checks, writes and reports
    if args.resume is None and main_rank:  # before anything is loaded (the training loop claims it later)
        inputs = [args.checkpoint, args.data, args.valid]
        if (out / RUN_NAME).is_file() and not any(p and Path(p).resolve() == out.resolve() for p in inputs):
            raise TxlError(f"--out {out} already holds a run; choose another --out, or continue it with "
                           f"{continue_command(out)}")
        check_output_folder(out, empty=True, inputs=inputs)
    from txl.classification.data import encode_texts  # imports torch: after the checks above
    from txl.config import ClassifierConfig
    from txl.config import VOCAB_NAME
    from txl.data import load_tokenizer
    from txl.training.checkpoint import resume_run_dir

    if args.resume is not None:  # RUN/last stands for RUN, as for txl train --resume
        args.resume = str(resume_run_dir(args.resume))
        out = Path(args.resume)
    if args.nproc is not None and "RANK" not in os.environ:  # the same command in N ranks (torchrun)
        return launch_ranks(args, args.device)
    lm_dir, lm_config, mode = _language_model(args)
    data = _load_documents(args, main_rank)
    docs, names = data.docs, data.names
    classifier = ClassifierConfig(num_labels=len(names), labels=names, mode=mode, pooling=args.pooling,
                                  grad_segments=args.grad_segments or None, passes=args.passes,
                                  recurrence=args.recurrence, head_init=args.head_init,
                                  classifier_dropout=args.dropout,
                                  max_tokens=args.max_tokens or None)
    tokenizer = load_tokenizer(lm_dir / VOCAB_NAME)
    data.encoded = encode_texts(tokenizer, [d.text for d in docs], classifier.max_tokens, [d.source for d in docs])
    use_threads(args)  # (the training loop's start line names them)
    held_from = f"from {args.valid}" if args.valid else f"(seed {args.seed})"
    tgt_len = lm_config.tgt_len if args.tgt_len is None else args.tgt_len
    mem_len = lm_config.mem_len if args.mem_len is None else args.mem_len
    if main_rank:  # the split and the span; the training loop's data: and model: lines say the rest
        print(f"documents: {len(docs)} with {len(names)} labels ({listed(names, 20)}); train {len(data.train_idx)}, "
              f"held-out {len(data.valid_idx)} {held_from}; read with tgt_len {tgt_len}, mem_len {mem_len}", flush=True)
    fit = _fit(args, lm_dir, classifier, data, out)
    if not main_rank:  # torchrun: rank 0 reports for the run
        return 0
    settings = {"data": str(args.data), "valid": args.valid, "checkpoint": str(lm_dir), "config": args.config,
                "steps": args.steps,
                "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup_steps,
                "weight_decay": args.weight_decay, "clip": args.clip, "dtype": args.dtype or "float32",
                "valid_fraction": None if args.valid else (args.valid_fraction or 0.2), "seed": args.seed,
                "tgt_len": tgt_len, "mem_len": mem_len, "classifier": classifier.to_dict()}
    _report(args, fit, data, settings, out)
    return 0


def _predict(args: argparse.Namespace) -> int:
    """``txl classify predict``: one JSON line per document with the label and the probabilities."""
    check_range(args, 1, "batch_size")
    check_exists(args.run, "classifier", kind="folder")  # paths before torch is imported
    for item in args.inputs:
        check_exists(item, "input", kind="file")
    from txl.classification.data import encode_texts
    from txl_recipes.classify.documents import Document, read_jsonl, read_text_file
    from txl.classification.model import TransformerXLForSequenceClassification
    from txl.runtime import resolve_device

    device = resolve_device(args.device)
    note_threads(args)
    model = TransformerXLForSequenceClassification.from_pretrained(args.run, map_location=str(device))
    if model.tokenizer is None:
        raise TxlError(f"{args.run} has no vocab.json: cannot encode text for this classifier")
    docs: list[Document] = []
    for item in args.inputs:
        path = Path(item)
        if not path.is_file():
            raise TxlError(f"input {item} is not a file; give text files or .jsonl files")
        if path.suffix == ".jsonl":
            docs += read_jsonl(path, need_label=False)
        else:
            docs.append(Document(read_text_file(path, model.tokenizer.kind), None, str(path)))
    if not docs:
        raise TxlError("no documents to classify (the .jsonl inputs hold no lines)")
    encoded = encode_texts(model.tokenizer, [d.text for d in docs], model.classifier.max_tokens,
                           [d.source for d in docs])
    print_notes(args)  # the threads (the input has passed its checks)
    known = [str(name) for name in model.classifier.labels]
    unknown = [d for d in docs if d.label is not None and str(d.label) not in known]
    if unknown:  # a true label is only copied to the output: said, so that a misspelt one is not scored silently
        print(f"txl: warning: {counted(len(unknown), 'document')} (first {unknown[0].source}: "
              f"{unknown[0].label!r}) {'gives' if len(unknown) == 1 else 'give'} a true label the classifier does not "
              f"know; its labels: {listed(known)}",
              file=sys.stderr)
    probs = model.predict_proba(encoded, batch_size=args.batch_size).numpy()
    names = model.classifier.labels
    for doc, row in zip(docs, probs):
        record = {"source": doc.source, "label": names[int(row.argmax())],  # as the training data gave it
                  "probs": {str(name): round(float(p), 6) for name, p in zip(names, row)}}
        if doc.label is not None:
            record["true_label"] = doc.label  # as this input gives it
        sys.stdout.write(json.dumps(record) + "\n")
    return 0


SUBCOMMANDS = (
    Command("train", "fine-tune a classifier from a txl LM checkpoint; report held-out accuracy",
            "txl classify train runs/wt103 --data reviews/ --out runs/reviews --steps 300", _add_train, _train),
    Command("predict", "print the label and probabilities of each document (JSON lines)",
            "txl classify predict runs/reviews new_review.txt more.jsonl", _add_predict, _predict),
)
