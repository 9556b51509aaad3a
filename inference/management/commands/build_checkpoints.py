"""Build the embedded default's local checkpoints (tiny-qwen3, all-MiniLM-L6-v2,
tiny-vl-embedding) under --dest (default: $ANEX_RUN_DIR/checkpoints, else .run/checkpoints),
offline and idempotent. Prints {"directories": {name: dir}, "ANEX_CHECKPOINTS": value} as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.checkpoints import (
    anex_checkpoints_value,
    checkpoints_build,
    checkpoints_dest_default,
)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dest", type=Path, default=None, metavar="DIR",
                            help=f"Where to build (default: {checkpoints_dest_default()}).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            directories = checkpoints_build(dest=options["dest"])
        except RuntimeError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(json.dumps({
            "directories": {name: str(path) for name, path in directories.items()},
            "ANEX_CHECKPOINTS": anex_checkpoints_value(directories),
        }))
