"""Linear centered kernel alignment (CKA; Kornblith et al. 2019) between representations.

For representations X (n, p) and Y (n, q) of the same n examples, centred over the examples,

    CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)

which equals HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) with linear kernels K = X X^T, L = Y Y^T.
It lies in [0, 1], is 1 for X vs itself, and is invariant to orthogonal transforms and isotropic
scaling of either side (not to arbitrary invertible linear maps).

The feature-space form above costs O(n p q) and needs only the cross-products, so
``CKAAccumulator`` streams many representations batch by batch (e.g. the token states of every
recursion step over a test set) and never holds an n x n Gram matrix.
"""
from __future__ import annotations

from typing import List, Sequence

import torch


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(n, ...) -> (n, features) in float64."""
    return x.reshape(x.shape[0], -1).to(torch.float64)


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two representations of the same n examples: (n, ...) each -> float in [0, 1]."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same examples on both sides: {x.shape[0]} vs {y.shape[0]} rows")
    x, y = _flat(x), _flat(y)
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    if x.shape[0] < max(x.shape[1], y.shape[1]):  # Gram form is cheaper
        k, l = x @ x.T, y @ y.T
        num, dx, dy = (k * l).sum(), (k * k).sum(), (l * l).sum()
    else:
        num = (y.T @ x).pow(2).sum()
        dx, dy = (x.T @ x).pow(2).sum(), (y.T @ y).pow(2).sum()
    den = (dx * dy).sqrt()
    return float(num / den) if den > 0 else float("nan")


class CKAAccumulator:
    """Pairwise linear CKA of K representations, accumulated over batches of examples.

    ``update([r_1, ..., r_K])`` takes K tensors (b, ..., d) with the same leading rows (the same
    examples in the same order) and feature size d; ``matrix()`` returns the (K, K) CKA matrix
    over all rows seen. Exact (not minibatch-averaged): centring uses the global means,
    via sum(x y^T) - n mean_x mean_y^T.
    """

    def __init__(self):
        self.n = 0
        self.sums: List[torch.Tensor] = []
        self.cross: List[List[torch.Tensor]] = []

    def update(self, reps: Sequence[torch.Tensor]) -> None:
        flat = [_flat(r.detach().cpu()) for r in reps]
        if not self.sums:
            self.sums = [torch.zeros(f.shape[1], dtype=torch.float64) for f in flat]
            self.cross = [[torch.zeros(flat[i].shape[1], flat[j].shape[1], dtype=torch.float64)
                           for j in range(len(flat))] for i in range(len(flat))]
        if len(flat) != len(self.sums):
            raise ValueError(f"expected {len(self.sums)} representations, got {len(flat)}")
        for i, fi in enumerate(flat):
            self.sums[i] += fi.sum(0)
            for j in range(i, len(flat)):
                self.cross[i][j] += fi.T @ flat[j]
        self.n += flat[0].shape[0]

    def _centred(self, i: int, j: int) -> torch.Tensor:
        a, b = (i, j) if i <= j else (j, i)
        c = self.cross[a][b] - torch.outer(self.sums[a], self.sums[b]) / self.n
        return c if i <= j else c.T

    def matrix(self) -> torch.Tensor:
        K = len(self.sums)
        self_norm = [self._centred(i, i).pow(2).sum().sqrt() for i in range(K)]
        out = torch.empty(K, K, dtype=torch.float64)
        for i in range(K):
            for j in range(i, K):
                den = self_norm[i] * self_norm[j]
                v = self._centred(i, j).pow(2).sum() / den if den > 0 else torch.tensor(float("nan"))
                out[i, j] = out[j, i] = v
        return out
