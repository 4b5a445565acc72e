"""What the config store (`toolreg up`, `toolreg store export|import`) reads from the environment: which backend
keeps it, and how much history its change feed keeps."""

from __future__ import annotations

from dataclasses import dataclass

from toolservice_base.errors import SettingsError
from toolservice_base.variables import FromEnv, setting, text, whole

from .changes import ChangeWindow


@dataclass(frozen=True)
class StoreSettings(FromEnv):
    """The store's settings; `backend` None: not chosen (`--store`, else `sqlite`)."""

    backend: str | None = setting(
        "TOOLREG_STORE", text, None, "`sqlite` (the default) or `pulsar` (replicated on Apache Pulsar)"
    )
    change_window_keys: int = setting(
        "TOOLREG_CHANGE_WINDOW_KEYS",
        whole(),
        ChangeWindow.keys,
        "changed keys the change feed remembers; a reader further behind reads its tools whole once",
    )
    change_window_bytes: int = setting(
        "TOOLREG_CHANGE_WINDOW_BYTES",
        whole(),
        ChangeWindow.bytes,
        "about how many bytes of key names the change feed keeps, whichever bound is hit first",
    )

    def __post_init__(self) -> None:
        if min(self.change_window_keys, self.change_window_bytes) < 1:
            keys, size = self.env("change_window_keys"), self.env("change_window_bytes")
            raise SettingsError(f"{keys} and {size} must be at least 1")

    @property
    def window(self) -> ChangeWindow:
        return ChangeWindow(self.change_window_keys, self.change_window_bytes)
