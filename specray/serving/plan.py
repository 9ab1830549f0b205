"""The routing plan: per band of request temperatures, the draft and γ with the best speedup, or none.

Bands (`bands.py`). By default one band per τ_dec the sweep measured; a request at temperature τ goes
to the nearest measured τ_dec, or to the band of given edges that holds it.

Choice, per band. The candidates are every (draft, γ) of the sweep on one test set (in-domain by default).
A candidate's speedup at a τ_dec is *measured* (the empirical cell's wall-time ratio and its 95% interval,
decodes as clusters) when the sweep timed it, else *modelled*: the analytic cell's `speedup_model` at the
batch size (`records.StepCosts.speedup`, from the exact expected tokens and drafts per step and the measured
step costs) and its 95% interval. A band is judged on
measured speedups when the sweep timed some candidate at every τ_dec of the band — then only such
candidates compete — and on modelled ones otherwise; the plan says which. A candidate's speedup for the
band is its smallest over the band's τ_dec (the band's *binding* τ_dec, where its expected metrics are
stated). A candidate beats target-only decoding when the lower end of that speedup's 95% interval exceeds
`min_speedup` (1 by default: the interval must lie wholly above 1); the band takes the candidate with the
highest speedup among those, and "no speculation" when none does (its best candidate is kept, to say why).

Replicates. A sweep or tune that trained a recipe several times (`distill.replicates`, `tune.replicates`:
drafts `<recipe>/r<k>`) has one candidate per replicate and γ, and the best of N noisy draws is an
optimistic figure (the winner's curse): the lucky replicate of a worse recipe would win the band. So the
replicates of a recipe at one γ compete as one candidate: its speedup for the band is the mean over the
replicates of each one's own, and the draft it serves is the replicate whose own speedup is closest to that
mean (`draft.representative`), whose cells, expected metrics and interval the route states — a draft that
performs like the figure that chose it. Whether it beats target-only decoding is judged on that replicate's
own interval.

Batch sizes. Each temperature band is routed again per band of request batch sizes: one per batch size B
the sweep modelled (`eval.batch_sizes`, the keys of the analytic cells' `speedup_model_by_batch`), [B_i,
B_i+1) with the first starting at 1 and the last open above, so a batch of b rows goes to the largest
modelled B ≤ b. A server loads one draft per deployment, so a temperature band keeps the draft chosen at
the smallest B; at a larger B it takes that draft's best γ (γ = 0, no speculation, when none of its γ has a
lower 95% bound above `min_speedup`), even where another draft would be faster there (the reason says so).
A band with no speculation at the smallest B has none at any B.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from specray.draft import representative, split_replicate
from specray.errors import SpecError
from specray.metrics import ROUTE_EXPECTED
from specray.serving.bands import Band, BatchBand, batch_bands, given_bands, grid_bands
from specray.specdec.records import CellRecord

Basis = Literal["measured", "modelled"]


@dataclass(frozen=True)
class Speedup:
    value: float
    ci95: float  # half-width (nan when unknown)
    basis: Basis
    tau_dec: float  # where it was measured or modelled

    @property
    def low(self) -> float:
        return self.value - self.ci95 if math.isfinite(self.ci95) else math.nan


@dataclass(frozen=True)
class Candidate:
    """A (draft, γ) and its speedup for a band: the smallest over the band's τ_dec."""

    draft: str
    draft_key: str
    gamma: int
    speedup: Speedup
    cells: dict[str, str] = field(default_factory=dict)  # estimator -> cell key at the binding τ_dec
    expected: dict[str, Any] = field(default_factory=dict)
    replicates: int = 1  # training replicates of the draft's recipe that compete as this one candidate
    mean: float | None = None  # their mean speedup for the band (None: one replicate, `speedup` itself)

    @property
    def recipe_speedup(self) -> float:
        """What the candidate is ranked by: its recipe's mean over replicates."""
        return self.speedup.value if self.mean is None else self.mean


