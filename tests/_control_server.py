"""A scripted participant behind the control routes, as a real process (killed by tests).

Usage: python _control_server.py KIND INSTANCE PORT STORE_DIR [BLOCKER]
The control token comes from ROLLOUT_CHECKPOINT_TOKEN. With BLOCKER, every prepare waits.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))

from _protocol_fakes import ScriptedParticipant, ex
from rollout_checkpoint.server import control_app
from rollout_checkpoint.store import LocalStore


def main() -> None:
    kind, instance, port, store_dir = sys.argv[1:5]
    participant = ScriptedParticipant(kind, instance)  # type: ignore[arg-type]
    participant.track(ex("r-remote"))
    if len(sys.argv) > 5:
        participant.set_blockers([sys.argv[5]])
    app = control_app(participant, token=os.environ["ROLLOUT_CHECKPOINT_TOKEN"], store=LocalStore(store_dir))
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
