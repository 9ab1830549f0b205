"""Route a request by its temperature and batch size: the draft folder and γ of its band in an export's
routing.json.

    router = Router.from_file("export/routing.json")
    router.route(0.8)      # -> Route(draft_dir=Path(".../drafts/online__tau_kd=0.8"), gamma=4)
    router.route(0.8, 16)  # -> Route(draft_dir=Path(".../drafts/online__tau_kd=0.8"), gamma=2)
    router.route(1.7)      # -> Route(draft_dir=None, gamma=None): no speculation, the target decodes alone

Temperature bands are [low, high) and cover every temperature from 0 up (serving/bands.py), so a temperature
on an edge belongs to the band above it. Within a band, batch-size bands are [low, high) too: a batch size on
an edge belongs to the band above, one below the first edge to the first band, and the last band is open
above. A routing.json without per-batch entries (format 1) routes every batch size as its band's own.
Within a temperature band every batch band speculates with the same draft (one per deployment) or not at all.
"""

from __future__ import annotations

import bisect
import json
import math
import operator
from pathlib import Path
from typing import Any, NamedTuple


class Route(NamedTuple):
    draft_dir: Path | None  # None: no speculation
    gamma: int | None


class BatchRoutes(NamedTuple):
    """One temperature band's batch-size bands: their lower edges (ascending) and each one's route."""

    lows: list[int]
    routes: list[Route]


class Router:
    """Bands (their lower edges, ascending) and each one's route, or its routes per batch-size band."""

    def __init__(
        self,
        lows: list[float],
        routes: list[Route],
        aliases: list[str],
        batches: list[BatchRoutes] | None = None,
    ):
        if not lows or lows[0] != 0 or any(b <= a for a, b in zip(lows, lows[1:], strict=False)):
            raise ValueError(f"band edges must start at 0 and increase, got {lows}")
        batches = batches or [BatchRoutes([1], [route]) for route in routes]
        if len(batches) != len(lows):
            raise ValueError(f"{len(lows)} temperature bands but {len(batches)} lists of batch bands")
        for batch in batches:
            edges = batch.lows
            rising = all(a < b for a, b in zip(edges, edges[1:], strict=False))
            if not edges or len(edges) != len(batch.routes) or not rising:
                raise ValueError(f"batch-size band edges must increase, one route each, got {edges}")
        self.lows, self.routes, self.aliases, self.batches = lows, routes, aliases, batches

    @classmethod
    def from_file(cls, path: str | Path) -> Router:
        """The router of an export folder's routing.json (draft folders resolved beside it)."""
        path = Path(path)
        plan = json.loads(path.read_text())
        bands = sorted(plan["bands"], key=lambda band: band["low"])
        routes = [_route(path.parent, band) for band in bands]
        batches = [
            BatchRoutes(
                [int(entry["low"]) for entry in band["batch_sizes"]],
                [_route(path.parent, entry) for entry in band["batch_sizes"]],
            )
            if band.get("batch_sizes")
            else BatchRoutes([1], [route])
            for band, route in zip(bands, routes, strict=True)
        ]
        lows = [float(band["low"]) for band in bands]
        return cls(lows, routes, [band["alias"] for band in bands], batches)

    def band(self, temperature: float) -> int:
        """Index of the band holding `temperature`."""
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        return bisect.bisect_right(self.lows, temperature) - 1

    def batch_band(self, band: int, batch_size: int) -> int:
        """Index of the batch-size band of temperature band `band` holding `batch_size` (below the first
        edge: the first)."""
        if isinstance(batch_size, bool) or not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
        return max(bisect.bisect_right(self.batches[band].lows, batch_size) - 1, 0)

    def route(self, temperature: float, batch_size: int = 1) -> Route:
        """(draft_dir, gamma) for a request at `temperature` decoded in a batch of `batch_size` rows;
        (None, None) means target-only decoding."""
        band = self.band(temperature)
        return self.batches[band].routes[self.batch_band(band, batch_size)]


def _route(folder: Path, entry: dict[str, Any]) -> Route:
    """A band's or a batch band's route (γ 0 or route "none": no speculation)."""
    if entry["route"] != "speculative" or not entry.get("gamma"):
        return Route(None, None)
    return Route(folder / entry["draft"], int(entry["gamma"]))


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)  # int and numpy integers; not floats
    except TypeError:
        return False
    return True
