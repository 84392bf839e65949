"""The token store as an HTTP service, and the remote sink/source that talks to it.

The reference :class:`~rollout_checkpoint.tokens.ObjectStoreTokenStore` is already safe to
share between processes through the object store; serving it gives policy-model servers and
the coordinator one endpoint (``rollout-checkpoint serve tokens``). A put is answered only
once its shard is durable, so a receipt in hand always names stored tokens; a repeated put
of the same call is a no-op, which makes every route safe to retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Annotated

import anyio
import httpx
from fastapi import APIRouter, FastAPI, Query, Security
from pydantic import BaseModel, ConfigDict, Field

from ..ids import Identifier
from ..tokens import ObjectStoreTokenStore, TokenEntry, TokenPutReceipt, TokenSnapshotReceipt
from ._http import JsonClient
from ._router import _route_class, _TokenCheck

__all__ = ["TOKENS_ROUTE_PREFIX", "RemoteTokenStore", "token_store_app", "token_store_router"]

TOKENS_ROUTE_PREFIX = "/v1/tokens"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PutRequest(_Body):
    entries: list[TokenEntry] = Field(min_length=1, max_length=10_000)


class PutReply(_Body):
    receipts: list[TokenPutReceipt]


class SnapshotRequest(_Body):
    checkpoint_id: Identifier


class NameReply(_Body):
    name: str


def token_store_router(tokens: ObjectStoreTokenStore, *, token: str) -> APIRouter:
    """``GET /name``, ``POST /put``, ``POST /snapshot``, ``GET /entry?key=`` (bearer-protected)."""
    check = _TokenCheck(token)
    router = APIRouter(
        prefix=TOKENS_ROUTE_PREFIX,
        tags=["tokens"],
        route_class=_route_class(check),
        dependencies=[Security(check)],
    )

    @router.get("/name", response_model=NameReply)
    async def name() -> NameReply:
        return NameReply(name=tokens.name)

    @router.post("/put", response_model=PutReply, summary="store calls durably; receipts after")
    async def put(body: PutRequest) -> PutReply:
        receipts = await anyio.to_thread.run_sync(tokens.put_many, body.entries)
        return PutReply(receipts=receipts)

    @router.post("/snapshot", response_model=TokenSnapshotReceipt, summary="bind a snapshot to a checkpoint")
    async def snapshot(body: SnapshotRequest) -> TokenSnapshotReceipt:
        return await anyio.to_thread.run_sync(tokens.snapshot, body.checkpoint_id)

    @router.get("/entry", response_model=TokenEntry)
    async def entry(key: Annotated[str, Query(min_length=1, max_length=512)]) -> TokenEntry:
        return await anyio.to_thread.run_sync(tokens.get, key)

    return router


def token_store_app(tokens: ObjectStoreTokenStore, *, token: str) -> FastAPI:
    app = FastAPI(title="rollout-checkpoint token store")
    app.include_router(token_store_router(tokens, token=token))
    return app


class RemoteTokenStore:
    """A :class:`~rollout_checkpoint.tokens.TokenSink` and ``TokenSource`` (and the coordinator's
    snapshot source) over a token-store server."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        attempts: int = 4,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._name: str | None = None
        self._http = JsonClient(
            base_url,
            token=token,
            prefix=TOKENS_ROUTE_PREFIX,
            attempts=attempts,
            default_timeout_s=timeout_s,
            transport=transport,
            clock=clock,
            describe=lambda: f"token store at {base_url}",
        )

    def __repr__(self) -> str:
        return f"RemoteTokenStore({self._http.base_url!r})"

    @property
    def name(self) -> str:
        if self._name is None:
            self._name = self._http.call("GET", "/name", None, NameReply, None).name
        return self._name

    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        return self.put_many([entry])[0]

    def put_many(self, entries: Sequence[TokenEntry]) -> list[TokenPutReceipt]:
        body = {"entries": [e.model_dump(mode="json") for e in entries]}
        reply = self._http.call("POST", "/put", body, PutReply, self._clock() + self.timeout_s)
        return list(reply.receipts)

    def snapshot(self, checkpoint_id: str) -> TokenSnapshotReceipt:
        body = {"checkpoint_id": checkpoint_id}
        return self._http.call(
            "POST", "/snapshot", body, TokenSnapshotReceipt, self._clock() + self.timeout_s
        )

    def get(self, key: str) -> TokenEntry:
        return self._http.call("GET", f"/entry?{httpx.QueryParams(key=key)}", None, TokenEntry, None)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteTokenStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
