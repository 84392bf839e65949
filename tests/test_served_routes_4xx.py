"""No 500 on any served route (issue 18, item 5): the reference servers' ``/ng-rollout`` routes
answer an invalid identifier or value with a 4xx and a stable code, and their OpenAPI document
declares the id pattern and the ranges the server enforces."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from rollout_checkpoint.demo._servers import build_agent, build_model, build_resources
from rollout_checkpoint.server import WorkerContext
from rollout_checkpoint.store import MemoryStore

BAD_IDS = ["\u00e9t\u00e9", "a..b", "-x", "x" * 200, "a%2Fb", "%00"]
BAD_ATTEMPTS = ["-1", "x", "1.5", str(2**40)]


@pytest.fixture()
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, TestClient]]:
    monkeypatch.setenv("ROLLOUT_CHECKPOINT_DEMO_ENV", "blackjack")
    context = WorkerContext("w0", MemoryStore("routes-4xx"), 1)
    served = {
        "agent": build_agent(context),
        "model": build_model(context),
        "resources": build_resources(context),
    }
    with (
        TestClient(served["agent"].app, raise_server_exceptions=False) as agent,
        TestClient(served["model"].app, raise_server_exceptions=False) as model,
        TestClient(served["resources"].app, raise_server_exceptions=False) as resources,
    ):
        yield {"agent": agent, "model": model, "resources": resources}


def _refused(response: object) -> None:
    status = response.status_code  # type: ignore[attr-defined]
    assert 400 <= status < 500, (status, response.text)  # type: ignore[attr-defined]
    assert response.json()["error"]["code"]  # type: ignore[attr-defined]


def test_bad_ids_and_attempts_are_4xx_with_a_code(clients: dict[str, TestClient]) -> None:
    for rollout_id in BAD_IDS:
        _refused(clients["agent"].get(f"/ng-rollout/{rollout_id}/result", params={"attempt": 3517}))
        _refused(clients["model"].post(f"/ng-rollout/{rollout_id}/finish", json={"attempt": 0}))
        _refused(clients["resources"].get(f"/ng-rollout/{rollout_id}/state", params={"attempt": 0}))
        _refused(
            clients["resources"].post(f"/ng-rollout/{rollout_id}/step", json={"attempt": 0, "action": 0})
        )
    for attempt in BAD_ATTEMPTS:
        _refused(clients["agent"].get("/ng-rollout/r1/result", params={"attempt": attempt}))
        _refused(clients["resources"].get("/ng-rollout/r1/state", params={"attempt": attempt}))
    _refused(clients["model"].post("/ng-rollout/r1/finish", json={"attempt": -1}))


def test_a_step_after_the_episode_ended_is_a_4xx(clients: dict[str, TestClient]) -> None:
    resources = clients["resources"]
    assert resources.post("/ng-rollout/r1/seed_session", json={"attempt": 0, "seed": 1}).status_code == 200
    for _ in range(50):  # stand until the episode is over, then once more
        response = resources.post("/ng-rollout/r1/step", json={"attempt": 0, "action": 0})
        if response.status_code != 200:
            break
        if response.json()["done"]:
            response = resources.post("/ng-rollout/r1/step", json={"attempt": 0, "action": 0})
            break
    _refused(response)
    assert "episode is over" in response.json()["error"]["detail"]


def test_openapi_declares_the_id_pattern_and_attempt_range(clients: dict[str, TestClient]) -> None:
    document = clients["agent"].get("/openapi.json").json()
    parameters = {
        p["name"]: p["schema"]
        for p in document["paths"]["/ng-rollout/{rollout_id}/result"]["get"]["parameters"]
    }
    assert parameters["rollout_id"]["pattern"].startswith("^[A-Za-z0-9]")
    assert parameters["rollout_id"]["maxLength"] == 128
    assert parameters["attempt"]["minimum"] == 0
