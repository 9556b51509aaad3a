"""gunicorn's access log with secrets masked (anex.logmask): `make run` starts gunicorn with
`--logger-class anex.accesslog.MaskedAccessLogger`."""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger

from anex.logmask import secrets_masked


class MaskedAccessLogger(Logger):
    def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
        return {name: secrets_masked(value) if isinstance(value, str) else value
                for name, value in super().atoms(resp, req, environ, request_time).items()}
