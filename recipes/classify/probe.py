"""The head's start: a linear probe over the pooled document vectors (LP-FT, Kumar et al., ICLR 2022).

Fine-tuning starts from a head fitted to the language model's own features instead of a random one:
every training document is read once, without autograd and without dropout, in the classifier's
reading; each feature of the pooled vectors is standardized by its mean and spread over those
documents (kept in the classifier as ``pool_shift`` and ``pool_scale``, applied to every pooled
vector from then on), and the head is fitted on them by multinomial logistic regression with an L2
penalty (L-BFGS, float64, to convergence: deterministic). Fine-tuning then moves the body and the
head from there.

Why: a pooled vector of a long document averages thousands of states, so its features differ little
from one document to the next and on scales that vary by orders of magnitude; a random head trained
by AdamW for a few hundred steps cannot reach the weights those features need, and the classifier
stays near chance while a probe on the same vectors separates the classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from txl.classification.data import batch_documents
from txl.errors import TxlError
from txl.segments import eval_mode

C = 1.0  #: the inverse strength of the L2 penalty, per document (scikit-learn's ``C`` of LogisticRegression)


@torch.no_grad()
def pooled_vectors(model, docs: Sequence[np.ndarray], batch_size: int = 8) -> torch.Tensor:
    """float64 [N, d_model]: the pooled vector of each document (int64 token ids, cut to ``max_tokens``)
    as ``model`` reads it in evaluation mode, before the standardization; in the order of ``docs``."""
    device = next(model.parameters()).device
    out = torch.empty(len(docs), model.config.d_model, dtype=torch.float64)
    with eval_mode(model):
        for index, ids, lengths in batch_documents(docs, batch_size, model.classifier.max_tokens):
            out[index] = model.encode(ids.to(device), lengths.to(device)).double().cpu()
    return out


def fit_probe(features: torch.Tensor, labels: Sequence[int], num_labels: int,
              c: float = C) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardize ``features`` (float [N, d]) and fit multinomial logistic regression to ``labels``
    (class indices in ``[0, num_labels)``): minimises the mean cross-entropy (nats) plus
    ``|W|^2 / (2 c N)`` by L-BFGS in float64.

    Returns:
        ``(shift, scale, weight, bias)``: float64 [d], [d], [num_labels, d], [num_labels]; the logits of a
        vector x are ``((x - shift) * scale) @ weight.T + bias``. A feature that does not vary (its spread
        at most 1e-6 of its size) gets scale 1.

    Raises:
        TxlError: no documents, or labels of another count than the features or outside the classes.
    """
    x = features.to(torch.float64)
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    if x.dim() != 2 or x.size(0) == 0 or y.shape != (x.size(0),):
        raise TxlError(f"the probe needs features [N, d] and N labels, got {tuple(x.shape)} and {tuple(y.shape)}")
    if int(y.min()) < 0 or int(y.max()) >= num_labels:
        raise TxlError(f"probe labels must be class indices in [0, {num_labels})")
    shift = x.mean(0)
    spread = x.std(0, unbiased=False)
    # a spread at the level of float32 rounding of the feature is no signal: such a feature is left unscaled
    varies = spread > 1e-6 * (shift.abs() + 1.0)
    scale = torch.where(varies, 1.0 / spread, torch.ones_like(spread))
    z = (x - shift) * scale
    weight = torch.zeros(num_labels, x.size(1), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_labels, dtype=torch.float64, requires_grad=True)
    penalty = 1.0 / (2.0 * c * x.size(0))
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=1000, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def objective():
        opt.zero_grad()
        loss = F.cross_entropy(z @ weight.T + bias, y) + penalty * (weight ** 2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(objective)
    return shift, scale, weight.detach(), bias.detach()


def probe_head(model, docs: Sequence[np.ndarray], labels: Sequence[int], batch_size: int = 8) -> None:
    """Set ``model``'s standardization and head from a linear probe over ``docs`` (see the module doc), in place.

    Raises:
        TxlError: as :func:`fit_probe`; a model whose config does not start its head from a probe.
    """
    if model.classifier.head_init != "probe":
        raise TxlError("this classifier's head starts at random (head_init='random'): it keeps no standardization")
    shift, scale, weight, bias = fit_probe(pooled_vectors(model, docs, batch_size), labels,
                                           model.classifier.num_labels)
    with torch.no_grad():
        model.pool_shift.copy_(shift)
        model.pool_scale.copy_(scale)
        model.head.weight.copy_(weight)
        model.head.bias.copy_(bias)


__all__ = ["C", "fit_probe", "pooled_vectors", "probe_head"]
