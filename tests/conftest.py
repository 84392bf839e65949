"""Shared fixtures: a real moto S3 server over HTTP on 127.0.0.1, fresh buckets, stores."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from rollout_checkpoint.store import LocalStore, MemoryStore, ObjectStore

# Shared, noisy machines: no per-example deadlines. In CI the examples are derandomized so a run
# is reproducible; locally hypothesis keeps exploring new examples.
settings.register_profile("rollout-checkpoint", deadline=None, print_blob=True)
settings.register_profile("ci", parent=settings.get_profile("rollout-checkpoint"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "rollout-checkpoint")

S3_ENV = "ROLLOUT_CHECKPOINT_TEST_S3_ENDPOINT"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes] | None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start listening in time")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``--dist loadgroup`` grouping on pytest 9: pytest-xdist (3.8) marks a test of an
    ``xdist_group`` by suffixing its node id with ``@<group>`` through ``Item._nodeid``, which
    pytest 9 no longer reads (the id lives in ``Item._id``), so the group's tests would spread
    over the workers (the Ray tests would each start a cluster). Does the same through ``_id``;
    a no-op where xdist's own suffix took effect or without ``--dist loadgroup``."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id  # pytest 9's node id type

            item._id = coerce_node_id(item.nodeid + suffix)


@pytest.fixture(scope="session", autouse=True)
def _no_server_group_left() -> Iterator[None]:
    """A test that failed before its teardown leaves no ``serve`` process group behind (its
    workers included): every group ``_procs.start_group`` started and no teardown killed is
    SIGKILLed when the session ends (module-scoped servers live across tests until then)."""
    yield
    from _procs import kill_started_groups

    kill_started_groups()


@pytest.fixture(autouse=True)
def _drop_finished_spans() -> Iterator[None]:
    """Once a test installed the OpenTelemetry SDK (``tests/_telemetry.py``, one per process),
    every later span lands in its in-memory exporter: drop them after each test."""
    yield
    installed = sys.modules.get("_telemetry")
    if installed is not None and installed.telemetry.cache_info().currsize:
        installed.telemetry().spans.clear()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1: the one .ci/run started, or one started here."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    given = os.environ.get(S3_ENV)
    if given:
        yield given
        return
    port = _free_port()
    proc = subprocess.Popen(
        # moto's server, with its conditional writes made atomic as on S3 (see _moto_atomic.py)
        [sys.executable, str(Path(__file__).parent / "_moto_atomic.py"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture()
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh, empty bucket on the moto server; returns its name."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture()
def s3_url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/ckpt"


@pytest.fixture()
def s3_store(s3_url: str, s3_endpoint: str) -> ObjectStore:
    from rollout_checkpoint.store import open_store

    return open_store(s3_url, endpoint_url=s3_endpoint)


@pytest.fixture()
def local_store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture()
def memory_store() -> MemoryStore:
    return MemoryStore(f"t-{uuid.uuid4().hex}")


@pytest.fixture(params=["local", "memory", "s3"])
def any_store(request: pytest.FixtureRequest) -> ObjectStore:
    """The same test on local disk, memory and S3 (moto server)."""
    name = request.param
    if name == "local":
        return request.getfixturevalue("local_store")  # type: ignore[no-any-return]
    if name == "memory":
        return request.getfixturevalue("memory_store")  # type: ignore[no-any-return]
    return request.getfixturevalue("s3_store")  # type: ignore[no-any-return]


@pytest.fixture()
def collector_enabled() -> Iterator[None]:
    """The cycle collector on for the test, and as it was afterwards."""
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()
