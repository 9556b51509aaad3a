"""The embedded default's demo organization: created once, its key kept in a local file.

A key's secret is never stored in the database, so to show the demo key on every `make run`
it is kept in the run directory's demo.json (a developer's machine, never a deployment).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from console.apikeys import api_key_for_plaintext

DEMO_NAME = "demo"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--state", required=True, type=Path,
                            help="Where the demo organization's id and key are kept.")

    def handle(self, *args: Any, **options: Any) -> None:
        state: Path = options["state"]
        demo = self._load(state)
        if demo is None:
            out = io.StringIO()
            call_command("createorg", name=DEMO_NAME, stdout=out)
            demo = json.loads(out.getvalue())
            state.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(demo, handle)
        self.stdout.write(json.dumps(demo))

    def _load(self, state: Path) -> dict[str, str] | None:
        """The saved demo, if it still matches this database (it may have been reset)."""
        try:
            demo = json.loads(state.read_text())
        except (OSError, ValueError):
            return None
        key = api_key_for_plaintext(str(demo.get("api_key", "")))
        if key is None or str(key.organization_id) != demo.get("organization_id"):
            return None
        return {"organization_id": demo["organization_id"], "api_key": demo["api_key"]}

