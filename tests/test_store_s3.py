"""S3Store against a real moto server over HTTP on 127.0.0.1: the traps from the object-store
notes (each with its own test), retries, and the endpoint probe.

Fault injection uses a tiny HTTP proxy (below) between the client and moto: it can strip the
If-None-Match / If-Match headers (an endpoint that ignores preconditions), answer with an S3
error instead of forwarding (throttling, 5xx, 409, 403), or forward a request and then drop the
connection (a request that succeeded but whose answer was lost).
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest

from rollout_checkpoint.errors import (
    ConditionalWriteUnsupportedError,
    InvalidIdentifierError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreError,
    TransientStoreError,
    VersionChangedError,
)
from rollout_checkpoint.store import CountingStore, RetryPolicy, S3Store, _s3, open_store

pytestmark = pytest.mark.s3

FAST = RetryPolicy(attempts=4, initial_wait=0.01, max_wait=0.05, jitter=0.01)


# -- the proxy ----------------------------------------------------------------------------------


@dataclass
class Fault:
    """Answer the next ``times`` matching requests with ``status``/``code`` (``code=None``:
    forward the request, then drop the connection without an answer)."""

    method: str
    status: int
    code: str | None
    times: int = 1


@dataclass
class ProxyState:
    upstream: str
    strip_headers: frozenset[str] = frozenset()
    faults: list[Fault] = field(default_factory=list)
    seen: list[tuple[str, str]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, method: str) -> Fault | None:
        with self.lock:
            self.seen.append((method, ""))
            for fault in self.faults:
                if fault.method == method and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def count(self, method: str | None = None) -> int:
        with self.lock:
            return sum(1 for m, _ in self.seen if method is None or m == method)


def _make_handler(state: ProxyState) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(state.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))

        def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _handle(self) -> None:
            body = self._body()
            with state.lock:
                state.authorizations.append(self.headers.get("Authorization", ""))
            fault = state.take_fault(self.command)
            if fault is not None and fault.code is not None:
                xml = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
                    f"<Message>injected by the test proxy</Message></Error>"
                ).encode()
                self._reply(fault.status, [("Content-Type", "application/xml")], xml)
                return
            skip = {"host", "content-length", "transfer-encoding", "connection"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip | state.strip_headers}
            headers["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                out = [(k, v) for k, v in resp.getheaders() if k.lower() not in skip]
            finally:
                conn.close()
            if fault is not None:  # the request happened upstream; the answer is lost
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._reply(resp.status, out, data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


@pytest.fixture()
def proxy(s3_endpoint: str) -> Iterator[tuple[str, ProxyState]]:
    state = ProxyState(upstream=s3_endpoint)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def _store(url: str, endpoint: str, retry: RetryPolicy = FAST) -> S3Store:
    store = open_store(url, endpoint_url=endpoint, retry=retry)
    assert isinstance(store, S3Store)
    return store


def _probed(store: S3Store) -> S3Store:
    """Run the endpoint probe now (every conditional put runs it first otherwise), so the
    faults a test injects hit the request under test and not the probe's."""
    store.require_atomic_commits()
    return store


