"""Kept-alive HTTP/1.1 connections over the standard library's ``http.client``.

The control plane's calls are small JSON requests, and a checkpoint over worker groups makes
dozens of them, in sequence, inside the pause (prepare and resume go stage by stage, and each
stage crosses coordinator -> server -> group -> workers). Through httpx such a call cost about
1.5 ms of client CPU on a 2-core host, most of it in request and response modelling that a
fixed JSON call does not need; ``http.client`` does the same exchange in a fraction of that.
:class:`JsonClient <rollout_checkpoint.server._http.JsonClient>` uses this for plain ``http``
URLs and Unix sockets, and httpx for everything else (``https``, a caller's own transport).
"""

from __future__ import annotations

import http.client
import socket
import threading
from urllib.parse import urlsplit

__all__ = ["ConnectionPool", "ReadTimedOut", "TransportFailed"]


class TransportFailed(Exception):
    """No answer: the connection could not be made, broke, or timed out before the answer."""


class ReadTimedOut(TransportFailed):
    """The request was sent but no answer came in time (the connection is closed)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class ConnectionPool:
    """Idle connections to one ``http://host:port`` or one Unix socket, reused last-in first-out;
    safe for concurrent calls (each takes its own connection). Every call must be idempotent:
    one that fails on a reused connection before any answer (the server closed it while idle) is
    sent once more on a new one."""

    def __init__(self, base_url: str, *, uds: str | None = None) -> None:
        parts = urlsplit(base_url)
        if uds is None and parts.scheme != "http":
            raise ValueError(f"ConnectionPool serves http:// URLs and Unix sockets, not {base_url!r}")
        self._uds = uds
        self._host = parts.hostname or "localhost"
        self._port = parts.port or 80
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        if self._uds is not None:
            return _UnixConnection(self._uds, timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def request(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, bytes]:
        """``(status, body)`` of one exchange; :class:`ReadTimedOut` when the answer did not come
        within ``timeout``, :class:`TransportFailed` for any other failure to get one."""
        with self._lock:
            reused = self._idle.pop() if self._idle else None
        if reused is not None:
            try:
                return self._exchange(reused, method, target, body, headers, timeout)
            except _StaleConnection:
                pass  # closed by the server while idle: the request never reached it whole
        return self._exchange(self._new(timeout), method, target, body, headers, timeout, fresh=True)

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float,
        *,
        fresh: bool = False,
    ) -> tuple[int, bytes]:
        keep = False
        try:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, target, body=body, headers=headers)
                response = conn.getresponse()
            except _STALE as exc:
                if not fresh:
                    raise _StaleConnection from exc
                raise TransportFailed(f"{type(exc).__name__}: {exc}") from exc
            except TimeoutError as exc:
                if conn.sock is None:  # not even connected
                    raise TransportFailed(f"connect timed out: {exc}") from exc
                raise ReadTimedOut(f"no answer within {timeout:.3g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise TransportFailed(f"{type(exc).__name__}: {exc}") from exc
            try:
                data = response.read()
            except TimeoutError as exc:
                raise ReadTimedOut(f"the answer did not arrive within {timeout:.3g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise TransportFailed(f"{type(exc).__name__}: {exc}") from exc
            keep = not response.will_close
            return response.status, data
        finally:
            if keep:
                with self._lock:
                    keep = not self._closed
                    if keep:
                        self._idle.append(conn)
            if not keep:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _StaleConnection(Exception):
    pass
