"""The kept-alive ``http.client`` connections of the control plane (``server._lean``), against
real sockets: reuse, a connection the server closed while idle, timeouts, unreachable servers,
and the JSON client's error mapping over them."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import ThreadingUnixStreamServer
from typing import Any

import pytest

from rollout_checkpoint.errors import CheckpointError, DeadlineExceededError
from rollout_checkpoint.protocol import Phase, PrepareReport
from rollout_checkpoint.server import RemoteParticipant
from rollout_checkpoint.server._http import JsonClient, SliceEnded
from rollout_checkpoint.server._lean import ConnectionPool, ReadTimedOut, TransportFailed
from rollout_checkpoint.server._wire import ParticipantUnreachableError

TOKEN = "tok-lean-http-secret"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def log_message(self, *args: Any) -> None:
        pass

    def address_string(self) -> str:  # a Unix socket peer has no host
        return "peer"

    def setup(self) -> None:  # one handler per connection: number them
        super().setup()
        server: Any = self.server
        with server.count_lock:
            server.connections += 1
            self.number = server.connections

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        server: Any = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        server.seen.append((self.command, self.path, dict(self.headers), body, self.number))
        if self.path.endswith("/slow"):
            time.sleep(server.delay)
        status, payload = server.answer
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up waiting
            self.close_connection = True
            return
        if server.close_after:
            self.close_connection = True


def _configure(server: Any) -> Any:
    server.seen = []
    server.answer = (200, {"ok": True})
    server.delay = 0.0
    server.close_after = False
    server.connections = 0
    server.count_lock = threading.Lock()
    server.daemon_threads = True
    return server


@pytest.fixture()
def tcp_server() -> Iterator[Any]:
    server = _configure(ThreadingHTTPServer(("127.0.0.1", 0), _Handler))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture()
def unix_server() -> Iterator[Any]:
    path = os.path.join(tempfile.mkdtemp(prefix="rc-lean-"), "s.sock")
    server = _configure(ThreadingUnixStreamServer(path, _Handler))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.path = path
    yield server
    server.shutdown()
    server.server_close()


def _url(server: Any) -> str:
    host, port = server.server_address
    return f"http://{host}:{port}"


def test_a_connection_is_kept_and_reused(tcp_server: Any) -> None:
    pool = ConnectionPool(_url(tcp_server))
    for _ in range(3):
        assert pool.request("GET", "/x", None, {}, 5.0) == (200, b'{"ok": true}')
    assert len({seen[4] for seen in tcp_server.seen}) == 1  # one connection for the three
    pool.close()


def test_unix_socket_and_body_and_headers(unix_server: Any) -> None:
    pool = ConnectionPool("http://group", uds=unix_server.path)
    status, data = pool.request("POST", "/p?q=1", b'{"a":1}', {"Authorization": "Bearer t"}, 5.0)
    assert status == 200 and json.loads(data) == {"ok": True}
    method, path, headers, body, _ = unix_server.seen[0]
    assert (method, path, body, headers["Authorization"]) == ("POST", "/p?q=1", b'{"a":1}', "Bearer t")
    pool.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(tcp_server: Any) -> None:
    tcp_server.close_after = True  # every answer closes its connection: the kept one is stale
    pool = ConnectionPool(_url(tcp_server))
    for _ in range(3):
        assert pool.request("GET", "/x", None, {}, 5.0)[0] == 200
    assert len({seen[4] for seen in tcp_server.seen}) == 3
    pool.close()


def test_no_answer_in_time_is_a_read_timeout_and_the_connection_is_dropped(tcp_server: Any) -> None:
    tcp_server.delay = 1.0
    pool = ConnectionPool(_url(tcp_server))
    with pytest.raises(ReadTimedOut):
        pool.request("GET", "/slow", None, {}, 0.2)
    tcp_server.delay = 0.0
    assert pool.request("GET", "/slow", None, {}, 5.0)[0] == 200
    assert len({seen[4] for seen in tcp_server.seen}) == 2  # the timed-out one was not reused
    pool.close()


def test_nothing_listening_is_a_transport_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(TransportFailed):
        ConnectionPool(f"http://127.0.0.1:{port}").request("GET", "/", None, {}, 2.0)
    with pytest.raises(TransportFailed):
        ConnectionPool("http://x", uds="/nonexistent/rc-lean.sock").request("GET", "/", None, {}, 2.0)


def test_only_plain_http_or_a_unix_socket() -> None:
    with pytest.raises(ValueError, match="http://"):
        ConnectionPool("https://example.invalid")


def test_json_client_maps_answers_and_failures(tcp_server: Any) -> None:
    client = JsonClient(_url(tcp_server), token=TOKEN, attempts=2)
    report = {"checkpoint_id": "c1", "phase": "prepared", "ready": True, "incarnation": "a" * 32}
    tcp_server.answer = (200, report)
    answer = client.call("POST", "/prepare", {"checkpoint_id": "c1"}, PrepareReport, None)
    assert answer.phase is Phase.PREPARED
    _, path, headers, body, _ = tcp_server.seen[-1]
    assert path == "/prepare"
    assert headers["Authorization"] == f"Bearer {TOKEN}" and json.loads(body) == {"checkpoint_id": "c1"}
    tcp_server.answer = (409, {"error": {"code": "stale_checkpoint", "detail": "old"}})
    with pytest.raises(CheckpointError, match="refused: old") as refused:
        client.call("POST", "/prepare", {}, PrepareReport, None)
    assert getattr(refused.value, "code", None) == "stale_checkpoint"
    tcp_server.answer = (503, {"error": {"code": "x", "detail": "busy"}})
    with pytest.raises(ParticipantUnreachableError, match="after 2 tries"):
        client.call("POST", "/prepare", {}, PrepareReport, None)
    tcp_server.answer = (200, report)
    tcp_server.delay = 1.0
    with pytest.raises(SliceEnded):
        client.call("POST", "/slow", {}, PrepareReport, time.time() + 30, answer_by=time.time() + 0.2)
    with pytest.raises(DeadlineExceededError):
        JsonClient(_url(tcp_server), token=TOKEN, answer_margin_s=0.0).call(
            "POST", "/slow", {}, PrepareReport, time.time() + 0.3
        )
    client.close()


def test_remote_participant_refuses_a_socket_and_a_transport_together() -> None:
    import httpx

    with pytest.raises(ValueError, match="not both"):
        RemoteParticipant("http://w", token=TOKEN, uds="/tmp/x.sock", transport=httpx.HTTPTransport())
