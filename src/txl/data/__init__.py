"""Data pipeline: tokenizers, corpus loading/splitting and segment iterators (``txl data prepare``, which
writes the standard datasets' folders, is a recipe: ``recipes/datasets``)."""

from txl.data.corpus import (
    CorpusSplits,
    default_corpus_files,
    encode_corpus,
    load_bytes,
    load_corpus,
    read_corpus_files,
    shard_sentences,
    split_tokens,
    token_dtype,
)
from txl.data.files import dataset_info
from txl.data.iterators import IGNORE_INDEX, LMOrderedIterator, LMShuffledIterator, sample_segment_length
from txl.data.tokenizers.bpe import BPETokenizer
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
from txl.data.tokenizers.wikitext import wikitext_detokenize, wikitext_tokenize

__all__ = [
    "IGNORE_INDEX",
    "TOKENIZER_KINDS",
    "BPETokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "CorpusSplits",
    "LMOrderedIterator",
    "LMShuffledIterator",
    "Tokenizer",
    "WordTokenizer",
    "dataset_info",
    "decode_utf8",
    "default_corpus_files",
    "encode_corpus",
    "load_bytes",
    "load_corpus",
    "load_tokenizer",
    "read_corpus_files",
    "shard_sentences",
    "sample_segment_length",
    "split_tokens",
    "token_dtype",
    "tokenizer_from_dict",
    "wikitext_detokenize",
    "wikitext_tokenize",
]
