"""The bands a routing plan routes by: of request temperatures, and of request batch sizes.

Temperature bands. By default one band per τ_dec the sweep measured, bounded by the midpoints between
neighbours: a request at temperature τ goes to the nearest measured τ_dec (the first band starts at 0, the
last has no upper edge; a band is [low, high), so a temperature on an edge belongs to the band above it).
Given edges `0, e1, e2, …` make the bands [0, e1), [e1, e2), …, [e_last, ∞); each must contain at least one
measured τ_dec, and every measured τ_dec inside a band represents it (`plan.py`: a candidate's speedup for
the band is its smallest over them).

Batch bands: one per batch size B the sweep modelled, [B_i, B_i+1), the first starting at 1 and the last
open above, so a batch of b rows goes to the largest modelled B ≤ b. What is chosen per band is the plan's
(`plan.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specray.errors import SpecError


@dataclass(frozen=True)
class Band:
    """Request temperatures in [low, high) (high None: no upper edge), represented by the sweep's τ_dec
    measurements inside it."""

    low: float
    high: float | None
    tau_decs: tuple[float, ...]

    def contains(self, temperature: float) -> bool:
        return self.low <= temperature and (self.high is None or temperature < self.high)

    @property
    def label(self) -> str:
        return f"[{self.low:g}, {'∞' if self.high is None else f'{self.high:g}'})"

    @property
    def alias(self) -> str:
        """A name for files and MLflow aliases (letters, digits, `_`, `-` only): `tau-0_8` for the band of
        τ_dec 0.8, `tau-0_7-1_2` for a given band [0.7, 1.2)."""
        if len(self.tau_decs) == 1:
            return "tau-" + _name(self.tau_decs[0])
        return f"tau-{_name(self.low)}-{'inf' if self.high is None else _name(self.high)}"


def _name(value: float) -> str:
    return f"{value:g}".replace(".", "_").replace("-", "m")


def grid_bands(tau_decs: Iterable[float]) -> list[Band]:
    """One band per measured τ_dec, edges at the midpoints between neighbours, from 0 up."""
    taus = sorted(set(float(t) for t in tau_decs))
    if not taus:
        raise SpecError("the sweep has no τ_dec to route by")
    mids = [(a + b) / 2 for a, b in zip(taus, taus[1:], strict=False)]
    highs: list[float | None] = [*mids, None]
    return [Band(low, high, (tau,)) for low, high, tau in zip([0.0, *mids], highs, taus, strict=True)]


def given_bands(edges: Sequence[float], tau_decs: Iterable[float]) -> list[Band]:
    """Bands from edges `0, e1, …` (the last band has no upper edge); each must hold a measured τ_dec."""
    taus = sorted(set(float(t) for t in tau_decs))
    if not edges or edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise SpecError(f"--bands: edges must start at 0 and increase, got {list(edges)}")
    uppers: list[float | None] = [*edges[1:], None]
    bands = []
    for low, high in zip(edges, uppers, strict=True):
        inside = tuple(t for t in taus if low <= t and (high is None or t < high))
        band = Band(float(low), None if high is None else float(high), inside)
        if not inside:
            raise SpecError(f"--bands: band {band.label} holds none of the measured τ_dec {taus}")
        bands.append(band)
    return bands


def parse_edges(text: str) -> list[float]:
    """`0,0.3,0.7` -> [0.0, 0.3, 0.7]; a SpecError naming the bad part."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SpecError(
            f"--bands: expected comma-separated temperatures such as 0,0.3,0.7, got {text!r}"
        ) from None


@dataclass(frozen=True)
class BatchBand:
    """Request batch sizes in [low, high) (high None: no upper edge), routed as the modelled `batch_size`."""

    low: int
    high: int | None
    batch_size: int

    def contains(self, batch_size: int) -> bool:
        return self.low <= batch_size and (self.high is None or batch_size < self.high)

    @property
    def label(self) -> str:
        return f"[{self.low}, {'∞' if self.high is None else self.high})"


def batch_bands(batch_sizes: Iterable[int]) -> list[BatchBand]:
    """One band per modelled B, from B up to the next (the first from 1, the last open above)."""
    sizes = sorted(set(int(b) for b in batch_sizes))
    if not sizes or sizes[0] < 1:
        raise SpecError(f"batch sizes must be integers >= 1, got {sizes}")
    highs: list[int | None] = [*sizes[1:], None]
    return [BatchBand(low, high, b) for low, high, b in zip([1, *sizes[1:]], highs, sizes, strict=True)]
