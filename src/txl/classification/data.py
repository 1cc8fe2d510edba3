"""Documents as the classifier reads them: token ids, right-padded batches, batches of similar length."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from txl.errors import TxlError


def encode_texts(tokenizer, texts: Sequence[str], max_tokens: int | None = None,
                 sources: Sequence[str] | None = None) -> list[np.ndarray]:
    """Token ids (int64 [n_i]) of each text, cut to the first ``max_tokens`` (None: whole text).

    Raises:
        TxlError: a text the tokenizer cannot encode, or that encodes to no tokens (named by ``sources``
            when given, else by its position).
    """
    out = []
    for i, text in enumerate(texts):
        name = sources[i] if sources else i
        try:
            ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
        except TxlError as err:  # e.g. characters a char vocabulary lacks: said with the document
            raise TxlError(f"document {name}: {err}") from None
        if ids.size == 0:
            raise TxlError(f"document {name} is empty (no tokens); give it text")
        out.append(ids[:max_tokens] if max_tokens else ids)
    return out


def pad_batch(docs: Sequence[np.ndarray], max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token sequences: int64 ids [B, L] (padding id 0) and int64 lengths [B].

    Raises:
        TxlError: an empty sequence.
    """
    docs = [d[:max_tokens] if max_tokens else d for d in docs]
    lengths = torch.tensor([len(d) for d in docs], dtype=torch.long)
    if len(docs) == 0 or int(lengths.min()) < 1:
        raise TxlError("every document needs at least one token")
    ids = torch.zeros(len(docs), int(lengths.max()), dtype=torch.long)
    for row, d in enumerate(docs):
        ids[row, :len(d)] = torch.as_tensor(np.asarray(d, dtype=np.int64))
    return ids, lengths


def batch_documents(docs: Sequence[np.ndarray], batch_size: int, max_tokens: int | None = None
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Batches of documents of similar length (sorted by length, longest first) for inference.

    Yields:
        ``(index, ids, lengths)``: int64 [B] positions in ``docs``, int64 [B, L] right-padded ids,
        int64 [B] real lengths.
    """
    order = sorted(range(len(docs)), key=lambda i: -min(len(docs[i]), max_tokens or len(docs[i])))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ids, lengths = pad_batch([docs[i] for i in chunk], max_tokens)
        yield torch.tensor(chunk, dtype=torch.long), ids, lengths
