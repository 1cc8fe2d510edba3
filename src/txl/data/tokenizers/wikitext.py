"""WikiText-style word tokenisation of raw text, and a best-effort inverse.

The WikiText corpora (Merity et al. 2016) were tokenised with the Moses tokenizer in its default
English mode with aggressive hyphen splitting and without XML escaping, followed by splitting
number separators. The conventions, checked against the published text (e.g. `` = = Gameplay = =``,
``role @-@ playing``, ``0 @.@ 7 – 2 @.@ 2 kg ( 1 @.@ 5 lb )``, ``" lobster red "``, ``H. americanus``
kept but ``lit . Valkyria`` split) and against the Moses rules as ported in ``sacremoses`` (also
what the Hugging Face Transformer-XL tokenizer runs on raw text):

* punctuation and symbols other than ``. ' ` , -`` become separate tokens: ``( 24 in )``,
  ``" cutter "``, ``5 – 6``, ``= = Description = =`` (from ``== Description ==``);
* a hyphen between two letters/digits becomes ``@-@``: ``well @-@ known``, ``1990 @-@ 91``;
* a comma or period between two digits becomes ``@,@`` / ``@.@``: ``1 @,@ 000``, ``3 @.@ 5``;
  other commas are split off: ``Paris , France``;
* apostrophes follow Moses' English rules: ``it 's``, ``game 's``, ``don 't``, ``players '``,
  ``1990 's``. (This is not the Penn Treebank ``do n't`` split: WikiText keeps ``"`` and ``( )``
  as they are, which only Moses' default mode does, and that mode splits before the apostrophe.)
* a word-final period is split off (``Sea .``) unless the word contains another period and a
  letter (``U.S.``, ``e.g.``), is a known abbreviation (``Dr.``, single capitals ``H.``), or the
  next word starts with a lower-case letter; ``No. 5`` keeps its period only before a number;
* runs of periods stay together as one token (``...``).

Words that are already WikiText tokens (``@-@``, ``@,@``, ``@.@``, ``<unk>``, ``<eos>``,
``<formula>``, and clitics such as ``'s`` standing alone) pass through unchanged, so tokenising
text that is already tokenised this way gives back the same tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["wikitext_tokenize", "wikitext_detokenize", "WIKITEXT_PROTECTED"]

WIKITEXT_PROTECTED = frozenset({"@-@", "@,@", "@.@", "<unk>", "<eos>", "<formula>"})
"""Tokens passed through unchanged by :func:`wikitext_tokenize`."""

_CLITIC_WORD = re.compile(r"'(?:s|t|re|ve|ll|m|d)", re.IGNORECASE)
_ALPHA = r"[^\W\d_]"
_NOT_ALPHA = r"[\W\d_]"
_ALNUM = r"[^\W_]"

# Each step is (compiled pattern, replacement), applied in order to " <text> ".
_STEPS = [
    (re.compile(r"[\x00-\x1f]"), ""),  # control characters (tabs/newlines were turned into spaces)
    (re.compile(r"([^\w\s.'`,\-]|_)"), r" \1 "),  # pad symbols that are not letters/digits
    (re.compile(rf"(?<={_ALNUM})-(?={_ALNUM})"), " @-@ "),  # aggressive hyphen split
    (re.compile(r"\.{2,}"), r" \g<0> "),  # keep runs of periods together, as their own token
    (re.compile(r"(?<!\d),|,(?!\d)"), " , "),  # commas, except between digits
    # English apostrophes (Moses order: each rule sees the output of the previous one)
    (re.compile(rf"({_NOT_ALPHA})'({_NOT_ALPHA})"), r"\1 ' \2"),
    (re.compile(rf"([\W_])'({_ALPHA})"), r"\1 ' \2"),
    (re.compile(rf"({_ALPHA})'({_NOT_ALPHA})"), r"\1 ' \2"),
    (re.compile(rf"({_ALPHA})'({_ALPHA})"), r"\1 '\2"),
    (re.compile(r"(\d)'(s)"), r"\1 '\2"),
]
_NUMBER_SEP = re.compile(r"(?<=\d)([,.])(?=\d)")
_SPACES = re.compile(r"\s+")

# A subset of Moses' English non-breaking prefixes: a period after these stays attached.
_NONBREAKING = frozenset(
    [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + "Adj Adm Adv Asst Bart Bldg Brig Bros Capt Cmdr Col Comdr Con Corp Cpl DR Dr Drs Ens Gen Gov "
    "Hon Hr Hosp Insp Jr Lt MM MR MRS MS Maj Messrs Mlle Mme Mr Mrs Ms Msgr Op Ord Pfc Ph Prof Pvt "
    "Rep Reps Res Rev Rt Sen Sens Sfc Sgt Sr St Supt Surg v vs i.e rev e.g Jan Feb Mar Apr Jun Jul "
    "Aug Sep Sept Oct Nov Dec".split()
)
_NUMERIC_ONLY = frozenset("No Nos Art Nr pp".split())  # keep the period only before a number


def _moses_segment(text: str) -> list[str]:
    """Moses-style splitting of a run of non-protected words (before the period rule)."""
    s = f" {text} "
    for pattern, repl in _STEPS:
        s = pattern.sub(repl, s)
    return s.split()


def _split_final_periods(tokens: list[str]) -> list[str]:
    """Split a word-final period off, except after abbreviations (Moses non-breaking prefixes)."""
    out: list[str] = []
    n = len(tokens)
    for i, tok in enumerate(tokens):
        if len(tok) < 2 or not tok.endswith(".") or tok in WIKITEXT_PROTECTED or set(tok) == {"."}:
            out.append(tok)
            continue
        prefix = tok[:-1]
        nxt = tokens[i + 1] if i + 1 < n else ""
        keep = (
            ("." in prefix and any(c.isalpha() for c in prefix))
            or prefix in _NONBREAKING
            or (nxt[:1].islower())
            or (prefix in _NUMERIC_ONLY and nxt[:1].isdigit())
        )
        if keep:
            out.append(tok)
        else:
            out.extend((prefix, "."))
    return out


def wikitext_tokenize(line: str) -> list[str]:
    """Split one line of raw text into WikiText-103 style tokens.

    Args:
        line: raw text of one line (any newlines inside are treated as spaces).

    Returns:
        The tokens, e.g. ``"The game's well-known system sold 1,000 copies."`` gives
        ``["The", "game", "'s", "well", "@-@", "known", "system", "sold", "1", "@,@", "000",
        "copies", "."]``. No ``<eos>`` is added; see the module docstring for the conventions.

    Limits: an approximation of Moses (a subset of its abbreviation list; Python's notion of
    letters and digits, so combining marks are split off like symbols; apostrophes at the very
    start/end of a line are split as if spaces surrounded the line).
    """
    words = _SPACES.split(line.strip())
    if words == [""]:
        return []
    tokens: list[str] = []
    run: list[str] = []
    for w in words:
        if w in WIKITEXT_PROTECTED or _CLITIC_WORD.fullmatch(w):
            if run:
                tokens.extend(_moses_segment(" ".join(run)))
                run = []
            tokens.append(w)
        else:
            run.append(w)
    if run:
        tokens.extend(_moses_segment(" ".join(run)))
    tokens = _split_final_periods(tokens)
    out: list[str] = []
    for tok in tokens:
        if tok in WIKITEXT_PROTECTED or not _NUMBER_SEP.search(tok):
            out.append(tok)
        else:
            out.extend(_NUMBER_SEP.sub(r" @\1@ ", tok).split())
    return out


_JOIN = {"@-@": "-", "@,@": ",", "@.@": "."}
_NO_SPACE_BEFORE = frozenset({",", ".", "?", "!", ":", ";", "%", ")", "]", "}", "n't", "N'T"})
_NO_SPACE_AFTER = frozenset({"(", "[", "{", "$", "£", "€", "#", "¿", "¡"})
_CLITIC = re.compile(r"^'[A-Za-z]+$")


def wikitext_detokenize(tokens: Iterable[str] | str) -> str:
    """Best-effort inverse of :func:`wikitext_tokenize` for one line.

    Args:
        tokens: a list of tokens, or one string of space-separated tokens (one line).

    Returns:
        Readable text: ``@-@``/``@,@``/``@.@`` are joined (``well-known``, ``1,000``, ``3.5``),
        punctuation is attached to the preceding word, ``( x )`` becomes ``(x)``, paired ``"`` hug
        their contents, clitics re-attach (``it's``, ``don't``, ``players'``) and heading markers
        merge (``= = History = =`` → ``== History ==``).

    Limits: the original spacing is not recorded, so text that had spaces inside a hyphenated or
    numeric expression, around a period, or that used dashes or slashes without spaces (``5–6``
    gives ``5 – 6``) does not come back exactly; ``<unk>`` stays as it is; unbalanced or
    single-quoted quotations may attach to the wrong side.
    """
    toks = tokens.split() if isinstance(tokens, str) else [t for t in tokens]
    merged: list[str] = []
    i = 0
    while i < len(toks):  # join hyphens/number separators and runs of '='
        t = toks[i]
        if t in _JOIN and merged and i + 1 < len(toks):
            merged[-1] = merged[-1] + _JOIN[t] + toks[i + 1]
            i += 2
            continue
        if t == "=" and merged and set(merged[-1]) == {"="}:
            merged[-1] += "="
        else:
            merged.append(t)
        i += 1
    out = ""
    space = ""  # what to put before the next token
    open_quote = False
    for j, t in enumerate(merged):
        prev = merged[j - 1] if j else ""
        if t in _NO_SPACE_BEFORE or (set(t) == {"."} and len(t) > 1) or (_CLITIC.match(t) and j):
            out += t
            space = " "
        elif t == "'" and prev.endswith(("s", "S")):
            out += t
            space = " "
        elif t == '"':
            if open_quote:
                out += t
                space = " "
            else:
                out += space + t
                space = ""
            open_quote = not open_quote
        elif t in _NO_SPACE_AFTER:
            out += space + t
            space = ""
        else:
            out += space + t
            space = " "
    return out
