"""Study metrics of the form `package.module:function` used by the tests (`tuner.measure.user_metric`)."""

from __future__ import annotations

import numpy as np

NOT_A_FUNCTION = 3


def recall_at_k_loss(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> float:
    """1 - recall@3 of output `y`: the share of the reference's three best classes missing from the candidate's."""
    k, missed, total = 3, 0, 0
    for ref, got in zip(reference, candidate, strict=True):
        for r_row, c_row in zip(ref["y"].reshape(-1, ref["y"].shape[-1]), got["y"].reshape(-1, got["y"].shape[-1])):
            expected, found = set(np.argsort(r_row)[-k:]), set(np.argsort(c_row)[-k:])
            missed += len(expected - found)
            total += k
    return missed / total


def broken(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> float:
    """A metric with a bug: it always raises."""
    raise KeyError("boxes")