@dataclass(frozen=True)
class Route:
    """One band's decision: `choice` None means no speculation (`best` then says what came closest)."""

    band: Band
    basis: Basis
    choice: Candidate | None
    best: Candidate | None
    min_speedup: float

    @property
    def reason(self) -> str:
        if self.choice is not None:
            s, n, mean = self.choice.speedup, self.choice.replicates, self.choice.recipe_speedup
            bound = f"lower end {s.low:.3f} > {self.min_speedup:g}"
            note = f" (the replicate closest to its recipe's mean {mean:.3f} over {n})" if n > 1 else ""
            return f"{s.basis} speedup {s.value:.3f} ± {s.ci95:.3f}{note}: {bound}"
        if self.best is None:
            return "no candidate cells for this band"
        s = self.best.speedup
        return (
            f"no speculation: the best candidate ({self.best.draft}, γ={self.best.gamma}) has {s.basis} "
            f"speedup {s.value:.3f} ± {s.ci95:.3f}, lower end {s.low:.3f} ≤ {self.min_speedup:g}"
        )


class CellIndex:
    """One test set's cells by (draft key, γ, τ_dec, estimator)."""

    def __init__(self, cells: Iterable[CellRecord], test_set: str):
        self.cells: dict[tuple[str, int, float, str, int], CellRecord] = {
            (c.draft_key, c.gamma, float(c.tau_dec), c.estimator, c.batch_size): c
            for c in cells
            if c.test_set == test_set
        }
        if not self.cells:
            raise SpecError(f"the sweep has no cells on test set {test_set!r}")
        self.names = {c.draft_key: c.draft for c in self.cells.values()}

    def pairs(self) -> list[tuple[str, int]]:
        return sorted({(key, gamma) for key, gamma, *_ in self.cells})

    def get(self, key: str, gamma: int, tau: float, estimator: str, batch_size: int = 1) -> CellRecord | None:
        return self.cells.get((key, gamma, float(tau), estimator, batch_size))


def speedup_at(
    index: CellIndex, key: str, gamma: int, tau: float, basis: Basis, batch_size: int = 1
) -> Speedup | None:
    """The candidate's speedup at one τ_dec on one basis, with its 95% half-width (None: no such cell)."""
    if basis == "measured":
        cell = index.get(key, gamma, tau, "empirical", batch_size)
        if cell is None:
            return None
        measured = cell.empirical()
        return Speedup(measured.speedup, measured.speedup_ci95, basis, tau)
    cell = index.get(key, gamma, tau, "analytic")
    if cell is None:
        return None
    modelled = cell.analytic()
    by_batch = modelled.speedup_model_by_batch
    if not by_batch:
        raise SpecError(
            f"cell {cell.key} ({cell.draft}, τ_dec={tau:g}, γ={gamma}) has no speedup_model_by_batch: it "
            "was recorded by an older specray; run the sweep again (`specray run`) to recompute its cells"
        )
    if str(batch_size) not in by_batch:
        raise SpecError(f"the sweep modelled batch sizes {sorted(map(int, by_batch))}, not {batch_size}")
    ci = modelled.speedup_model_by_batch_ci95.get(str(batch_size), math.nan)
    return Speedup(by_batch[str(batch_size)], ci, basis, tau)


def _candidate(
    index: CellIndex, key: str, gamma: int, band: Band, basis: Basis, batch_size: int = 1
) -> Candidate | None:
    speeds = [speedup_at(index, key, gamma, tau, basis, batch_size) for tau in band.tau_decs]
    present = [s for s in speeds if s is not None]
    if len(present) < len(speeds):
        return None
    binding = min(present, key=lambda s: s.value)
    cells = {
        estimator: cell.key
        for estimator in ("analytic", "empirical")
        if (cell := index.get(key, gamma, binding.tau_dec, estimator)) is not None
    }
    source = index.get(key, gamma, binding.tau_dec, "analytic") or index.get(
        key, gamma, binding.tau_dec, "empirical"
    )
    assert source is not None
    expected = {name: source.metrics[name] for name in ROUTE_EXPECTED if name in source.metrics}
    expected["estimator"] = source.estimator
    return Candidate(index.names[key], key, gamma, binding, cells, expected)


def route_band(
    index: CellIndex,
    band: Band,
    min_speedup: float = 1.0,
    batch_size: int = 1,
    draft_key: str | None = None,
) -> Route:
    """The band's decision at one batch size (module docstring); `draft_key`: among that draft's γ only."""
    timed = all(
        any(k[2] == tau and k[3] == "empirical" and k[4] == batch_size for k in index.cells)
        for tau in band.tau_decs
    )
    basis: Basis = "measured" if timed else "modelled"
    candidates = [
        c
        for key, gamma in index.pairs()
        if draft_key in (None, key) and (c := _candidate(index, key, gamma, band, basis, batch_size))
    ]
    ranked = sorted(by_recipe(candidates), key=lambda c: (-c.recipe_speedup, c.gamma, c.draft))
    winners = [c for c in ranked if c.speedup.low > min_speedup]
    return Route(band, basis, winners[0] if winners else None, ranked[0] if ranked else None, min_speedup)


