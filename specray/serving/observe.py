"""Acceptance read back from a vLLM server: two scrapes of its Prometheus endpoint, the counters' increase
between them, and the figures a routing plan predicted for the band the traffic was sent in.

vLLM's V1 engine counts speculative decoding in four counters (`vllm/v1/spec_decode/metrics.py`), each
labelled by `model_name` and `engine` (one per engine core of a data-parallel server):

    vllm:spec_decode_num_drafts_total                     verification steps that carried a draft
    vllm:spec_decode_num_draft_tokens_total               tokens drafted
    vllm:spec_decode_num_accepted_tokens_total            drafted tokens the target accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total    the same, by draft position (label `position`)

Over an interval, summed over the label sets: draft acceptance = accepted / drafted tokens; mean acceptance
length = 1 + accepted / drafts (the bonus token counted, as vLLM logs it); acceptance at position k =
accepted at k / drafts. The plan's cells report the same three figures in the same counting
(`expected.draft_acceptance`, `mean_acceptance_length`, `acceptance_per_position` in routing.json).
A counter is cumulative from the server's start, so one that went down between the scrapes means the
server restarted: that interval is refused, not turned into a negative rate.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specray.errors import DataError, SpecError

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True)
class Counters:
    """The speculative-decoding counters of one scrape, summed over engines and models."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    """What the server did between two scrapes."""

    seconds: float
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: Mapping[int, float]

    @property
    def draft_acceptance(self) -> float:
        return self.accepted / self.draft_tokens

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts

    @property
    def acceptance_per_position(self) -> list[float]:
        return [self.per_position[k] / self.drafts for k in sorted(self.per_position)]


def metrics_url(url: str) -> str:
    """The server's address or its /metrics URL -> the /metrics URL."""
    if not url.startswith(("http://", "https://")):
        raise SpecError(f"URL {url!r}: give the server's address, e.g. http://127.0.0.1:8000")
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def scrape(url: str, timeout: float = 10.0) -> str:
    """The exposition text at `url` (its /metrics)."""
    try:
        with urllib.request.urlopen(metrics_url(url), timeout=timeout) as answer:  # noqa: S310 (http(s) only)
            return answer.read().decode()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DataError(f"{metrics_url(url)}: no answer ({reason}); is the vLLM server running?") from None


def parse_counters(text: str, source: str = "the metrics") -> Counters:
    """The four counters from exposition text (prometheus_client's parser), summed over their label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    per_position: dict[int, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        raise DataError(f"{source}: not Prometheus exposition text ({error})") from None
    for family in families:
        if family.name not in (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):  # `_created` timestamps ride along with a counter
                continue
            if family.name == PER_POSITION:
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
            else:
                sums[family.name] = sums.get(family.name, 0.0) + sample.value
    missing = [name for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED) if name not in sums]
    if missing:
        raise DataError(
            f"{source}: no {missing[0]}_total counter; the server is not a vLLM V1 server with speculative "
            "decoding on (--speculative-config)"
        )
    return Counters(sums[DRAFTS], sums[DRAFT_TOKENS], sums[ACCEPTED], per_position)


def interval(before: Counters, after: Counters, seconds: float) -> Observed:
    """The counters' increase between two scrapes; a decrease (the server restarted) is refused."""
    pairs = {
        f"{DRAFTS}_total": (before.drafts, after.drafts),
        f"{DRAFT_TOKENS}_total": (before.draft_tokens, after.draft_tokens),
        f"{ACCEPTED}_total": (before.accepted, after.accepted),
    }
    positions = _positions(before, after)
    pairs |= {f"{PER_POSITION}_total{{position={k}}}": pair for k, pair in positions.items()}
    for name, (old, new) in pairs.items():
        if new < old:
            raise DataError(
                f"{name} went down between the scrapes ({old:g} -> {new:g}): the server restarted; observe "
                "again over an interval without a restart"
            )
    if after.drafts == before.drafts or after.draft_tokens == before.draft_tokens:
        raise DataError(
            f"no speculative steps in the {seconds:g} s between the scrapes: send traffic to the server "
            "while observing, or observe for longer (--seconds)"
        )
    return Observed(
        seconds=seconds,
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted=after.accepted - before.accepted,
        per_position={k: new - old for k, (old, new) in positions.items()},
    )


def _positions(before: Counters, after: Counters) -> dict[int, tuple[float, float]]:
    keys = sorted(set(before.per_position) | set(after.per_position))
    return {k: (before.per_position.get(k, 0.0), after.per_position.get(k, 0.0)) for k in keys}


@dataclass(frozen=True)
class PlannedBand:
    """What an export's routing plan predicted for one band of request temperatures."""

    alias: str
    route: str
    draft: str
    gamma: int
    expected: Mapping[str, Any]


def planned_band(export: Path, band: str | None = None, tau: float | None = None) -> PlannedBand:
    """The band of an export's routing.json named by its alias, or the one holding `tau`."""
    from specray.serving.export import ROUTING_FILE

    path = export / ROUTING_FILE
    if not path.is_file():
        raise SpecError(f"--export {export}: no {ROUTING_FILE}; give the folder `specray export --to` wrote")
    bands = json.loads(path.read_text())["bands"]
    if band is not None:
        chosen = [b for b in bands if b["alias"] == band]
        if not chosen:
            raise SpecError(
                f"--band {band!r}: not in {path}; its bands: {', '.join(b['alias'] for b in bands)}"
            )
    elif tau is not None:
        chosen = [b for b in bands if b["low"] <= tau and (b["high"] is None or tau < b["high"])]
        if not chosen:
            raise SpecError(f"--tau {tau:g}: no band of {path} holds it")
    else:
        raise SpecError("--export needs --band ALIAS or --tau T: which band the traffic was sent in")
    found = chosen[0]
    expected = found.get("expected") or (found.get("best_candidate") or {}).get("expected")
    if not expected:
        raise SpecError(f"band {found['alias']} of {path} predicts no acceptance (no candidate draft)")
    draft = found.get("draft_name") or (found.get("best_candidate") or {}).get("draft_name", "")
    gamma = found.get("gamma") or (found.get("best_candidate") or {}).get("gamma", 0)
    return PlannedBand(found["alias"], found["route"], draft, int(gamma), expected)
