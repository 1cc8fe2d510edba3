"""Data pipeline: tokenizers, corpus loading/splitting, segment iterators and standard datasets."""

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
from txl.data.datasets import DATASETS, dataset_info, prepare_dataset, standard_split
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
    "DATASETS",
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
    "prepare_dataset",
    "read_corpus_files",
    "shard_sentences",
    "sample_segment_length",
    "split_tokens",
    "standard_split",
    "token_dtype",
    "tokenizer_from_dict",
    "wikitext_detokenize",
    "wikitext_tokenize",
]
