"""No 500 from a worker group's routing frontend (issue 18, item 5): the parent of
``serve --workers 2`` routes ``/ng-rollout/<id>/...`` by rollout and the control routes to the
group; invalid identifiers, values, owner headers and cookies answer a 4xx with a stable code.
Real processes (the reference resources and agent servers with two workers each), fuzzed with a
seeded generator."""

from __future__ import annotations

import random
import string
import time
from collections.abc import Iterator

import httpx
import pytest

from _procs import WorkerServer, worker_server
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, OWNER_HEADER

TOKEN = "tok-routes-4xx-workers-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BAD_IDS = ["\u00e9t\u00e9", "a..b", "-x", "x" * 200, "a%2Fb", "%00", "%FF", " ", "a b", "..", "~"]
BAD_ATTEMPTS = ["-1", "x", "1.5", str(2**40), "", "nan"]
BAD_DEADLINES: list[object] = [-1, 0, "soon", None, 1e300, float(2**63)]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerServer]]:
    root = tmp_path_factory.mktemp("routes-4xx-workers")
    env = {"ROLLOUT_CHECKPOINT_DEMO_ENV": "blackjack"}
    with (
        worker_server(
            root / "store", 2, token=TOKEN, build="rollout_checkpoint.demo._servers:build_resources", env=env
        ) as resources,
        worker_server(
            root / "store", 2, token=TOKEN, build="rollout_checkpoint.demo._servers:build_agent", env=env
        ) as agent,
    ):
        yield {"resources": resources, "agent": agent}


def _refused(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
    assert response.json()["error"]["code"], response.text


def _client(server: WorkerServer) -> httpx.Client:
    # a new connection per request: either worker may take it (and route it to the other)
    return httpx.Client(base_url=server.url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


def test_bad_rollout_ids_and_values_are_4xx_on_every_routed_route(servers: dict[str, WorkerServer]) -> None:
    with _client(servers["resources"]) as resources, _client(servers["agent"]) as agent:
        for rollout_id in BAD_IDS:
            _refused(agent.get(f"/ng-rollout/{rollout_id}/result", params={"attempt": 3517}))
            _refused(resources.get(f"/ng-rollout/{rollout_id}/state", params={"attempt": 0}))
            _refused(resources.post(f"/ng-rollout/{rollout_id}/step", json={"attempt": 0, "action": 0}))
            _refused(resources.post(f"/ng-rollout/{rollout_id}/seed_session", json={"attempt": 0, "seed": 1}))
        for attempt in BAD_ATTEMPTS:
            _refused(agent.get("/ng-rollout/r1/result", params={"attempt": attempt}))
            _refused(resources.get("/ng-rollout/r1/state", params={"attempt": attempt}))
            _refused(resources.post("/ng-rollout/r1/step", json={"attempt": attempt, "action": 0}))
        _refused(
            resources.post(
                "/ng-rollout/r1/step", content=b"{not json", headers={"content-type": "application/json"}
            )
        )


def test_forged_owners_and_cookies_are_4xx_or_served_never_500(servers: dict[str, WorkerServer]) -> None:
    server = servers["resources"]
    forged = ["w1.deadbeef", "\u00e9", "", ".", "w" * 5000, "w1." + "0" * 32, "..", "a.b.c"]
    for value in forged:
        for headers in (
            {OWNER_HEADER: value.encode("utf-8")},
            {"cookie": b"rc_worker_resources_blackjack=" + value.encode("utf-8") + b'; x="y'},
        ):
            with _client(server) as client:
                response = client.get("/ng-rollout/r1/state", params={"attempt": 0}, headers=headers)
                assert response.status_code < 500, (value, response.text)
                other = client.get("/no-such-route", headers=headers)
                assert 400 <= other.status_code < 500, (value, other.text)


def test_control_routes_through_the_frontend_refuse_bad_values_with_a_code(
    servers: dict[str, WorkerServer],
) -> None:
    with _client(servers["resources"]) as client:
        for op in ("prepare", "renew", "commit", "collect", "resume", "abort-restore"):
            for checkpoint_id in BAD_IDS:
                _refused(
                    client.post(
                        f"{CHECKPOINT_ROUTE_PREFIX}/{op}",
                        json={"checkpoint_id": checkpoint_id, "deadline_ts": time.time() + 60},
                        headers=AUTH,
                    )
                )
            for deadline in BAD_DEADLINES:
                _refused(
                    client.post(
                        f"{CHECKPOINT_ROUTE_PREFIX}/{op}",
                        json={"checkpoint_id": "ck-x", "deadline_ts": deadline},
                        headers=AUTH,
                    )
                )
        far = client.post(
            f"{CHECKPOINT_ROUTE_PREFIX}/prepare",
            json={"checkpoint_id": "ck-far", "deadline_ts": time.time() + 7200},
            headers=AUTH,
        )
        assert far.status_code == 422 and far.json()["error"]["code"] == "deadline_too_far", far.text
        _refused(
            client.post(
                f"{CHECKPOINT_ROUTE_PREFIX}/retire",
                json={
                    "executions": [{"rollout_id": "\u00e9", "attempt": -1}],
                    "deadline_ts": time.time() + 60,
                },
                headers=AUTH,
            )
        )
        _refused(
            client.post(f"{CHECKPOINT_ROUTE_PREFIX}/forget", json={"rollout_ids": ["a/b"]}, headers=AUTH)
        )
        status = client.get(f"{CHECKPOINT_ROUTE_PREFIX}/status", headers=AUTH).json()
        assert (status["phase"], status["accepting"], status["workers"]) == (
            "idle",
            True,
            2,
        )  # nothing changed


def test_seeded_random_requests_never_get_a_500(servers: dict[str, WorkerServer]) -> None:
    rng = random.Random(18)
    alphabet = string.ascii_letters + string.digits + "-_.~%/\u00e9\u4e2d "
    paths = ["result", "state", "step", "seed_session", "run", "close_session", ""]
    seen: dict[int, int] = {}
    for _ in range(150):
        server = servers[rng.choice(["resources", "agent"])]
        rollout_id = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        path = f"/ng-rollout/{rollout_id}/{rng.choice(paths)}"
        attempt: object = rng.choice([0, 1, -1, 2**33, "x", None, 1.5])
        with _client(server) as client:
            if rng.random() < 0.5:
                response = client.get(path, params={} if attempt is None else {"attempt": str(attempt)})
            else:
                response = client.post(
                    path, json={"attempt": attempt, "action": rng.choice([0, 1, 9, "hit"])}
                )
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (path, attempt, response.status_code, response.text)
        if response.status_code >= 400:
            assert response.json()["error"]["code"], response.text
    assert sum(seen.values()) == 150
