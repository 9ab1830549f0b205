"""Every way a tracking server can go away ends with one friendly line naming the server and the cause.

Each case is a real socket on 127.0.0.1 that fails the way a dying or missing server does (no mock of
MLflow or requests): the client's own stack (MLflow -> requests -> urllib3 -> socket) raises what it raises
in the field.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import typer

from specray.cli import resumable
from specray.errors import SpecError, TrackingError
from specray.tracking.client import Tracker
from specray.tracking.errors import probe_server
from tests.servers import QUIET

# answering servers get a generous timeout (a loaded machine must not turn "reset" into "timed out"); only
# the server that never answers gets a short one, and it times out whatever the load
ANSWER_TIMEOUT_S, SILENT_TIMEOUT_S = 60, 1
NO_SUCH_HOST = "http://specray-no-such-host.invalid:5000"  # .invalid never resolves (RFC 6761)


@pytest.fixture(autouse=True)
def _one_quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow retries each failed request once, at once: the failure is the one left after its retries."""
    env = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(ANSWER_TIMEOUT_S),
        **QUIET,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


class _Handler(BaseHTTPRequestHandler):
    """Reads the whole request (so the kernel has nothing unread to answer with), then `server.fail`s."""

    def do_GET(self) -> None:
        self.server.fail(self)  # type: ignore[attr-defined]

    do_POST = do_GET

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


def _reset(handler: BaseHTTPRequestHandler) -> None:
    # SO_LINGER 0: close() sends RST instead of FIN, as a killed server's kernel does with a request in flight
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()


def _close(handler: BaseHTTPRequestHandler) -> None:
    handler.close_connection = True  # FIN without a byte of answer


def _cut_short(handler: BaseHTTPRequestHandler) -> None:
    # the headers and part of the body, then FIN: a server killed while writing its answer
    body = json.dumps({"experiment": {"experiment_id": "0", "name": "smoke"}}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body[: len(body) // 2])
    handler.close_connection = True


def _unavailable(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(503)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


@contextmanager
def _http_server(fail) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.fail = fail  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _bound_not_listening() -> Iterator[str]:
    """A port that is ours (nobody else can take it) where nothing listens: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def _silent() -> Iterator[str]:
    """Listens but never accepts: the kernel completes the handshake, and no answer ever comes."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def _no_such_host() -> Iterator[str]:
    yield NO_SUCH_HOST


CASES = {
    "refused": (_bound_not_listening, "connection refused"),
    "reset": (lambda: _http_server(_reset), "connection reset"),
    "closed": (lambda: _http_server(_close), "connection closed"),
    "cut-short": (lambda: _http_server(_cut_short), "answer cut short"),
    "unavailable": (lambda: _http_server(_unavailable), "HTTP 503"),
    "silent": (_silent, "timed out"),
    "no-such-host": (_no_such_host, "host name not found"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_server_going_away_is_one_line_naming_it_and_the_cause(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve, reason = CASES[case]
    if case == "silent":
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", str(SILENT_TIMEOUT_S))
    with serve() as uri, pytest.raises(TrackingError) as raised:
        Tracker(uri, "smoke")
    assert str(raised.value) == f"MLflow at {uri} stopped answering ({reason})"


def test_the_user_sees_the_line_and_the_resume_command_and_the_raw_error_only_in_the_debug_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="specray")
    with _http_server(_reset) as uri, pytest.raises(typer.Exit) as ended, resumable(tmp_path):
        Tracker(uri, "smoke")
    assert ended.value.exit_code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"error: MLflow at {uri} stopped answering (connection reset)"
    assert lines[1].startswith(f"Finished work is kept under {tmp_path}") and "resume with:" in lines[1]
    assert len(lines) == 3 and "Connection reset by peer" not in "\n".join(lines)
    assert "Connection reset by peer" in caplog.text  # the raw exception, for --verbose


@pytest.mark.parametrize("case", [case for case in CASES if case != "unavailable"])  # a 503 is an answer
def test_the_start_probe_names_the_cause_the_same_way(case: str) -> None:
    serve, reason = CASES[case]
    timeout_s = SILENT_TIMEOUT_S if case == "silent" else ANSWER_TIMEOUT_S
    with serve() as uri, pytest.raises(SpecError) as raised:
        probe_server(uri, timeout_s=timeout_s)
    assert str(raised.value).startswith(
        f"tracking.uri: no MLflow server answers at {uri} ({reason}); start it"
    )


class _RunWithFailingDownloads(_Handler):
    """Answers the experiment and run lookups and the artifact listing like an MLflow server, and resets
    every file download."""

    ANSWERS = {
        "/api/2.0/mlflow/experiments/get-by-name": {
            "experiment": {
                "experiment_id": "0",
                "name": "smoke",
                "tags": [{"key": "mlflow.experimentKind", "value": "custom_model_development"}],
            }
        },
        "/api/2.0/mlflow/runs/get": {
            "run": {"info": {"run_id": "r1", "artifact_uri": "mlflow-artifacts:/0/r1/artifacts"}, "data": {}}
        },
        "/api/2.0/mlflow-artifacts/artifacts": {"files": [{"path": "cells.json", "is_dir": False}]},
    }

    def do_GET(self) -> None:
        answer = self.ANSWERS.get(self.path.split("?")[0])
        if answer is None:  # a file download
            _reset(self)
            return
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_reset_that_mlflow_reports_only_as_text_is_recognised(tmp_path: Path) -> None:
    """MLflow gathers failed artifact downloads into one message; the exceptions themselves are lost."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RunWithFailingDownloads)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        tracker = Tracker(uri, "smoke")
        with pytest.raises(TrackingError) as raised:
            tracker.download("r1", "", tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert str(raised.value) == f"MLflow at {uri} stopped answering (connection reset)"
