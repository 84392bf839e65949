"""A checkpointed NeMo Gym server (rollout-checkpoint's component root).

The same file serves every checkpointed resources server, agent and model server: the class
and the checkpoint settings come from this server's own Gym config (``checkpoint_class:
module:Class``, ``checkpoint_spec``, ``checkpoint_store``, ``checkpoint_token_file``); see the
SDK's docs/nemo-gym.md.
"""

from rollout_checkpoint.integrations.nemo_gym.component import main

if __name__ == "__main__":
    raise SystemExit(main())
