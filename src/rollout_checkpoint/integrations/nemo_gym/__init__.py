"""Checkpoint real NeMo Gym servers (``pip install 'rollout-checkpoint[nemo-gym]'``).

* :func:`attach` / :func:`checkpointed` - a Gym resources server becomes a checkpoint
  participant without changing Gym (sessions keyed by the rollout identity Gym carries plus its
  session cookie; built-in :class:`SessionSpec` s for ``blackjack``, ``wordle``,
  ``example_session_state_mgmt``, ``example_multi_turn_gymnasium``, ``workplace_assistant``
  (DataFrames as Parquet: :class:`WorkplaceAssistantCodec`) and ``indirect_prompt_injection``;
  every other server restart-only);
* :class:`CheckpointedGymnasiumAgent` - Gym's gymnasium agent, reporting a boundary per step and
  resuming a restored rollout at it;
* :class:`CheckpointedSimpleAgent` - Gym's ``simple_agent``, reporting a boundary after each
  model call and its tool calls and resuming a restored rollout at it;
* :class:`ScriptedResponsesModel` - a deterministic Responses-API model server checkpointed as
  the policy model;
* :class:`CheckpointedOpenAIModel` / :class:`CheckpointedVLLMModel` - Gym's own ``openai_model`` /
  ``vllm_model`` server, unchanged, checkpointed as the policy model (call identity derived from
  what Gym's agents send);
* :func:`start_backend` - the SDK's deterministic OpenAI-compatible backend (also
  ``python -m rollout_checkpoint.integrations.nemo_gym.backend``) for tests and examples.
* :class:`GymDeployment` - checkpointed Gym servers as processes from a Gym config (start,
  start paused, kill, supervise, recover); :func:`component_root` - the Gym component root
  (``ng_run --search-dir``) whose generic ``app.py`` serves ``checkpoint_class: module:Class``;
  :class:`GymLauncher` - the SDK launcher: restarts only a dead server, paused;
* :class:`CheckpointingCollector` - Gym's rollout collection, checkpointed and resumable
  (``rollout-checkpoint gym collect``; the ``rollout_collection_driver``
  ``rollout_checkpoint.integrations.nemo_gym.collect:collect``).

Gym is imported only when one of these names is first used (module ``__getattr__``), so
``import rollout_checkpoint.integrations.nemo_gym`` works without Gym installed; using a name
then raises :class:`GymNotInstalledError` with the install recipe.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BLACKJACK",
    "BUILTIN_SPECS",
    "BackendHandle",
    "BlackjackDeployment",
    "COUNTER",
    "CheckpointedGymnasiumAgent",
    "CheckpointedOpenAIModel",
    "CheckpointedSimpleAgent",
    "CheckpointedVLLMModel",
    "CheckpointingCollector",
    "CollectSettings",
    "GYM_VERSION_TESTED",
    "GymDeployment",
    "GymLauncher",
    "GymNotInstalledError",
    "GymResourcesParticipant",
    "GymServer",
    "GymServers",
    "INDIRECT_PROMPT_INJECTION",
    "MULTI_TURN",
    "RolloutIdentityRequiredError",
    "ScenarioResult",
    "ScriptedResponsesModel",
    "SessionSpec",
    "WORDLE",
    "WORKPLACE_ASSISTANT",
    "WorkplaceAssistantCodec",
    "attach",
    "checkpointed",
    "component_root",
    "free_port",
    "gym_servers",
    "is_checkpointed",
    "layered_server_venvs",
    "load_gym_config",
    "reference_run",
    "run_scenario",
    "spec_for",
    "start_backend",
]

_WHERE = {
    "BLACKJACK": ".specs",
    "BUILTIN_SPECS": ".specs",
    "COUNTER": ".specs",
    "GYM_VERSION_TESTED": ".specs",
    "WORDLE": ".specs",
    "INDIRECT_PROMPT_INJECTION": ".specs",
    "MULTI_TURN": ".specs",
    "WORKPLACE_ASSISTANT": ".specs",
    "WorkplaceAssistantCodec": ".workplace",
    "is_checkpointed": ".resources",
    "SessionSpec": ".specs",
    "spec_for": ".specs",
    "RolloutIdentityRequiredError": ".identity",
    "GymResourcesParticipant": ".resources",
    "attach": ".resources",
    "checkpointed": ".resources",
    "CheckpointedGymnasiumAgent": ".agent",
    "CheckpointedSimpleAgent": ".simple_agent",
    "ScriptedResponsesModel": ".model",
    "CheckpointedOpenAIModel": ".openai_model",
    "CheckpointedVLLMModel": ".vllm_model",
    "BackendHandle": ".backend",
    "start_backend": ".backend",
    "CheckpointingCollector": ".collect",
    "CollectSettings": ".collect",
    "GymDeployment": ".deployment",
    "GymServer": ".deployment",
    "free_port": ".deployment",
    "gym_servers": ".deployment",
    "component_root": ".component",
    "layered_server_venvs": ".component",
    "reference_run": ".scenario",
    "GymLauncher": ".launcher",
    "load_gym_config": ".launcher",
    "BlackjackDeployment": ".blackjack",
    "GymServers": ".blackjack",
    "ScenarioResult": ".scenario",
    "run_scenario": ".scenario",
}

INSTALL_HINT = (
    "NeMo Gym is not installed: on Python >= 3.13.14 `pip install 'rollout-checkpoint[nemo-gym]'`; "
    "on 3.11/3.12 see docs/nemo-gym.md (install Gym's wheel with --no-deps --ignore-requires-python "
    "plus its serving dependencies)"
)


class GymNotInstalledError(ImportError):
    """The integration was used where ``nemo-gym`` cannot be imported."""


def __getattr__(name: str) -> Any:
    if name == "GymNotInstalledError":
        return GymNotInstalledError
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("nemo_gym", "resources_servers", "responses_api_agents"):
            raise GymNotInstalledError(f"{INSTALL_HINT} ({exc})") from exc
        raise
    globals()[name] = value
    return value
