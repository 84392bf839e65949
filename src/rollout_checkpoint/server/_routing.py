"""Session routing between the worker processes of one server (NeMo Gym's session routing).

Worker processes share one listening socket, so any of them may receive any request. The
worker that serves a request without an owner becomes its owner and says so in a signed
``rc_worker_<kind>_<instance>`` cookie (and the ``x-rc-worker`` header); a later request
carrying it is forwarded over the owner's private Unix socket when another worker received it.
After a restore the group aliases each pre-crash owner to the live worker that now holds its
state. A request for a rollout (path ``/ng-rollout/<rollout_id>/...``) goes to the worker
the group placed that rollout on, whatever cookie it carries: where a restore put its state,
else the least loaded worker.
An owner that is gone gets ``410 session_lost``: its state cannot be recovered by retrying.
The owner lives in the client's cookie, not in a central table, so routing state does not grow.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any

import httpx

__all__ = [
    "OWNER_COOKIE",
    "OWNER_HEADER",
    "ROLLOUT_PATH_PREFIX",
    "VIA_HEADER",
    "OwnerSigner",
    "Resolver",
    "StampOwner",
    "WorkerAddress",
    "WorkerFrontend",
]

OWNER_COOKIE = "rc_worker"
"""Prefix of the owner cookie; the full name adds the server's kind and instance, so one client
talking to several servers on one host (cookies ignore ports) keeps one owner per server."""
OWNER_HEADER = "x-rc-worker"
VIA_HEADER = "x-rc-via"
"""Set on a forwarded response: the worker that received the request and forwarded it."""
ROLLOUT_PATH_PREFIX = "/ng-rollout/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class WorkerAddress:
    worker_id: str
    socket: str


class OwnerSigner:
    """Signs worker ids with the server's token and identity (``kind/instance``), so a client
    cannot steer requests elsewhere and another server's owner is never taken for this one's."""

    def __init__(self, token: str, server: str = "") -> None:
        self._key = hashlib.sha256(f"rc-worker-owner:{server}:".encode() + token.encode()).digest()
        self.cookie = f"{OWNER_COOKIE}_{server.replace('/', '_')}" if server else OWNER_COOKIE

    def __repr__(self) -> str:
        return "OwnerSigner(<redacted>)"

    def sign(self, worker_id: str) -> str:
        mac = hmac.new(self._key, worker_id.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{worker_id}.{mac}"

    def owner(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The verified owner a request names (header first, then cookie), else ``None``."""
        value = None
        for name, raw in headers:
            if name.lower() == OWNER_HEADER.encode():
                value = raw.decode("latin-1")
                break
        if value is None:
            for name, raw in headers:
                if name.lower() == b"cookie":
                    cookie: SimpleCookie = SimpleCookie()
                    try:
                        cookie.load(raw.decode("latin-1"))
                    except Exception:  # a malformed cookie header names no owner
                        continue
                    if self.cookie in cookie:
                        value = cookie[self.cookie].value
                        break
        if not value or "." not in value:
            return None
        worker_id = value.rsplit(".", 1)[0]
        return worker_id if hmac.compare_digest(self.sign(worker_id), value) else None


class Resolver:
    """Asks the server's group (over its Unix socket) where an owner or a rollout lives now."""

    def __init__(self, group_socket: str, token: str) -> None:
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=group_socket),
            base_url="http://group",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10.0,
        )

    async def owner(self, owner: str) -> WorkerAddress | None:
        # not cached: a restore may re-home an owner at any time, and this is asked only for
        # requests that reached a worker other than their owner
        return await self._ask({"owner": owner})

    async def rollout(self, rollout_id: str) -> WorkerAddress | None:
        return await self._ask({"rollout": rollout_id})

    async def _ask(self, params: dict[str, str]) -> WorkerAddress | None:
        response = await self._client.get("/workers/resolve", params=params)
        if response.status_code != 200:
            return None
        body = response.json()
        return WorkerAddress(worker_id=str(body["worker_id"]), socket=str(body["socket"]))


class StampOwner:
    """Marks every response of ``app`` as owned by this worker (unless the request already was)."""

    def __init__(self, app: ASGIApp, worker_id: str, signer: OwnerSigner) -> None:
        self.app = app
        self.worker_id = worker_id
        self.signer = signer
        self._signed = signer.sign(worker_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.signer.owner(scope["headers"]) == self.worker_id:
            await self.app(scope, receive, send)
            return
        signed = self._signed

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((OWNER_HEADER.encode(), signed.encode()))
                headers.append(
                    (b"set-cookie", f"{self.signer.cookie}={signed}; Path=/; HttpOnly; SameSite=Lax".encode())
                )
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)


class WorkerFrontend:
    """The ASGI app one worker process serves on the shared socket: control routes go to the
    group, requests owned elsewhere are forwarded, the rest is served here (and stamped)."""

    def __init__(
        self,
        app: ASGIApp,
        control: ASGIApp,
        *,
        control_prefix: str,
        worker_id: str,
        signer: OwnerSigner,
        resolver: Resolver,
    ) -> None:
        self.app = app
        self.control = control
        self.control_prefix = control_prefix
        self.worker_id = worker_id
        self.signer = signer
        self.resolver = resolver
        self.local = StampOwner(app, worker_id, signer)
        self._clients: dict[str, httpx.AsyncClient] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan, websockets: this worker's app
            return
        path: str = scope["path"]
        if path.startswith(self.control_prefix):
            await self.control(scope, receive, send)
            return
        target: WorkerAddress | None = None
        rollout_id = (
            path[len(ROLLOUT_PATH_PREFIX) :].split("/", 1)[0] if path.startswith(ROLLOUT_PATH_PREFIX) else ""
        )
        if rollout_id:
            # a rollout's requests go where the group placed it (where a restore put its state),
            # whatever owner a client's shared cookie jar may carry
            target = await self.resolver.rollout(rollout_id)
        else:
            owner = self.signer.owner(scope["headers"])
            if owner is not None and owner != self.worker_id:
                target = await self.resolver.owner(owner)
                if target is None:
                    await _gone(send, owner)
                    return
        if target is not None and target.worker_id != self.worker_id:
            await self._forward(target, scope, receive, send)
            return
        await self.local(scope, receive, send)

    async def _forward(self, target: WorkerAddress, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        client = self._clients.get(target.socket)
        if client is None:
            client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=target.socket), base_url="http://worker", timeout=None
            )
            self._clients[target.socket] = client
        url = scope["path"] + (
            f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else ""
        )
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"host"]
        # a Request built directly carries exactly the caller's headers: the client's cookie jar
        # (which httpx fills from every response) must never add one caller's cookies (say, an
        # app's session cookie) to another caller's request
        request = httpx.Request(
            scope["method"], f"http://worker{url}", headers=headers, content=b"".join(chunks)
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError:
            await _gone(send, target.worker_id)
            return
        finally:
            client.cookies.clear()
        try:
            raw = [(k, v) for k, v in response.headers.raw if k.lower() != b"transfer-encoding"]
            raw.append((VIA_HEADER.encode(), self.worker_id.encode()))
            await send({"type": "http.response.start", "status": response.status_code, "headers": raw})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


async def _gone(send: Send, owner: str) -> None:
    body = json.dumps(
        {
            "error": {
                "code": "session_lost",
                "detail": f"worker {owner} that held this session is gone and its state is lost; "
                "start a new session",
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 410,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
