"""Choose K for each batch size from measured step cost and acceptance.

Pure arithmetic, no vLLM: :mod:`vllm_ppspec.adaptive_k.chooser` feeds it what
the scheduler saw and turns the result into vLLM's schedule.

* :class:`Acceptance` counts, per draft position ``i``, the rounds whose
  drafts were proposed with ``K >= i``, how many of them had an ``i``-th
  draft (ngram may find fewer than ``K``) and how many accepted it.
  ``accepted(K)`` and ``drafted(K)`` are the expected accepted and drafted
  tokens per request of a round proposed with ``K``.
* :func:`fit_cost` fits the time a batch takes through the pipeline's
  slowest stage, ``c0 + c_token * tokens + c_pass * K + c_req * requests``
  (``K``: the drafter's passes after the batch), by least squares with no
  negative term.
* :func:`best_k` picks, for each batch size ``B``, the ``K`` that maximises
  tokens per second, ``B * (1 + accepted(K)) / cost(B, K)``;
  :func:`step_toward` moves a running K one step toward it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROBUST_PASSES = 30
MARGIN = 0.02  # a step of K must gain more than this share of tokens per second


@dataclass
class Acceptance:
    k: int
    reached: list[int] = field(default_factory=list)  # rounds proposed with K >= i
    drafted: list[int] = field(default_factory=list)  # ... with an i-th draft
    accepted: list[int] = field(default_factory=list)  # ... whose i-th draft was accepted

    def __post_init__(self) -> None:
        for counts in (self.reached, self.drafted, self.accepted):
            counts.extend([0] * (self.k - len(counts)))

    def add(self, proposed_k: int, num_drafts: int, num_accepted: int) -> None:
        """One request's round: drafts proposed with ``proposed_k``, ``num_drafts``
        of them scheduled, ``num_accepted`` accepted."""
        for i in range(min(proposed_k, self.k)):
            self.reached[i] += 1
            self.drafted[i] += num_drafts > i
            self.accepted[i] += num_accepted > i

    def rate(self, counts: list[int], i: int) -> float:
        return counts[i] / self.reached[i] if self.reached[i] else 0.0

    def accepted_per_round(self, k: int) -> float:
        return sum(self.rate(self.accepted, i) for i in range(k))

    def drafted_per_round(self, k: int) -> float:
        return sum(self.rate(self.drafted, i) for i in range(k))

    def least_reached(self) -> int:
        return min(self.reached) if self.reached else 0


@dataclass(frozen=True)
class Cost:
    """Seconds a batch takes through the pipeline's slowest stage."""

    base: float
    per_token: float
    per_pass: float
    per_request: float

    def of(self, requests: int, tokens: float, k: int) -> float:
        return self.base + self.per_token * tokens + self.per_pass * k + self.per_request * requests


def fit_cost(samples: list[tuple[int, int, int, float]]) -> Cost:
    """Least squares over ``(requests, tokens, k, seconds)`` samples, every
    term >= 0. A term whose input does not vary is left out (its share goes
    to ``base``). Least absolute deviations (reweighted least squares,
    :data:`ROBUST_PASSES` passes), so that a stalled batch (a preemption, another
    process on the core) does not pull the fit."""
    data = np.asarray(samples, dtype=float)
    requests, tokens, passes, seconds = data.T
    columns = {"per_token": tokens, "per_pass": passes, "per_request": requests}
    varying = [name for name, x in columns.items() if np.ptp(x) > 0]
    if varying and "per_request" in varying and "per_token" in varying:
        # One request per batch size: tokens and requests move together.
        if np.corrcoef(tokens, requests)[0, 1] > 0.98:
            varying.remove("per_request")
    weights = np.ones_like(seconds)
    floor = 1e-3 * float(np.median(seconds)) + 1e-12
    for _ in range(ROBUST_PASSES):
        coef = _nonnegative_fit(seconds, {n: columns[n] for n in varying}, weights)
        predicted = coef["base"] + sum(coef.get(n, 0.0) * columns[n] for n in varying)
        weights = 1 / np.maximum(np.abs(seconds - predicted), floor)
    return Cost(
        base=coef["base"],
        per_token=coef.get("per_token", 0.0),
        per_pass=coef.get("per_pass", 0.0),
        per_request=coef.get("per_request", 0.0),
    )


def _nonnegative_fit(
    y: np.ndarray, columns: dict[str, np.ndarray], weights: np.ndarray
) -> dict[str, float]:
    """Weighted least squares ``y ~ base + sum(c * x)``; while a coefficient is
    negative, the most negative one is set to 0 and the rest refitted."""
    names = list(columns)
    root = np.sqrt(weights)
    while True:
        x = np.column_stack([np.ones_like(y)] + [columns[n] for n in names])
        solution = np.linalg.lstsq(x * root[:, None], y * root, rcond=None)[0]
        coef = dict(zip(["base", *names], (float(c) for c in solution), strict=True))
        negative = [n for n in names if coef[n] < 0]
        if not negative:
            coef["base"] = max(coef["base"], 0.0)
            return coef
        names.remove(min(negative, key=lambda n: coef[n]))


def rates(cost: Cost, acceptance: Acceptance, batch_size: int) -> list[float]:
    """Tokens per second at ``batch_size`` for each K in ``0..k``."""
    out = []
    for k in range(acceptance.k + 1):
        tokens = batch_size * (1 + acceptance.drafted_per_round(k))
        seconds = cost.of(batch_size, tokens, k)
        out.append(batch_size * (1 + acceptance.accepted_per_round(k)) / max(seconds, 1e-12))
    return out


def best_k(cost: Cost, acceptance: Acceptance, batch_size: int) -> int:
    """The K in ``0..k`` with the most tokens per second at ``batch_size``;
    on a tie the smaller K (less work for the same tokens)."""
    by_k = rates(cost, acceptance, batch_size)
    return by_k.index(max(by_k))


def step_toward(cost: Cost, acceptance: Acceptance, batch_size: int, current: int) -> int:
    """``current`` moved one step toward :func:`best_k`, if the fit says that
    step gains more than :data:`MARGIN`. One step at a time: the fit is
    measured around the K that runs (and one off it), so it is trusted there
    and not far away; a noisy fit moves K by one for one window, not to 0."""
    by_k = rates(cost, acceptance, batch_size)
    best = by_k.index(max(by_k))
    step = current + (best > current) - (best < current)
    return step if by_k[step] > by_k[current] * (1 + MARGIN) else current


def schedule_ranges(per_batch_size: list[int]) -> list[list[int]]:
    """``[K for batch size 1, 2, ...]`` as vLLM's
    ``num_speculative_tokens_per_batch_size``: ``[[start, end, K], ...]``."""
    ranges: list[list[int]] = []
    for size, k in enumerate(per_batch_size, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = size
        else:
            ranges.append([size, size, k])
    return ranges
