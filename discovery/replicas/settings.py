"""What the replicas (the store's, and a registry group's members) read from the environment: their group key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolservice_base.variables import FromEnv, path, setting


@dataclass(frozen=True)
class ReplicaSettings(FromEnv):
    """The replicas' settings."""

    group_key_file: Path | None = setting(
        "TOOLREG_GROUP_KEY",
        path,
        None,
        "the replicas' group key file (`toolreg group-key new`): every record they write on the state topics is"
        " signed with it, and one that is not is refused; None: the broker's permissions alone protect them",
    )
