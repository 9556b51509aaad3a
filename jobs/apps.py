from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        # A worker records its heartbeat (jobs.services.workers); in any other process the
        # middleware is never booted and does nothing.
        import dramatiq

        from jobs.services.workers import WorkerHeartbeatMiddleware

        dramatiq.get_broker().add_middleware(WorkerHeartbeatMiddleware())
