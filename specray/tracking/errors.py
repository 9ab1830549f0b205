"""A failed MLflow call, or a server that is not there, as one line naming the server and the cause.

The cause is read from the exception types in the chain MLflow raises (MLflow wraps requests, which wraps
urllib3, which wraps the socket's error), from the text only where MLflow kept nothing else.
"""

from __future__ import annotations

import http.client
import logging
import re
import socket

import requests
import urllib3.exceptions
from mlflow.exceptions import MlflowException

from specray.errors import SpecError, TrackingError, find_cause

log = logging.getLogger(__name__)


def probe_server(uri: str, timeout_s: float = 10.0) -> None:
    """One quick request to an MLflow server before any work starts. MLflow's own client retries a refused
    connection for minutes (MLFLOW_HTTP_REQUEST_MAX_RETRIES, which rides out a short outage mid-run);
    at start a server that is not there should be reported at once."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s)  # any answer means a server is there
    except requests.RequestException as e:
        log.debug("MLflow server probe at %s failed", uri, exc_info=True)
        reason = connection_failure(e) or type(e).__name__
        raise SpecError(
            f"tracking.uri: no MLflow server answers at {uri} ({reason}); "
            "start it (e.g. `mlflow server --host 127.0.0.1 --port PORT`) or use tracking.uri=sqlite:///mlflow.db"
        ) from None


def tracking_error(uri: str, error: Exception) -> TrackingError:
    """One line for the user naming the server and what went wrong; the raw error stays in the debug log."""
    reason = connection_failure(error)
    if reason:
        return TrackingError(f"MLflow at {uri} stopped answering ({reason})")
    if isinstance(error, MlflowException):  # the server answered, and refused the call
        return TrackingError(f"MLflow at {uri}: {error.message.splitlines()[0]}")
    return TrackingError(f"MLflow at {uri} is unreachable ({error})")


_HTTP_ERRORS = "HTTP error responses"
_TOO_MANY_STATUS = re.compile(r"too many (\d{3}) error responses")  # urllib3's ResponseError keeps only this
# (exception types in the cause chain, few words), most telling first. A dying server shows as any of the
# connection errors: refused once it is gone, reset or closed with a request in flight, a broken pipe
# mid-upload, an answer cut short when it dies while writing one. urllib3's NewConnectionError is one of
# its TimeoutErrors, so timeouts are the socket's own.
_FAILURE_TYPES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((socket.gaierror,), "host name not found"),
    ((TimeoutError, requests.Timeout, urllib3.exceptions.ReadTimeoutError), "timed out"),
    ((ConnectionRefusedError,), "connection refused"),
    ((http.client.RemoteDisconnected,), "connection closed"),  # a ConnectionResetError: test it first
    ((ConnectionResetError,), "connection reset"),
    ((ConnectionAbortedError, BrokenPipeError), "connection aborted"),
    # the server went away between the answer's headers and the end of its body
    ((http.client.IncompleteRead, urllib3.exceptions.IncompleteRead), "answer cut short"),
    ((requests.exceptions.RetryError, urllib3.exceptions.ResponseError), _HTTP_ERRORS),
    ((requests.ConnectionError, urllib3.exceptions.ProtocolError), "connection failed"),
)
# the same causes as urllib3 and the socket word them, for the one place MLflow keeps only the text: failed
# artifact downloads, gathered into one message
_FAILURE_TEXTS = (
    (
        re.compile(r"Failed to resolve|Name or service not known|Temporary failure in name resolution"),
        "host name not found",
    ),
    (re.compile(r"Read timed out|connect timeout="), "timed out"),
    (re.compile(r"Connection refused"), "connection refused"),
    (re.compile(r"RemoteDisconnected|Remote end closed connection"), "connection closed"),
    (re.compile(r"Connection reset by peer"), "connection reset"),
    (re.compile(r"Broken pipe|ConnectionAbortedError"), "connection aborted"),
    (re.compile(r"IncompleteRead"), "answer cut short"),
    (_TOO_MANY_STATUS, _HTTP_ERRORS),
)


def connection_failure(error: BaseException) -> str | None:
    """Why a tracking server did not answer, in a few words (`connection reset`, `HTTP 503`), or None when
    it did answer. Read from the exception types in the cause chain (MLflow wraps requests, which wraps
    urllib3, which wraps the socket's error); from the text only where MLflow kept nothing else."""
    for types, words in _FAILURE_TYPES:
        cause = find_cause(error, types)
        if cause is not None:
            return _with_status(words, str(cause))
    text = str(error)
    return next(
        (_with_status(words, text) for pattern, words in _FAILURE_TEXTS if pattern.search(text)), None
    )


def _with_status(words: str, text: str) -> str:
    """`HTTP error responses` -> `HTTP 503` when urllib3's message names the status."""
    status = _TOO_MANY_STATUS.search(text) if words == _HTTP_ERRORS else None
    return f"HTTP {status.group(1)}" if status else words
