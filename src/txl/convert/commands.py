"""``txl convert``: whole-folder conversion between HF TransfoXL and txl checkpoints, vocabulary included."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

from txl.config import EvalConfig, RunConfig
from txl.convert.hf_transfo_xl import model_from_hf_state, read_hf_checkpoint, write_hf_checkpoint
from txl.convert.safe_pickle import load_restricted_pickle, transfo_xl_words
from txl.data import Tokenizer, WordTokenizer, load_tokenizer
from txl.errors import TxlError
from txl.fileio import FolderClaim, atomic_write, claim_folder, read_json_object
from txl.training.checkpoint import load_checkpoint, save_checkpoint


def _claim(dst: Path, inputs: list) -> FolderClaim:
    """Claim ``dst`` for this conversion: new or empty, not an input, not inside a checkpoint, one process."""
    return claim_folder(dst, flag="DST", empty=True, inputs=inputs)


def read_hf_vocab(path: Path, size: int | None = None) -> WordTokenizer:
    """A txl word tokenizer from HF's pickled ``vocab.pkl`` (read by the restricted reader, ids kept),
    with the tokens added to it (``tokenizer.add_tokens``): those the pickle holds and those of
    ``added_tokens.json`` and ``tokenizer_config.json`` beside it, as
    :func:`~txl.convert.safe_pickle.transfo_xl_words` describes (``size``: the model's vocabulary
    size; added tokens beyond it are left out).

    Raises:
        TxlError: refused or malformed pickle, unreadable JSON beside it, added tokens that do not
            fit the vocabulary, or a vocabulary without ``<unk>``/``<eos>``.
    """
    state = load_restricted_pickle(path.read_bytes())
    words = transfo_xl_words(state, _saved_added_tokens(path.parent), where=str(path), size=size)
    return WordTokenizer(words, lower=bool(state.get("lower_case", False)))


def _saved_added_tokens(folder: Path) -> list[tuple[object, object]]:
    """``(id, text)`` of the added tokens that ``save_pretrained`` wrote into ``folder``: ``added_tokens.json``
    (``{text: id}``) and the ``added_tokens_decoder`` of ``tokenizer_config.json`` (``{"id": {"content": text}}``;
    its ids are JSON keys, so decimal strings are read as numbers). The entries are checked where the
    vocabulary is built (:func:`~txl.convert.safe_pickle.transfo_xl_words`).

    Raises:
        TxlError: an unreadable file, or an ``added_tokens_decoder`` that is not an object.
    """
    found: list[tuple[object, object]] = []
    if (folder / "added_tokens.json").is_file():
        found += [(i, text) for text, i in read_json_object(folder / "added_tokens.json", "added tokens").items()]
    if (folder / "tokenizer_config.json").is_file():
        config = read_json_object(folder / "tokenizer_config.json", "tokenizer config")
        decoder = config.get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):
            raise TxlError(f"{folder / 'tokenizer_config.json'}: added_tokens_decoder must be an object")
        found += [(int(i) if i.isdigit() else i, token.get("content") if isinstance(token, dict) else token)
                  for i, token in decoder.items()]
    return found


def convert_from_hf(src: str | Path, dst: str | Path, vocab: str | Path | None = None) -> Path:
    """Convert an HF ``TransfoXLLMHeadModel`` folder into a txl checkpoint folder ``dst``.

    The run config carries the HF evaluation settings (``mem_len``, ``clamp_len``, ``same_length``)
    and the vocabulary's tokenizer kind. The vocabulary is ``vocab`` when given, else ``src/txl_vocab.json``
    (what :func:`convert_to_hf` writes), else HF's ``src/vocab.pkl``.

    Raises:
        TxlError: unreadable or unsafe input, key-map mismatches, a vocabulary whose size differs
            from the model's, or a ``dst`` that is not empty, is in use by another process or lies
            inside a checkpoint or run folder.
    """
    src, dst = Path(src), Path(dst)
    with _claim(dst, [src, vocab]):
        return _from_hf(src, dst, vocab)


def _from_hf(src: Path, dst: Path, vocab: str | Path | None) -> Path:
    """:func:`convert_from_hf` once ``dst`` is claimed."""
    config, state = read_hf_checkpoint(src)
    model = model_from_hf_state(config, state)
    if vocab:
        vocab_path = Path(vocab)
    elif (src / "txl_vocab.json").is_file():  # written by txl convert to-hf: the exact txl tokenizer
        vocab_path = src / "txl_vocab.json"
    else:
        vocab_path = src / "vocab.pkl"
    if not vocab_path.is_file():
        raise TxlError(f"no vocabulary at {vocab_path}; pass --vocab (an HF vocab.pkl or a txl vocab.json)")
    tokenizer: Tokenizer = (load_tokenizer(vocab_path) if vocab_path.suffix == ".json"
                            else read_hf_vocab(vocab_path, size=config.vocab_size))
    if tokenizer.vocab_size != config.vocab_size:
        raise TxlError(f"the vocabulary has {tokenizer.vocab_size} entries, the model {config.vocab_size}")
    run = RunConfig(model=config, eval=EvalConfig(tgt_len=config.tgt_len, mem_len=config.mem_len,
                                                  clamp_len=config.clamp_len, same_length=config.same_length))
    run.data.tokenizer = tokenizer.kind
    save_checkpoint(dst, model, tokenizer, run, {"converted_from": str(src)})
    return dst


def convert_to_hf(src: str | Path, dst: str | Path) -> Path:
    """Write the txl checkpoint ``src`` as an HF ``TransfoXLLMHeadModel`` folder ``dst``
    (``config.json``, ``model.safetensors`` and, for word vocabularies, HF's ``vocab.pkl``).

    Raises:
        TxlError: a model HF cannot express (``attn_type="abs"``, a compressed memory, unusual
            ``tie_projs``, int8 weights) or a
            ``dst`` that is not empty, is in use by another process or lies inside a checkpoint or run
            folder. A failed write removes what it wrote.
    """
    src, dst = Path(src), Path(dst)
    with _claim(dst, [src]):
        try:
            return _to_hf(src, dst)
        except BaseException:
            for item in dst.iterdir():  # dst was empty when claimed: everything in it is this call's
                shutil.rmtree(item) if item.is_dir() and not item.is_symlink() else item.unlink(missing_ok=True)
            raise


def _to_hf(src: Path, dst: Path) -> Path:
    """:func:`convert_to_hf` once ``dst`` is claimed."""
    ckpt = load_checkpoint(src)
    from txl.kernels.int8 import is_quantized

    if is_quantized(ckpt.model):
        raise TxlError(f"{ckpt.path} holds int8 weights, which a TransfoXL checkpoint cannot; convert the float "
                       "checkpoint it was made from")
    write_hf_checkpoint(ckpt.model, dst)
    tok = ckpt.tokenizer
    if isinstance(tok, WordTokenizer):
        # HF's tokenizer reads its vocabulary with pickle; txl only writes plain containers into it
        state = {"idx2sym": list(tok.words), "sym2idx": {w: i for i, w in enumerate(tok.words)},
                 "special": [tok.EOS], "lower_case": tok.lower, "min_freq": 0, "max_size": None,
                 "delimiter": None, "unk_idx": tok.unk_id}
        atomic_write(dst / "vocab.pkl", lambda tmp: Path(tmp).write_bytes(pickle.dumps(state, protocol=4)))
    atomic_write(dst / "txl_vocab.json", lambda tmp: Path(tmp).write_text(json.dumps(tok.to_dict()), encoding="utf-8"))
    return dst


def convert_to_int8(src: str | Path, dst: str | Path) -> Path:
    """Write the txl checkpoint ``src`` (a checkpoint folder, or a run folder: its ``best/``) as a checkpoint
    ``dst`` whose linear layers hold int8 weights (:func:`txl.kernels.int8.quantize_int8`): the same run
    config and vocabulary, ``model.safetensors`` with int8 weights and their scales. Every command loads it
    as it is (inference only).

    Raises:
        TxlError: an unreadable ``src``, one already int8, or a ``dst`` that is not empty, is in use by another
            process or lies inside a checkpoint or run folder.
    """
    from txl.kernels.int8 import is_quantized, quantize_int8

    src, dst = Path(src), Path(dst)
    with _claim(dst, [src]):
        ckpt = load_checkpoint(src)
        if is_quantized(ckpt.model):
            raise TxlError(f"{ckpt.path} already holds int8 weights; nothing to convert")
        save_checkpoint(dst, quantize_int8(ckpt.model), ckpt.tokenizer, ckpt.run,
                        {"quantized_from": str(ckpt.path), "quantize": "int8"})
        return dst
