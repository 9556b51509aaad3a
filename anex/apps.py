from django.apps import AppConfig


class AnexConfig(AppConfig):
    name = "anex"
    verbose_name = "anex"

    def ready(self) -> None:
        # Actors bind to the broker that is global when they are declared, so it must be
        # set before any app module declares one (this app is listed first).
        from anex.broker import broker_setup

        broker_setup()
        # Registers the API key scheme with drf-spectacular.
        import anex.api.schema  # noqa: F401
