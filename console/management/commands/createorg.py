"""Create an organization and one API key; print {"organization_id", "api_key"} as JSON,
with "webhook_secret" added when --webhook-url sets the organization's endpoint."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from billing.services import credits_grant
from console.actors import Actor
from console.selectors import organization_webhook_secret
from console.services import api_key_create, organization_create
from jobs.services.webhook_endpoint import organization_webhook_set


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="The organization's name.")
        parser.add_argument("--eu", action="store_true", help="Turn on EU data routing.")
        parser.add_argument("--auto-approve", action="store_true",
                            help="Approve every estimate at cost_ready.")
        parser.add_argument("--progress-webhooks", action="store_true",
                            help="Also send a progress webhook at 25, 50 and 75 %% of a "
                                 "running job's rows.")
        parser.add_argument("--credits-cents", type=int, default=0, metavar="N",
                            help="Grant N credits (cents) at creation, beside the free grant.")
        parser.add_argument("--webhook-url", metavar="URL", default="",
                            help="The https endpoint every job event is POSTed to; its "
                                 "signing secret is printed as webhook_secret.")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        if not name:
            raise CommandError("--name must not be empty.")
        if options["credits_cents"] < 0:
            raise CommandError("--credits-cents must not be negative.")
        actor = Actor(system="createorg")
        with transaction.atomic():
            organization = organization_create(
                name=name, actor=actor, eu_data_routing=options["eu"],
                auto_approve=options["auto_approve"],
                progress_webhooks=options["progress_webhooks"],
            )
            _key, plaintext = api_key_create(organization=organization, actor=actor,
                                             name="created by createorg")
            if options["credits_cents"]:
                credits_grant(organization=organization, cents=options["credits_cents"],
                              reason="createorg --credits-cents", actor=actor)
            printed = {"organization_id": str(organization.pk), "api_key": plaintext}
            if options["webhook_url"]:
                try:
                    organization_webhook_set(organization=organization, actor=actor,
                                             url=options["webhook_url"])
                except ValidationError as exc:
                    # Raised inside the transaction: nothing is created.
                    raise CommandError(f"--webhook-url: {exc.messages[0]}") from None
                printed["webhook_secret"] = organization_webhook_secret(
                    organization=organization) or ""
        self.stdout.write(json.dumps(printed))