def _boto(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- opening -----------------------------------------------------------------------------------------


def test_from_url_parses_bucket_and_prefix(s3_bucket: str, s3_endpoint: str) -> None:
    store = S3Store.from_url(f"s3://{s3_bucket}/deep/prefix/", endpoint_url=s3_endpoint)
    assert (store.bucket, store.prefix, store.url) == (
        s3_bucket,
        "deep/prefix",
        f"s3://{s3_bucket}/deep/prefix",
    )
    store.put("k", b"v")
    assert _boto(s3_endpoint).get_object(Bucket=s3_bucket, Key="deep/prefix/k")["Body"].read() == b"v"

    at_root = S3Store.from_url(f"s3a://{s3_bucket}", endpoint_url=s3_endpoint)
    assert at_root.prefix == "" and at_root.url == f"s3://{s3_bucket}"
    assert [i.key for i in at_root.list()] == ["deep/prefix/k"]
    assert at_root.get("deep/prefix/k") == b"v"

    for bad in ("s3://", "s3:///x", "gs://b/x", "no-scheme"):
        with pytest.raises(StoreError):
            S3Store.from_url(bad, endpoint_url=s3_endpoint)
    for bad in (f"s3://{s3_bucket}/a/../b", f"s3://{s3_bucket}/a//b", f"s3://{s3_bucket}/a/\x01"):
        with pytest.raises(InvalidIdentifierError):
            S3Store.from_url(bad, endpoint_url=s3_endpoint)


def test_caches_that_hide_other_writers_are_off(s3_url: str, s3_endpoint: str) -> None:
    store = S3Store.from_url(s3_url, endpoint_url=s3_endpoint, use_listings_cache=True)
    assert store.fs.dircache.use_listings_cache is False
    other = S3Store.from_url(s3_url, endpoint_url=s3_endpoint)
    assert other.fs is not store.fs  # no shared fsspec instance cache


def test_endpoint_from_aws_endpoint_url_env(
    s3_bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    store = open_store(f"s3://{s3_bucket}/env")
    assert isinstance(store, S3Store)
    assert store.endpoint == s3_endpoint
    store.put("x", b"1")
    assert _boto(s3_endpoint).get_object(Bucket=s3_bucket, Key="env/x")["Body"].read() == b"1"


def test_credentials_from_aws_env_or_storage_options(
    s3_url: str, proxy: tuple[str, ProxyState], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, state = proxy
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEYID123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)  # the service-specific endpoint variable
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    store = open_store(s3_url, retry=FAST)
    assert isinstance(store, S3Store) and store.endpoint == endpoint
    store.put("k", b"v")
    assert state.authorizations and "Credential=ENVKEYID123/" in state.authorizations[-1]
    # explicit storage options win over the environment
    state.authorizations.clear()
    opt = open_store(s3_url, endpoint_url=endpoint, key="OPTKEYID456", secret="opt-secret", retry=FAST)
    assert opt.get("k") == b"v"
    assert state.authorizations and all("Credential=OPTKEYID456/" in a for a in state.authorizations)


def test_missing_bucket_is_a_store_error(s3_endpoint: str) -> None:
    store = _store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p", s3_endpoint)
    with pytest.raises(StoreError) as info:
        store.list()
    assert not isinstance(info.value, ObjectNotFoundError)
    assert "does not exist" in info.value.message


# -- trap: s3fs open("xb") with zero bytes overwrites unconditionally ----------------------------------


def test_empty_create_only_put_over_existing_key_is_refused(s3_store: S3Store, s3_endpoint: str) -> None:
    s3_store.put("manifest.json", b'{"committed": true}')
    with pytest.raises(ObjectExistsError):
        s3_store.put_if_absent("manifest.json", b"")
    assert s3_store.get("manifest.json") == b'{"committed": true}'
    # the same through the raw bucket view, so no client-side cache can fake it
    key = f"{s3_store.prefix}/manifest.json"
    assert (
        _boto(s3_endpoint).get_object(Bucket=s3_store.bucket, Key=key)["Body"].read()
        == b'{"committed": true}'
    )


# -- trap: IfMatch dropped on the multipart path ------------------------------------------------------


def test_large_put_if_match_with_stale_etag_never_overwrites(s3_store: S3Store) -> None:
    big = b"A" * (11 * 1024 * 1024)
    v1 = s3_store.put("big", b"original").version
    assert v1 is not None
    v2 = s3_store.put_if_match("big", big, v1)  # current etag: accepted, as ONE PutObject
    assert v2.version is not None and "-" not in v2.version  # a multipart ETag would be "<md5>-N"
    with pytest.raises(VersionChangedError):
        s3_store.put_if_match("big", b"B" * (11 * 1024 * 1024), v1)
    assert s3_store.stat("big").version == v2.version
    assert s3_store.get_range("big", 0, 4) == b"AAAA"


def test_conditional_objects_over_single_put_limit_are_refused(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = s3_store.put("ptr", b"small").version
    assert version is not None
    monkeypatch.setattr(_s3, "MAX_SINGLE_PUT_BYTES", 1024)
    with pytest.raises(StoreError, match="5 GiB single-PUT limit"):
        s3_store.put_if_match("ptr", b"x" * 2048, version)
    with pytest.raises(StoreError, match="5 GiB single-PUT limit"):
        s3_store.put_if_absent("new", b"x" * 2048)
    assert s3_store.get("ptr") == b"small"
    assert not s3_store.exists("new")
    # plain puts may go multipart (unconditional, keys nobody else writes)
    assert s3_store.put("plain", b"y" * 2048).size == 2048


# -- trap: a retried create-only put whose first try succeeded -----------------------------------------


@pytest.mark.parametrize("warm", [True, False], ids=["reused-connection", "fresh-connection"])
def test_lost_answer_on_create_resolves_as_idempotent_success(
    s3_url: str, proxy: tuple[str, ProxyState], warm: bool
) -> None:
    # On a reused keep-alive connection aiohttp itself resends the PUT; on a fresh one our retry
    # layer does. Either way the resend meets 412 and must resolve to our own bytes.
    endpoint, state = proxy
    store = _probed(_store(s3_url, endpoint))
    state.seen.clear()  # count only the requests under test
    if warm:
        store.put("warm-up", b"")
    state.faults.append(Fault("PUT", 0, None))  # the PUT lands, then the connection drops
    result = store.put_if_absent("commit.json", b'{"token": "t-1"}')
    assert result.created is False  # the resend saw 412 and found our own bytes
    assert state.count("PUT") == (3 if warm else 2)
    assert store.get("commit.json") == b'{"token": "t-1"}'
    assert result.info.version == store.stat("commit.json").version


def test_create_conflict_with_different_content_is_object_exists(s3_store: S3Store, s3_endpoint: str) -> None:
    key = f"{s3_store.prefix}/commit.json"
    _boto(s3_endpoint).put_object(Bucket=s3_store.bucket, Key=key, Body=b'{"token": "other-writer"}')
    with pytest.raises(ObjectExistsError):
        s3_store.put_if_absent("commit.json", b'{"token": "mine"}')
    assert s3_store.get("commit.json") == b'{"token": "other-writer"}'


def test_lost_answer_on_cas_resolves_when_our_bytes_landed(
    s3_url: str, proxy: tuple[str, ProxyState]
) -> None:
    endpoint, state = proxy
    store = _probed(_store(s3_url, endpoint))
    state.seen.clear()  # count only the requests under test
    version = store.put("latest", b"ckpt-1").version
    assert version is not None
    state.faults.append(Fault("PUT", 0, None))
    info = store.put_if_match("latest", b"ckpt-2", version)
    assert info.version == store.stat("latest").version
    assert store.get("latest") == b"ckpt-2"


# -- trap: listing caches hide other writers ----------------------------------------------------------


def test_list_sees_objects_written_by_other_clients(s3_store: S3Store, s3_url: str, s3_endpoint: str) -> None:
    s3_store.put("ckpts/a/manifest.json", b"a")
    assert [i.key for i in s3_store.list("ckpts/")] == ["ckpts/a/manifest.json"]
    assert s3_store.exists("ckpts/a/manifest.json")
    assert not s3_store.exists("ckpts/b/manifest.json")

    _boto(s3_endpoint).put_object(
        Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/ckpts/b/manifest.json", Body=b"b"
    )
    S3Store.from_url(s3_url, endpoint_url=s3_endpoint).put("ckpts/c/manifest.json", b"c")
    assert [i.key for i in s3_store.list("ckpts/")] == [
        "ckpts/a/manifest.json",
        "ckpts/b/manifest.json",
        "ckpts/c/manifest.json",
    ]
    assert s3_store.exists("ckpts/b/manifest.json")
    assert s3_store.get("ckpts/c/manifest.json") == b"c"

    _boto(s3_endpoint).delete_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/ckpts/a/manifest.json")
    assert [i.key for i in s3_store.list("ckpts/")] == ["ckpts/b/manifest.json", "ckpts/c/manifest.json"]


def test_list_skips_keys_that_are_not_store_keys(s3_store: S3Store, s3_endpoint: str) -> None:
    client = _boto(s3_endpoint)
    for raw in ("folder/", "a//b", "ok/key"):
        client.put_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/{raw}", Body=b"")
    assert [i.key for i in s3_store.list()] == ["ok/key"]


def test_list_paginates(s3_store: S3Store) -> None:
    s3_store.list_page_size = 7
    for i in range(30):
        s3_store.put(f"many/{i:03d}", b"x")
    s3_store.put("many-not/x", b"x")
    assert [i.key for i in s3_store.list("many/")] == [f"many/{i:03d}" for i in range(30)]
    assert len(s3_store.list("many")) == 31


# -- retries -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (503, "SlowDown"),
        (500, "InternalError"),
        (409, "ConditionalRequestConflict"),
        (429, "TooManyRequests"),
    ],
)
def test_transient_errors_are_retried_then_succeed(
    s3_url: str, proxy: tuple[str, ProxyState], status: int, code: str
) -> None:
    endpoint, state = proxy
    store = _probed(_store(s3_url, endpoint))
    state.seen.clear()  # count only the requests under test
    state.faults.append(Fault("PUT", status, code, times=2))
    assert store.put_if_absent("k", b"v").created is True
    assert state.count("PUT") == 3
    state.faults.append(Fault("GET", status, code, times=2))
    assert store.get("k") == b"v"
    assert state.count("GET") == 3


def test_retries_are_bounded(s3_url: str, proxy: tuple[str, ProxyState]) -> None:
    endpoint, state = proxy
    store = _store(s3_url, endpoint)
    state.faults.append(Fault("PUT", 503, "SlowDown", times=100))
    with pytest.raises(TransientStoreError) as info:
        store.put_if_absent("k", b"v")
    assert info.value.code == "store_transient"
    assert state.count("PUT") == FAST.attempts


@pytest.mark.parametrize(("status", "code"), [(403, "AccessDenied"), (400, "InvalidRequest")])
def test_permanent_errors_are_not_retried(
    s3_url: str, proxy: tuple[str, ProxyState], status: int, code: str
) -> None:
    endpoint, state = proxy
    store = _store(s3_url, endpoint)
    state.faults.append(Fault("PUT", status, code, times=100))
    with pytest.raises(StoreError) as info:
        store.put_if_absent("k", b"v")
    assert not isinstance(info.value, TransientStoreError)
    assert state.count("PUT") == 1


def test_precondition_failures_are_not_retried(s3_url: str, proxy: tuple[str, ProxyState]) -> None:
    endpoint, state = proxy
    store = _probed(_store(s3_url, endpoint))
    state.seen.clear()  # count only the requests under test
    version = store.put("p", b"1").version
    assert version is not None
    store.put("p", b"2")
    before = state.count("PUT")
    with pytest.raises(VersionChangedError):
        store.put_if_match("p", b"3", version)
    assert state.count("PUT") == before + 1


def test_unreachable_endpoint_is_transient(s3_bucket: str) -> None:
    store = _store(f"s3://{s3_bucket}/x", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(TransientStoreError):
        store.stat("k")
    # invalid keys are refused before any I/O: no connection error, the key error
    with pytest.raises(InvalidIdentifierError):
        store.put_if_absent("../k", b"v")


# -- the endpoint probe --------------------------------------------------------------------------------


def test_probe_passes_on_moto_and_updates_capabilities(s3_store: S3Store, s3_endpoint: str) -> None:
    assert not s3_store.capabilities.atomic_put_if_absent  # not shown yet
    assert not s3_store.capabilities.atomic_put_if_match
    s3_store.require_atomic_commits()
    assert s3_store.capabilities.atomic_put_if_absent
    assert s3_store.capabilities.atomic_put_if_match
    result = s3_store.probe_conditional_writes()
    assert result.atomic and result.endpoint == s3_endpoint and result.bucket == s3_store.bucket
    listed = _boto(s3_endpoint).list_objects_v2(Bucket=s3_store.bucket)
    assert listed.get("KeyCount", 0) == 0  # the probe key is gone


def test_probe_runs_once_per_endpoint_and_bucket(s3_url: str, proxy: tuple[str, ProxyState]) -> None:
    endpoint, state = proxy
    first = _store(s3_url, endpoint)
    first.require_atomic_commits()
    probe_requests = state.count()
    assert probe_requests >= 4
    second = CountingStore(_store(s3_url, endpoint))  # a new instance, same endpoint + bucket
    second.require_atomic_commits()
    assert second.capabilities.atomic_put_if_match
    assert state.count() == probe_requests  # answered from the cache, no requests


def test_probe_refuses_endpoint_that_ignores_preconditions(
    s3_url: str, proxy: tuple[str, ProxyState]
) -> None:
    endpoint, state = proxy
    state.strip_headers = frozenset({"if-none-match", "if-match"})
    store = _store(s3_url, endpoint)
    with pytest.raises(ConditionalWriteUnsupportedError) as info:
        store.require_atomic_commits()
    assert info.value.code == "conditional_writes_unsupported"
    assert "If-None-Match: * IGNORED" in info.value.message
    assert "If-Match IGNORED" in info.value.message
    assert info.value.details["endpoint"] == endpoint
    assert not store.capabilities.atomic_put_if_absent
    assert not store.capabilities.atomic_put_if_match
    assert store.list() == []  # probe key cleaned up

    seen = state.count()
    with pytest.raises(ConditionalWriteUnsupportedError):  # cached answer, no new probe
        _store(s3_url, endpoint).require_atomic_commits()
    assert state.count() == seen
    store.require_atomic_commits(accept_risk=True)
    assert state.count() == seen


def test_probe_detects_only_if_match_ignored(
    s3_url: str, s3_endpoint: str, proxy: tuple[str, ProxyState]
) -> None:
    endpoint, state = proxy
    state.strip_headers = frozenset({"if-match"})  # an endpoint that honours If-None-Match only
    store = _store(s3_url, endpoint)
    with pytest.raises(ConditionalWriteUnsupportedError) as info:
        store.require_atomic_commits()
    assert info.value.details["atomic_put_if_absent"] is True
    assert info.value.details["atomic_put_if_match"] is False
    assert store.capabilities.atomic_put_if_absent and not store.capabilities.atomic_put_if_match
    # the verdict belongs to the proxy endpoint only; moto itself is probed on its own
    direct = _store(s3_url, s3_endpoint)
    assert not direct.capabilities.atomic_put_if_match
    direct.require_atomic_commits()
    assert direct.capabilities.atomic_put_if_match


def test_probe_errors_are_not_cached(s3_url: str, proxy: tuple[str, ProxyState]) -> None:
    endpoint, state = proxy
    store = _store(s3_url, endpoint)
    state.faults.append(Fault("PUT", 503, "SlowDown", times=FAST.attempts))
    with pytest.raises(TransientStoreError):
        store.require_atomic_commits()
    assert not store.capabilities.atomic_put_if_absent
    store.require_atomic_commits()  # the next call probes again and passes
    assert store.capabilities.atomic_put_if_absent


@pytest.fixture(autouse=True)
def _fresh_probe_cache() -> Iterator[None]:
    _s3.clear_probe_cache()
    yield
    _s3.clear_probe_cache()


def test_every_conditional_put_is_probed_first(s3_url: str, proxy: tuple[str, ProxyState]) -> None:
    """Not only the coordinator: any caller's first conditional put (here a bare store, as the
    archive writer or the token store use it) probes the endpoint and refuses one that ignores
    If-None-Match / If-Match, unless the risk was accepted."""
    endpoint, state = proxy
    state.strip_headers = frozenset({"if-none-match", "if-match"})
    store = _store(s3_url, endpoint)
    with pytest.raises(ConditionalWriteUnsupportedError) as info:
        store.put_if_absent("checkpoints/c/components/a/a0/manifest.json", b"{}")
    assert info.value.code == "conditional_writes_unsupported"
    with pytest.raises(ConditionalWriteUnsupportedError):
        store.put_if_match("latest.json", b"{}", "etag")
    assert store.list() == []  # nothing written, probe key removed
    seen = state.count()
    with pytest.raises(ConditionalWriteUnsupportedError):  # once per endpoint + bucket: cached
        _store(s3_url, endpoint).put_if_absent("k", b"v")
    assert state.count() == seen
    risky = open_store(s3_url, endpoint_url=endpoint, retry=FAST, accept_unsafe_store=True)
    assert risky.put_if_absent("k", b"v").created
    assert state.count() == seen + 1  # one PutObject, no probe


def test_archive_writer_probes_before_its_create_only_manifest(
    s3_url: str, proxy: tuple[str, ProxyState]
) -> None:
    from rollout_checkpoint.archive import ArchiveWriter
    from rollout_checkpoint.format.records import AgentBoundaryRecord

    endpoint, state = proxy
    state.strip_headers = frozenset({"if-none-match"})
    store = _store(s3_url, endpoint)
    writer = ArchiveWriter(
        store,
        "checkpoints/c1/components/agent/a0",
        checkpoint_id="c1",
        participant_kind="agent",
        instance="a0",
    )
    writer.write(AgentBoundaryRecord(rollout_id="r1", attempt=0, boundary_index=1, turn_index=1))
    with pytest.raises(ConditionalWriteUnsupportedError):
        writer.commit()
    assert not store.exists("checkpoints/c1/components/agent/a0/manifest.json")


# -- streaming writes ---------------------------------------------------------------------------------


def test_open_write_multipart_round_trip_and_abort(s3_store: S3Store, s3_endpoint: str) -> None:
    s3_store.write_block_size = 5 << 20  # S3's minimum part size: 12 MiB is a 3-part upload
    part = os.urandom(1 << 20)
    with s3_store.open_write("big/obj") as fh:
        for _ in range(12):
            fh.write(part)
        assert not s3_store.exists("big/obj")  # parts uploaded, nothing visible yet
    assert s3_store.stat("big/obj").size == 12 << 20
    assert s3_store.get_range("big/obj", (5 << 20) - 3, (5 << 20) + 3) == part[-3:] + part[:3]
    # an exception aborts the multipart upload: no object, no upload left behind
    with pytest.raises(RuntimeError), s3_store.open_write("big/partial") as fh:
        for _ in range(12):
            fh.write(part)
        raise RuntimeError("writer crashed")
    assert not s3_store.exists("big/partial")
    uploads = _boto(s3_endpoint).list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads if u["Key"].endswith("big/partial")] == []
