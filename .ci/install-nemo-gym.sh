#!/usr/bin/env bash
# Install NeMo Gym 0.7.0 into a Python 3.11/3.12 environment with the smallest set of packages
# its blackjack / wordle / example_session_state_mgmt resources servers, its gymnasium agent and
# its model-server base need to serve (not the ~1.5 GB closure its wheel declares).
#
#   .ci/install-nemo-gym.sh PYTHON      e.g. .ci/install-nemo-gym.sh .venv/bin/python
#
# Gym 0.7.0 declares Python >= 3.13.14, but its code imports and runs on 3.11. A plain
# `pip install --ignore-requires-python nemo-gym` fails on 3.11 (the flag applies to every
# dependency and pip picks a scipy source build), so the wheel goes in with --no-deps and its
# serving dependencies are installed normally. Why the odd ones: `wandb` (imported at module
# level by nemo_gym.reward_profile), `ray` (nemo_gym.global_config reads its installed version;
# the SDK's servers never start ray; Gym's `ng_run` starts a local cluster), `anthropic` (the model-server base converts Messages requests),
# `yappi`, `pydot`, `pandas`, `scipy` (imported at module level), `devtools` and `psutil` (Gym's
# CLI, `ng_run` / `ng_collect_rollouts` / `gym`, imports them). On Python >= 3.13.14 use
# `pip install 'rollout-checkpoint[nemo-gym]'` instead.
set -euo pipefail
PY="${1:-python3}"
GYM_VERSION="0.7.0"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps "nemo-gym==${GYM_VERSION}" --python-version 3.13.14 \
    --only-binary=:all: -d "$tmp"
"$PY" -m pip install -q --no-deps --ignore-requires-python "$tmp"/nemo_gym-"${GYM_VERSION}"-py3-none-any.whl
"$PY" -m pip install -q \
    "openai==2.44.0" "anthropic<=0.109.2" fastapi uvicorn httptools itsdangerous aiohttp anyio \
    omegaconf hydra-core orjson requests rich pyyaml typing_extensions pydantic \
    ray yappi pydot pandas scipy wandb devtools psutil
"$PY" -c "import resources_servers.blackjack.app, responses_api_agents.gymnasium_agent.app, nemo_gym.base_responses_api_model, nemo_gym.cli.main, nemo_gym.cli.env" \
    || { echo "NeMo Gym ${GYM_VERSION} installed but does not import" >&2; exit 1; }