def by_recipe(candidates: Iterable[Candidate]) -> list[Candidate]:
    """One candidate per (recipe, γ): a recipe's replicates as its representative (module docstring)."""
    groups: dict[tuple[str, int], list[Candidate]] = {}
    for candidate in sorted(candidates, key=lambda c: split_replicate(c.draft)[1]):
        groups.setdefault((split_replicate(candidate.draft)[0], candidate.gamma), []).append(candidate)
    chosen = []
    for group in groups.values():
        if len(group) == 1:
            chosen.append(group[0])
            continue
        speedups = {c.draft: c.speedup.value for c in group}
        mean = sum(speedups.values()) / len(group)
        served = next(c for c in group if c.draft == representative(speedups))
        chosen.append(replace(served, replicates=len(group), mean=mean))
    return chosen


def modelled_batch_sizes(index: CellIndex) -> list[int]:
    """The B every analytic cell modelled (`speedup_model_by_batch`); without analytic cells, the B the
    empirical cells decoded at."""
    modelled = [
        set(map(int, cell.analytic().speedup_model_by_batch))
        for cell in index.cells.values()
        if cell.estimator == "analytic"
    ]
    if modelled:
        common = set.intersection(*modelled)
        return sorted(common) if common else [1]  # an older cell: speedup_at names the problem
    return sorted({cell.batch_size for cell in index.cells.values()})


@dataclass(frozen=True)
class BatchRoute:
    """One batch band of a temperature band: its route (the draft held to the temperature band's) and, where
    holding the draft changed the answer, why."""

    batch: BatchBand
    route: Route
    note: str = ""

    @property
    def gamma(self) -> int:
        """γ, 0 for no speculation."""
        return self.route.choice.gamma if self.route.choice else 0

    @property
    def reason(self) -> str:
        return self.note or self.route.reason


@dataclass(frozen=True)
class BandPlan:
    """A temperature band's route per batch band (ascending); the first is the band's own (smallest B)."""

    band: Band
    batches: tuple[BatchRoute, ...]

    @property
    def route(self) -> Route:
        return self.batches[0].route


def _speed(candidate: Candidate) -> str:
    s = candidate.speedup
    return f"({candidate.draft}, γ={candidate.gamma}) with {s.basis} speedup {s.value:.3f} ± {s.ci95:.3f}"


def plan_band(index: CellIndex, band: Band, batches: Sequence[BatchBand], min_speedup: float) -> BandPlan:
    """The band's route per batch band, the draft held to the one chosen at the smallest B."""
    b0 = batches[0].batch_size
    first = route_band(index, band, min_speedup, b0)
    held = first.choice
    routes = [BatchRoute(batches[0], first)]
    for batch in batches[1:]:
        free = route_band(index, band, min_speedup, batch.batch_size)
        if free.choice is None or (held is not None and free.choice.draft_key == held.draft_key):
            routes.append(BatchRoute(batch, free))
            continue
        faster = f"over every draft the best at B={batch.batch_size} is {_speed(free.choice)}"
        if held is None:
            note = (
                f"no speculation: the band's draft is chosen at B={b0}, where none cleared {min_speedup:g} "
                f"(one draft per deployment); {faster}"
            )
            routes.append(BatchRoute(batch, Route(band, free.basis, None, None, min_speedup), note))
            continue
        own = route_band(index, band, min_speedup, batch.batch_size, held.draft_key)
        note = f"{own.reason}; one draft per deployment ({held.draft}, chosen at B={b0}): {faster}"
        routes.append(BatchRoute(batch, own, note))
    return BandPlan(band, tuple(routes))


def plan_batched(
    cells: Iterable[CellRecord],
    test_set: str = "in_domain",
    edges: Sequence[float] | None = None,
    min_speedup: float = 1.0,
) -> list[BandPlan]:
    """Every temperature band's routes per batch band (module docstring), from the sweep's current cells."""
    index = CellIndex(cells, test_set)
    taus = {tau for _, _, tau, *_ in index.cells}
    bands = grid_bands(taus) if edges is None else given_bands(edges, taus)
    batches = batch_bands(modelled_batch_sizes(index))
    return [plan_band(index, band, batches, min_speedup) for band in bands]
