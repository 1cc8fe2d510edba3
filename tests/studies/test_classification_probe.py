"""The probe-penalty sweep (txl_studies.classification.probe) on vectors whose answer is known."""

import torch

from txl_studies.classification.probe import PENALTIES, sweep


def test_a_stronger_penalty_fits_the_training_vectors_less_closely():
    # two classes apart along one feature, with noise in the other three: every C separates the test
    # vectors, and the training loss grows as C shrinks (the weights are held closer to zero)
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(200) % 2
    x = torch.randn(200, 4, generator=g, dtype=torch.float64)
    x[:, 0] += 6.0 * labels
    found = {"train": x[:150], "test": x[150:], "train_labels": labels[:150], "test_labels": labels[150:]}
    rows = sweep(found)
    assert [r["C"] for r in rows] == list(PENALTIES)
    assert all(r["test_accuracy"] == 1.0 and r["test_accuracy_interval"] == [1.0, 1.0] for r in rows)
    losses = [r["train_loss"] for r in rows]
    assert losses == sorted(losses) and losses[-1] > 10 * losses[0]
    norms = [r["weight_norm"] for r in rows]
    assert norms == sorted(norms, reverse=True)
