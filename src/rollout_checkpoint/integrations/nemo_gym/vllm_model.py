"""Gym's own ``vllm_model`` server, unchanged, checkpointed as the policy model.

Gym's ``vllm_model`` takes another road to its backend than ``openai_model``: it converts a
Responses request to chat completions itself (asking for ``token_id:<n>`` logprobs and, with
``request_prompt_and_generation_token_ids``, vLLM's ``prompt_token_ids`` / ``token_ids``), then
converts the reply back, with the token ids on the Responses output items when
``return_token_id_information: true``. :class:`CheckpointedVLLMModel` is that server (a
subclass, Gym's code computing every reply) with the same participant as
:class:`~.openai_model.CheckpointedOpenAIModel`: call identity from Gym's capture key and the
call id (``x-rc-call-id``, else ``turn-<n>`` from the conversation), lineage, and token receipts
from the reply's token ids. Its ``responses`` runs its own ``chat_completions``: that is one model
call, delivered once.
"""

from __future__ import annotations

from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

from .openai_model import CheckpointedModelMixin, PolicyKnobs

__all__ = ["CheckpointedVLLMModel", "CheckpointedVLLMModelConfig"]


class CheckpointedVLLMModelConfig(VLLMModelConfig, PolicyKnobs):
    pass


class CheckpointedVLLMModel(CheckpointedModelMixin, VLLMModel):
    """See the module docstring."""

    config: CheckpointedVLLMModelConfig


if __name__ == "__main__":
    CheckpointedVLLMModel.run_webserver()
