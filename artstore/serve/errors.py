"""The one way a request of `artstore serve` is refused: a status, a code and one line."""

from __future__ import annotations

from starlette.responses import JSONResponse


class Refused(Exception):
    """A request refused with `status` before anything was written."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    """The JSON error every refusal answers (the OpenAI clients read `error.message`)."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
