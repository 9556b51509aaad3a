"""Who performs an action: an API key, a signed-in user, or the system itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from console.models import ApiKey


@dataclass(frozen=True)
class Actor:
    key: ApiKey | None = None
    user: User | None = None
    system: str | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.key, self.user, self.system)) != 1:
            raise ValueError("an actor is exactly one of a key, a user or the system")

    @property
    def label(self) -> str:
        if self.key is not None:
            return f"key {self.key.display}"
        if self.user is not None:
            return f"user {self.user.get_username()}"
        return f"system: {self.system}"
