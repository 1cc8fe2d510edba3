"""Model configuration: :class:`TransformerXLConfig` (names follow the paper and the reference code)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from txl.config.fields import check_choice, check_fields, check_minimums
from txl.config.span import AttentionSpan
from txl.errors import TxlError

# the position schemes (computed by txl.model.positions), and what each asks of a config
ATTN_TYPES = ("rel", "shaw", "abs", "rope")
WITHOUT_MEMORY = ("abs",)  # the vanilla Transformer: a segment's positions restart at 0, so no memory


def check_clamp(attn_type: str, clamp_len: int, flag: str = "clamp_len") -> None:
    """Refuse a ``clamp_len`` (given as ``flag``) that ``attn_type`` cannot read with.

    Raises:
        TxlError: "rope" with ``clamp_len`` > 0 (rotations have no distance to clamp).
    """
    if attn_type == "rope" and clamp_len:
        raise TxlError(f"{flag}={clamp_len} has no meaning with attn_type='rope' (rotations of every distance); "
                       "set it to 0")


def check_position_scheme(config: "TransformerXLConfig") -> None:
    """Refuse what ``config.attn_type`` cannot serve.

    Raises:
        TxlError: an unknown ``attn_type``; "shaw" with ``shaw_max_dist`` < 1; "rope" with an odd ``d_head``
            or a ``clamp_len``.
    """
    check_choice(config.attn_type, ATTN_TYPES, "model.attn_type")
    if config.attn_type == "shaw" and config.shaw_max_dist < 1:
        raise TxlError(f"model.attn_type='shaw' needs model.shaw_max_dist >= 1 (the clipping distance, e.g. "
                       f"tgt_len + mem_len - 1), got {config.shaw_max_dist}")
    if config.attn_type == "rope" and config.d_head % 2:
        raise TxlError(f"model.attn_type='rope' needs an even model.d_head (pairs of dimensions rotate), got "
                       f"{config.d_head}")
    check_clamp(config.attn_type, config.clamp_len, "model.clamp_len")


def position_parameters(config: "TransformerXLConfig") -> int:
    """Parameters a layer's position scheme holds of its own (an upper bound, for the size check)."""
    heads = config.n_head * config.d_head
    if config.attn_type == "rel":
        return heads * config.d_model + 2 * heads  # r_net and per-layer u/v (counted whether untied or not)
    if config.attn_type == "shaw":
        return (config.shaw_max_dist + 1) * heads
    return 0


