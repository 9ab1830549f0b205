"""`specray observe`: a vLLM server's speculative-decoding counters, scraped twice from a local HTTP server.

The exposition text is made the way vLLM makes it: vLLM's V1 engine declares its spec-decode counters with
prometheus_client (`vllm/v1/spec_decode/metrics.py`, read at vllm-project/vllm ee4ceaae:
`vllm:spec_decode_num_drafts`, `…_num_draft_tokens`, `…_num_accepted_tokens`,
`…_num_accepted_tokens_per_pos` with the label `position`; every counter labelled `model_name` and
`engine`, each engine's children made at start), and its /metrics endpoint serves prometheus_client's
`generate_latest`. Here the same counters are declared and incremented in a registry of the test's own and
served by a `http.server` on 127.0.0.1, stopped by the fixture that started it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from typer.testing import CliRunner

from specray.cli import app
from specray.errors import DataError
from specray.serving.observe import interval, parse_counters, planned_band, scrape

LABELS = ["model_name", "engine"]


class FakeVllm:
    """Counters as a vLLM V1 server with two engine cores keeps them."""

    def __init__(self, gamma: int = 3) -> None:
        self.registry = CollectorRegistry()
        self.gamma = gamma
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS,
                              registry=self.registry)  # fmt: skip
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS,
                                    registry=self.registry)  # fmt: skip
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", LABELS,
                                registry=self.registry)  # fmt: skip
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                               "Accepted tokens per draft position.", [*LABELS, "position"],
                               registry=self.registry)  # fmt: skip
        prompts = Counter("vllm:prompt_tokens", "Prompt tokens.", LABELS, registry=self.registry)
        prompts.labels("m", "0").inc(7)  # a counter of another kind, left alone
        for engine in ("0", "1"):  # vLLM makes each engine's children at start: zeros before any traffic
            for counter in (self.drafts, self.draft_tokens, self.accepted):
                counter.labels("m", engine)
            for k in range(gamma):
                self.per_pos.labels("m", engine, str(k))

    def steps(self, engine: str, n: int, accepted_at: list[int]) -> None:
        """`n` verification steps of γ drafted tokens; `accepted_at[k]` of them accepted position k + 1."""
        self.drafts.labels("m", engine).inc(n)
        self.draft_tokens.labels("m", engine).inc(n * self.gamma)
        self.accepted.labels("m", engine).inc(sum(accepted_at))
        for k, count in enumerate(accepted_at):
            self.per_pos.labels("m", engine, str(k)).inc(count)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """A /metrics endpoint on 127.0.0.1 answering each GET with the next text of `answers`."""
    answers: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = (answers.pop(0) if answers else "").encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_interval_sums_engines_and_gives_vllms_three_figures(server) -> None:
    url, answers = server
    vllm = FakeVllm(gamma=3)
    vllm.steps("0", 10, [6, 3, 1])  # before the interval: left out
    answers.append(vllm.text())
    vllm.steps("0", 40, [30, 20, 10])
    vllm.steps("1", 60, [40, 25, 15])
    answers.append(vllm.text())
    before, after = parse_counters(scrape(url)), parse_counters(scrape(url + "/metrics"))
    observed = interval(before, after, 60.0)
    assert (observed.drafts, observed.draft_tokens, observed.accepted) == (100, 300, 140)
    assert observed.draft_acceptance == pytest.approx(140 / 300)
    assert observed.mean_acceptance_length == pytest.approx(1 + 140 / 100)
    assert observed.acceptance_per_position == pytest.approx([0.70, 0.45, 0.25])
    # the per-position figures add up to the mean acceptance length's accepted part
    assert sum(observed.acceptance_per_position) == pytest.approx(observed.mean_acceptance_length - 1)


def test_a_counter_that_went_down_is_a_restart_not_a_negative_rate() -> None:
    vllm = FakeVllm()
    vllm.steps("0", 50, [30, 20, 10])
    before = parse_counters(vllm.text())
    restarted = FakeVllm()
    restarted.steps("0", 5, [3, 2, 1])
    with pytest.raises(
        DataError, match=r"^vllm:spec_decode_num_drafts_total went down .*\(50 -> 5\): the server "
    ):
        interval(before, parse_counters(restarted.text()), 60.0)


def test_an_interval_without_speculation_and_a_server_without_it_are_one_line_each() -> None:
    vllm = FakeVllm()
    vllm.steps("0", 5, [3, 2, 1])
    same = parse_counters(vllm.text())
    with pytest.raises(DataError, match="no speculative steps in the 60 s"):
        interval(same, same, 60.0)
    plain = CollectorRegistry()
    Counter("vllm:prompt_tokens", "Prompt tokens.", LABELS, registry=plain).labels("m", "0").inc()
    with pytest.raises(DataError, match="no vllm:spec_decode_num_drafts_total counter; the server is not"):
        parse_counters(generate_latest(plain).decode(), "http://x/metrics")
    with pytest.raises(DataError, match="no answer"):
        scrape("http://127.0.0.1:9/metrics", timeout=2)


def _export(folder: Path) -> Path:
    expected = {
        "draft_acceptance": 0.45,
        "draft_acceptance_ci95": 0.02,
        "mean_acceptance_length": 2.35,
        "mean_acceptance_length_ci95": 0.05,
        "acceptance_per_position": [0.68, 0.44, 0.23],
    }
    speculative = {"alias": "tau-1", "low": 0.8, "high": None, "route": "speculative",
                   "draft_name": "online/tau_kd=1", "gamma": 3, "expected": expected}  # fmt: skip
    candidate = {"draft_name": "offline/tau_kd=0", "gamma": 2, "expected": expected}
    declined = {"alias": "tau-0", "low": 0.0, "high": 0.8, "route": "none", "draft": None, "gamma": None,
                "best_candidate": candidate}  # fmt: skip
    (folder / "routing.json").write_text(json.dumps({"bands": [declined, speculative]}))
    return folder


def test_the_plan_band_is_found_by_alias_or_temperature(tmp_path) -> None:
    export = _export(tmp_path)
    assert planned_band(export, band="tau-1").draft == "online/tau_kd=1"
    declined = planned_band(export, tau=0.3)
    assert (declined.alias, declined.route, declined.draft, declined.gamma) == (
        "tau-0",
        "none",
        "offline/tau_kd=0",
        2,
    )
    assert planned_band(export, tau=1.7).alias == "tau-1"  # the last band is open above


def test_specray_observe_prints_the_server_figures_beside_the_plan(server, tmp_path) -> None:
    url, answers = server
    vllm = FakeVllm(gamma=3)
    answers.append(vllm.text())
    vllm.steps("0", 100, [70, 45, 25])
    answers.append(vllm.text())
    export = _export(tmp_path)
    result = CliRunner().invoke(
        app, ["observe", url, "--seconds", "0.1", "--export", str(export), "--band", "tau-1"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "100 drafts, 300 draft tokens, 140 accepted" in lines[0]
    assert "plan (band tau-1: online/tau_kd=1, γ=3, route speculative)" in lines[1]
    assert lines[2].split() == ["draft", "acceptance", "0.467", "0.450", "±", "0.020"]
    assert lines[3].split() == ["mean", "acceptance", "length", "2.400", "2.350", "±", "0.050"]
    assert lines[4].split() == ["acceptance", "at", "position", "1", "0.700", "0.680"]


def test_a_server_restarted_between_the_scrapes_is_one_line_from_the_cli(server) -> None:
    url, answers = server
    before = FakeVllm()
    before.steps("0", 50, [30, 20, 10])
    after = FakeVllm()
    after.steps("0", 5, [3, 2, 1])
    answers += [before.text(), after.text()]
    result = CliRunner().invoke(app, ["observe", url, "--seconds", "0.1"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1].startswith("error: vllm:spec_decode_num_drafts_total went down")


def test_bad_observe_requests_are_one_line_before_any_scrape(tmp_path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["observe", "localhost:8000"])
    assert bad.exit_code == 2 and "give the server's address, e.g. http://127.0.0.1:8000" in bad.stderr
    no_band = runner.invoke(app, ["observe", "http://127.0.0.1:9", "--export", str(_export(tmp_path))])
    assert no_band.exit_code == 2 and "--export needs --band ALIAS or --tau T" in no_band.stderr
    wrong = runner.invoke(
        app, ["observe", "http://127.0.0.1:9", "--export", str(tmp_path), "--band", "tau-9"]
    )
    assert (
        wrong.exit_code == 2 and "--band 'tau-9': not in" in wrong.stderr and "tau-0, tau-1" in wrong.stderr
    )
