from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


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


class AnexAdminConfig(AdminConfig):
    """django.contrib.admin with our site (allauth sign-in, ANEX_ADMIN_HOST); the site
    module is imported once the apps are loaded, as it needs their models."""

    default_site = "anex.admin_site.AnexAdminSite"
