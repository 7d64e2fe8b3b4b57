"""What the fake API server's store hands out besides objects: the apiserver's error (`Status`), a watch
event, and timestamps in the apiserver's format."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


class ApiError(Exception):
    """An error the apiserver returns as a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, dict(details or {})

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    key: tuple[str, str]
    namespace: str
    type: str
    obj: Obj
    previous: Obj | None = None  # the object before a MODIFIED (selector-filtered watches need it)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
