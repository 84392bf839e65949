"""Ray for the integration tests: skip (printing why) only where Ray cannot be imported; with
``ROLLOUT_CHECKPOINT_REQUIRE_RAY=1`` (``.ci/run`` sets it) a missing Ray fails instead.

:func:`local_cluster` is the one shared simulated cluster (a head that runs nothing plus worker
nodes, all on 127.0.0.1), its files (``~/.ray``, session folders) in a temporary folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

REQUIRE_ENV = "ROLLOUT_CHECKPOINT_REQUIRE_RAY"
HERE = Path(__file__).parent
TOKEN = "tok-ray-cluster-secret"
LOOPBACK = "127.0.0.1"


def require_ray() -> None:
    """Call at module level before importing anything that needs Ray (Ray reads
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when imported: ``0`` keeps its node address on
    127.0.0.1 instead of the host's interface address)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
        import ray.cluster_utils  # noqa: F401
    except Exception as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise
        pytest.skip(
            f"Ray cannot be imported here ({type(exc).__name__}: {exc}); "
            "install it with `pip install -e '.[ray]'`",
            allow_module_level=True,
        )


@contextlib.contextmanager
def local_cluster(
    worker_nodes: int = 3, last_node_resources: Mapping[str, float] | None = None
) -> Iterator[Any]:
    """A ``ray.cluster_utils.Cluster`` of a head (no CPUs: nothing is placed on it) and
    ``worker_nodes`` nodes of one CPU, connected; the last one also advertises
    ``last_node_resources`` (custom resources, as a node labelled for environments would); Ray's
    files in a temporary folder, Ray's node address kept on 127.0.0.1, the control token in the
    nodes' environment. Shut down after."""
    import ray
    from ray.cluster_utils import Cluster

    home = Path(tempfile.mkdtemp(prefix="rc-ray-"))
    env = {
        "HOME": str(home),  # Ray 2.60 writes ~/.ray/auth_token
        "RAY_TMPDIR": str(home / "t"),  # and its session folders under $RAY_TMPDIR/ray
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keeps the node address on loopback
        "RAY_USAGE_STATS_ENABLED": "0",
        "ROLLOUT_CHECKPOINT_TOKEN": TOKEN,  # the nodes' environment: the hosts read it there
        # the hosts import the tests' build functions (tests/_ray_build.py)
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p),
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        # Ray read the variable when first imported (another test module may have imported it)
        from ray._private import ray_constants

        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        temp = str(home / "t" / "ray")
        os.makedirs(temp)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "temp_dir": temp,
                "include_dashboard": False,
                "node_ip_address": LOOPBACK,
            },
        )
        try:
            for index in range(worker_nodes):
                custom = dict(last_node_resources or {}) if index == worker_nodes - 1 else {}
                cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK, resources=custom)
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            with contextlib.suppress(Exception):
                ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(home, ignore_errors=True)
