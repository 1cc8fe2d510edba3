"""Data pipeline: tokenizers, corpus loading/splitting, and the ordered segment iterator."""

from txl.data.corpus import (
    CorpusSplits,
    build_tokenizer,
    default_corpus_files,
    encode_corpus,
    load_bytes,
    load_corpus,
    read_corpus_files,
    split_tokens,
    token_dtype,
)
from txl.data.iterators import IGNORE_INDEX, LMOrderedIterator, sample_segment_length
from txl.data.tokenizers import (
    TOKENIZER_KINDS,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    decode_utf8,
    load_tokenizer,
    tokenizer_from_dict,
)

__all__ = [
    "IGNORE_INDEX",
    "TOKENIZER_KINDS",
    "ByteTokenizer",
    "CharTokenizer",
    "CorpusSplits",
    "LMOrderedIterator",
    "Tokenizer",
    "WordTokenizer",
    "build_tokenizer",
    "decode_utf8",
    "default_corpus_files",
    "encode_corpus",
    "load_bytes",
    "load_corpus",
    "load_tokenizer",
    "read_corpus_files",
    "sample_segment_length",
    "split_tokens",
    "token_dtype",
    "tokenizer_from_dict",
]
