"""GitHub's error answers: one exception carrying the status, message and `errors` list that
GitHub would send, raised anywhere in the stand-in and turned into JSON by the gateway."""

from __future__ import annotations

from typing import Any

DOCS = "https://docs.github.com/rest"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(f"{status} {message}")
        self.status, self.message, self.errors, self.headers = status, message, errors, headers or {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message, "documentation_url": DOCS, "status": str(self.status)}
        if self.errors is not None:
            out["errors"] = self.errors
        return out


def not_found() -> ApiError:
    return ApiError(404, "Not Found")


def unprocessable(message: str) -> ApiError:
    """A 422 whose message says it all (GitHub's git data and merge answers look like this)."""
    return ApiError(422, message)


def invalid(resource: str, field: str, code: str = "invalid", message: str | None = None) -> ApiError:
    """GitHub's "Validation Failed" 422 with one entry in `errors`."""
    error = {"resource": resource, "field": field, "code": code}
    if message:
        error["message"] = message
    return ApiError(422, "Validation Failed", [error])
