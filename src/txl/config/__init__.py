"""One configuration mechanism: every setting of txl is a field of a dataclass here, checked by its
``check()`` through :func:`check_fields` (keys, types) and its own rules (ranges, combinations), whether it
comes from a TOML file, a command's flags, a checkpoint's JSON or the library. A recipe's own settings
(``txl classify train``'s, ``txl serve``'s limits) are a dataclass in its folder, checked the same way.

- :mod:`.fields`: the field checker, the constants every floor names, the checks of sampling, decoding,
  dynamic evaluation, split fractions and threads that commands run before torch is imported;
- :mod:`.span`: :class:`AttentionSpan`, how a reading is cut into segments and how far back it looks;
- :mod:`.model`: :class:`TransformerXLConfig`, the model (and what each position scheme asks of it);
- :mod:`.sections`, :mod:`.run`: a run's data, train, eval and finetune sections and :class:`RunConfig`,
  loaded from TOML with ``section.key=value`` overrides;
- :mod:`.classifier`: :class:`ClassifierConfig`, a document classifier's head and reading.
"""

from txl.config.fields import (did_you_mean, check_fields, HALF_DTYPES, check_weights_dtype, check_split,
                               check_sampling, check_decoding, check_dynamic, IGNORE_INDEX, TOKENIZERS, NORMALIZE, DTYPES,
                               WEIGHTS_NAME, CONFIG_NAME, VOCAB_NAME, RUN_NAME, STATE_NAME, CLASSIFIER_NAME,
                               CHECKSUMS_NAME, CHECKPOINT_NAMES, SPAN_FIELDS, SPAN_MINIMUM, MAX_THREADS, SEED_LIMIT,
                               check_count, check_seed, check_threads, check_choice, check_minimums)
from txl.config.sections import (DataConfig, TrainConfig, EvalConfig, FinetuneConfig)
from txl.config.span import (AttentionSpan, check_readable, resolve_span)
from txl.config.model import (ATTN_TYPES, WITHOUT_MEMORY, check_clamp, check_position_scheme, position_parameters,
                              COMPRESSIONS, TransformerXLConfig, check_compilable)
from txl.config.run import (SECTIONS, OPTIONAL_SECTIONS, RunConfig, parse_override, load_run_config)
from txl.config.classifier import MODES, POOLINGS, RECURRENCES, HEAD_INITS, SAVED_WITHOUT, ClassifierConfig

__all__ = ["did_you_mean", "check_fields", "HALF_DTYPES", "check_weights_dtype", "check_split",
           "check_sampling", "check_decoding", "check_dynamic", "IGNORE_INDEX", "TOKENIZERS", "NORMALIZE", "DTYPES",
           "WEIGHTS_NAME", "CONFIG_NAME", "VOCAB_NAME", "RUN_NAME", "STATE_NAME", "CLASSIFIER_NAME",
           "CHECKSUMS_NAME", "CHECKPOINT_NAMES", "SPAN_FIELDS", "SPAN_MINIMUM", "MAX_THREADS", "SEED_LIMIT", "check_count", "check_seed", "check_threads",
           "check_choice", "check_minimums", "DataConfig",
           "TrainConfig", "EvalConfig", "FinetuneConfig", "AttentionSpan", "check_readable", "resolve_span",
           "ATTN_TYPES", "WITHOUT_MEMORY", "check_clamp", "check_position_scheme", "position_parameters",
           "COMPRESSIONS", "TransformerXLConfig", "check_compilable", "SECTIONS", "OPTIONAL_SECTIONS",
           "RunConfig", "parse_override", "load_run_config", "MODES", "POOLINGS", "RECURRENCES", "HEAD_INITS",
           "SAVED_WITHOUT", "ClassifierConfig"]