COMPRESSIONS = ("conv1d", "max_pool", "mean_pool")  # the compression functions f_c of Rae et al. (2019) §3.1
# the floor of each number of a model config (d_embed None: unset), and what its message adds
_MINIMUM = {**dict.fromkeys(("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "tgt_len"), 1),
            "mem_len": 0, "clamp_len": 0, "d_embed": 1, "div_val": 1, "cmem_len": 0, "cmem_ratio": 1,
            "recon_loss_weight": 0}
_NOTES = {"clamp_len": " (0: no clamping)", "d_embed": " (or unset)", "cmem_len": " (0: no compressed memory)",
          "cmem_ratio": " (the compression rate c)"}


@dataclass
class TransformerXLConfig:
    """Hyper-parameters of a Transformer-XL language model (Dai et al. 2019, §3 and appendix B).

    Attributes:
        vocab_size: number of token ids (inputs must lie in ``[0, vocab_size)``).
        n_layer: number of decoder layers.
        d_model: width of the residual stream (must be even: sinusoidal positions use sin and cos halves).
        n_head: attention heads per layer.
        d_head: width of each head (``n_head * d_head`` need not equal ``d_model``).
        d_inner: hidden width of the position-wise feed-forward net.
        dropout: dropout on embeddings, positional encodings, sub-layer outputs and the final output.
        dropatt: dropout on attention probabilities.
        tgt_len: number of tokens predicted per segment (the training segment length).
        mem_len: number of past hidden states kept per layer as memory (0: no memory).
        clamp_len: relative distances above this use the encoding of ``clamp_len`` (0: no clamping; the
            reference's -1 is written 0 here).
        same_length: every query attends to the same number of keys, the last ``mem_len`` keys up to
            and including itself. With ``mem_len == 0`` it has no effect (plain causal attention).
        pre_lnorm: LayerNorm before each sub-layer instead of after the residual (post-LN default).
        untie_r: one pair of biases u, v (``r_w_bias``, ``r_r_bias``) per layer instead of one shared.
        tie_weight: share the input embedding matrix with the output softmax weights.
        attn_type: ``"rel"`` (Transformer-XL relative attention, §3.3), ``"shaw"`` (Shaw et al. 2018:
            a learned vector per clipped distance added to the keys, with memory; the paper's Table 6
            comparison), ``"rope"`` (rotary positions, Su et al. 2021, with memory; ``d_head`` even,
            no ``clamp_len``) or ``"abs"`` (the vanilla Transformer baseline: absolute sinusoidal
            positions added to the input, no memory). See :mod:`txl.model.positions`.
        shaw_max_dist: for ``attn_type="shaw"``, the largest distance with its own learned vector
            (Shaw's clipping distance k); longer distances share the vector of ``shaw_max_dist``. Each
            layer holds a table [shaw_max_dist + 1, n_head, d_head]. Unused by the other types.
        init_std: standard deviation of the normal initialisation of weights and of u, v.
        d_embed: width of the (first cluster's) embedding table; None means ``d_model``. When it
            differs from ``d_model`` the embedding and softmax are projected (adaptive input/softmax).
        cutoffs: adaptive input/softmax cluster boundaries (e.g. WikiText-103 ``[20000, 40000,
            200000]``); empty: one cluster, a plain embedding and softmax.
        div_val: cluster i has width ``d_embed // div_val**i`` (1: one shared table).
        tie_projs: per cluster, share the softmax projection with the embedding's; empty means
            the reference default ``[False] + [True] * len(cutoffs)``.
        proj_init_std: standard deviation of the normal initialisation of the projections.
        cmem_len: compressed-memory slots kept per layer (Compressive Transformer, Rae et al. 2019;
            0: off, the plain Transformer-XL). Needs an ``attn_type`` with memory. See
            :mod:`txl.model.compressive` and docs/compressive.md.
        cmem_ratio: compression rate c: each group of c states leaving the memory becomes one
            compressed slot (>= 1; the paper uses 3 for enwik8 and 4 for WikiText-103).
        compression: the compression function f_c: ``"conv1d"`` (the paper's best: a learned 1-D
            convolution with kernel and stride c, one per layer), ``"max_pool"`` or ``"mean_pool"``
            (kernel and stride c, no parameters).
        recon_loss_weight: weight of the attention-reconstruction loss (paper §3.2) in the training
            objective; it trains the compression network only (see :class:`~txl.model.LMOutput`).

    Raises:
        TxlError: from :meth:`check` for impossible values.
    """

    vocab_size: int = 256
    n_layer: int = 6
    d_model: int = 256
    n_head: int = 8
    d_head: int = 32
    d_inner: int = 1024
    dropout: float = 0.1
    dropatt: float = 0.0
    tgt_len: int = 128
    mem_len: int = 128
    clamp_len: int = 0
    same_length: bool = False
    pre_lnorm: bool = False
    untie_r: bool = False
    tie_weight: bool = True
    attn_type: str = "rel"
    shaw_max_dist: int = 0
    init_std: float = 0.02
    d_embed: int | None = None
    cutoffs: list[int] = dataclasses.field(default_factory=list)
    div_val: int = 1
    tie_projs: list[bool] = dataclasses.field(default_factory=list)
    proj_init_std: float = 0.01
    cmem_len: int = 0
    cmem_ratio: int = 3
    compression: str = "conv1d"
    recon_loss_weight: float = 1.0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first impossible value."""
        check_fields(type(self), dataclasses.asdict(self), "model")
        check_minimums(self, _MINIMUM, "model.", _NOTES)
        if self.d_model % 2:
            raise TxlError(f"model.d_model must be even (sinusoidal positions), got {self.d_model}")
        for name in ("dropout", "dropatt"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise TxlError(f"model.{name} must be in [0, 1), got {value}")
        check_position_scheme(self)
        check_minimums(self, {"shaw_max_dist": 0}, "model.")  # after the scheme's: "shaw" needs >= 1
        if not self.init_std > 0 or not self.proj_init_std > 0:
            raise TxlError(f"model.init_std and model.proj_init_std must be > 0, got {self.init_std}, {self.proj_init_std}")
        bounds = [0, *self.cutoffs]  # cutoffs < vocab_size is checked when the model is built: a run
        if any(a >= b for a, b in zip(bounds, bounds[1:])):  # config learns vocab_size from its corpus
            raise TxlError(f"model.cutoffs must be strictly increasing positive integers, got {self.cutoffs}")
        if self.div_val > 1 and self.embed_dim // self.div_val ** len(self.cutoffs) < 1:
            raise TxlError(f"model.d_embed={self.embed_dim} is too small for div_val={self.div_val} with "
                           f"{len(self.cutoffs) + 1} clusters")
        check_choice(self.compression, COMPRESSIONS, "model.compression")
        if self.cmem_len and not self.has_memory:
            raise TxlError(f"model.cmem_len > 0 (compressed memory) needs a memory: attn_type 'rel', 'shaw' or 'rope', "
                           f"not {self.attn_type!r}")
        if self.tie_projs and len(self.tie_projs) != len(self.cutoffs) + 1:
            raise TxlError(f"model.tie_projs needs one flag per cluster ({len(self.cutoffs) + 1}), got {self.tie_projs}")

    @property
    def has_memory(self) -> bool:
        """Whether the model keeps a memory (every ``attn_type`` but the vanilla "abs")."""
        return self.attn_type not in WITHOUT_MEMORY

    @property
    def embed_dim(self) -> int:
        """``d_embed``, defaulting to ``d_model``."""
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def span(self) -> AttentionSpan:
        """The training span (``tgt_len``, ``mem_len``, ``clamp_len``, ``same_length``, ``cmem_len``) as an :class:`AttentionSpan`."""
        return AttentionSpan.of(self)

    @property
    def tied_projections(self) -> list[bool]:
        """``tie_projs`` with the reference default filled in (one flag per cluster)."""
        return list(self.tie_projs) if self.tie_projs else [False] + [True] * len(self.cutoffs)

    def parameter_count(self) -> int:
        """An upper bound on the number of parameters this config implies, computed without building it.

        Counts the embedding and the output layer as untied and every adaptive cluster at full width,
        so the true count (``sum(p.numel() for p in model.parameters())``) is never larger.
        """
        d, heads, d_inner = self.d_model, self.n_head * self.d_head, self.d_inner
        clusters = len(self.cutoffs) + 1
        table = self.vocab_size * self.embed_dim + clusters * self.embed_dim * d  # tables + projections
        output = table + self.vocab_size + clusters * (self.embed_dim + 1)  # + biases and cluster weights
        per_layer = 4 * heads * d + 4 * d + 2 * d * d_inner + d_inner + d  # attention, LayerNorms, feed-forward
        per_layer += position_parameters(self)
        if self.cmem_len and self.compression == "conv1d":
            per_layer += d * d * self.cmem_ratio + d  # the compression convolution
        return table + output + self.n_layer * per_layer + 2 * heads

    def check_fits(self, memory_bytes: int, where: str = "the model config") -> None:
        """Refuse a config whose float32 parameters alone would not fit in ``memory_bytes``.

        Raises:
            TxlError: naming the parameter count, the bytes needed and the memory there is.
        """
        from txl.runtime import format_bytes  # (runtime reads the config's constants: imported when used)

        need = 4 * self.parameter_count()
        if need > memory_bytes:
            raise TxlError(f"{where} describes a model of up to {self.parameter_count():.3g} parameters "
                           f"({format_bytes(need)} in float32), more than this machine's memory "
                           f"({format_bytes(memory_bytes)}): the config is damaged or meant for a bigger machine "
                           f"(n_layer={self.n_layer}, d_model={self.d_model}, d_inner={self.d_inner}, "
                           f"vocab_size={self.vocab_size})")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TransformerXLConfig":
        """Build from a plain dict (e.g. JSON); unknown keys and wrong types raise :class:`TxlError`."""
        if not isinstance(values, dict):
            raise TxlError(f"model config must be a table/object, got {type(values).__name__}")
        return cls(**check_fields(cls, values, "model"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of all fields."""
        return dataclasses.asdict(self)


def check_compilable(config: TransformerXLConfig, what: str) -> None:
    """Refuse ``torch.compile`` (``what``: the setting or flag) for the models it does not serve yet.

    Raises:
        TxlError: a compressed memory (``cmem_len`` > 0: its host-side bookkeeping is not traced) or an
            adaptive softmax (``cutoffs``: traced, it would score every tail cluster for every token,
            N x V floats; for a word-level vocabulary that is gigabytes). docs/compile.md.
    """
    if config.cmem_len > 0:
        raise TxlError(f"{what} does not serve a compressed memory (model.cmem_len={config.cmem_len}) yet; "
                       f"drop {what}")
    if config.cutoffs:
        raise TxlError(f"{what} does not serve an adaptive softmax (model.cutoffs={config.cutoffs}) yet: traced, it "
                       f"would score every tail cluster for every token; drop {what}")
