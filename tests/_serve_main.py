"""Run a server from a build function, as a real process: python _serve_main.py BUILD STORE PORT WORKERS
[HEALTHCHECK_TIMEOUT_S].

The token comes from ROLLOUT_CHECKPOINT_TOKEN."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from rollout_checkpoint.server._serve import TOKEN_ENV, run_server

if __name__ == "__main__":
    build, store, port, workers = sys.argv[1:5]
    options = {"worker_healthcheck_timeout": int(sys.argv[5])} if len(sys.argv) > 5 else {}
    run_server(
        build,
        store=store,
        host="127.0.0.1",
        port=int(port),
        token=os.environ[TOKEN_ENV],
        workers=int(workers),
        **options,
    )
