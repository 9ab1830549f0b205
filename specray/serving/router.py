"""Route a request by its temperature: the draft folder and γ of its band in an export's routing.json.

    router = Router.from_file("export/routing.json")
    router.route(0.8)   # -> Route(draft_dir=Path(".../drafts/online__tau_kd=0.8"), gamma=4)
    router.route(1.7)   # -> Route(draft_dir=None, gamma=None): no speculation, decode with the target alone

Bands are [low, high) and cover every temperature from 0 up (serving/plan.py), so a temperature on an edge
belongs to the band above it.
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import NamedTuple


class Route(NamedTuple):
    draft_dir: Path | None  # None: no speculation
    gamma: int | None


class Router:
    """Bands (their lower edges, ascending) and each one's route."""

    def __init__(self, lows: list[float], routes: list[Route], aliases: list[str]):
        if not lows or lows[0] != 0 or any(b <= a for a, b in zip(lows, lows[1:], strict=False)):
            raise ValueError(f"band edges must start at 0 and increase, got {lows}")
        self.lows, self.routes, self.aliases = lows, routes, aliases

    @classmethod
    def from_file(cls, path: str | Path) -> Router:
        """The router of an export folder's routing.json (draft folders resolved beside it)."""
        path = Path(path)
        plan = json.loads(path.read_text())
        bands = sorted(plan["bands"], key=lambda band: band["low"])
        routes = [
            Route(path.parent / band["draft"], int(band["gamma"]))
            if band["route"] == "speculative"
            else Route(None, None)
            for band in bands
        ]
        return cls([float(band["low"]) for band in bands], routes, [band["alias"] for band in bands])

    def band(self, temperature: float) -> int:
        """Index of the band holding `temperature`."""
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        return bisect.bisect_right(self.lows, temperature) - 1

    def route(self, temperature: float) -> Route:
        """(draft_dir, gamma) for a request at `temperature`; (None, None) means target-only decoding."""
        return self.routes[self.band(temperature)]
