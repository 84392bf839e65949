"""Where a Ray node reads the control token.

Actor creation arguments and ``runtime_env`` (its ``env_vars`` too) are stored cluster-wide in
Ray's GCS and shown by its state API and dashboard, so a secret must never travel in them. A
:class:`TokenSource` names only where the token is on each node: a file (mounted by the
orchestrator, e.g. a Kubernetes secret volume) or an environment variable the node's Ray
processes inherit (set before ``ray start``). It is read in the actor's process, on its node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError, InvalidArgumentError
from ...server import MIN_TOKEN_LENGTH, TOKEN_ENV

__all__ = ["TokenMissingError", "TokenSource"]


class TokenMissingError(CheckpointError):
    """The token source names a file or variable that holds no usable token on this node."""

    code = "token_missing"


@dataclass(frozen=True)
class TokenSource:
    """``file``: a path on every node (its first line is the token); else ``env``: the name of
    an environment variable (default ``ROLLOUT_CHECKPOINT_TOKEN``). Holds no secret: safe to
    pass as an actor argument."""

    file: str | None = None
    env: str = TOKEN_ENV

    def __post_init__(self) -> None:
        if not self.env:
            raise InvalidArgumentError("TokenSource.env must name an environment variable")

    def read(self) -> str:
        """The token, read here (in the actor's process, on its node)."""
        if self.file is not None:
            try:
                text = Path(self.file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise TokenMissingError(
                    f"cannot read the token file {self.file} on this node: {exc.strerror}", file=self.file
                ) from None
            token = text.splitlines()[0].strip() if text else ""
            where = f"the token file {self.file}"
        else:
            token = os.environ.get(self.env, "").strip()
            where = f"the environment variable {self.env}"
        if len(token) < MIN_TOKEN_LENGTH:
            raise TokenMissingError(
                f"{where} holds no control token on this node (at least {MIN_TOKEN_LENGTH} characters)",
                source=self.file or self.env,
            )
        return token
