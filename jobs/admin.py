"""Jobs in the admin, for support staff: the operations page (the fleet at a glance:
queues, workers, running jobs, the oldest waiting chunk, recent failures), and the jobs,
their chunks and inputs, read-only, a job with its JobEvent history. Nothing is written
here: a job changes only through jobs.services. Secrets and customer text stay out: an
input's source URL (its presigned credentials) and callback secret, and a job's refused
rows (input_errors, which quote rows) are not shown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from console.admin import ReadOnlyAdmin, ReadOnlyInline
from jobs.failures import FailureClass, failures_by_class
from jobs.models import Chunk, Input, Job, JobEvent
from jobs.selectors import (
    chunk_oldest_waiting,
    deliveries_given_up_recent,
    job_progress_of,
    jobs_failed_recent,
    jobs_running_by_model,
    queue_depths,
    tier_figures,
    workers_seen,
)

# The permission the operations page needs: who may view jobs may see the fleet's work.
OPERATIONS_PERMISSION = "jobs.view_job"


class HidingReadOnlyAdmin(ReadOnlyAdmin):
    """ReadOnlyAdmin showing every field but the `hidden` ones."""

    hidden: tuple[str, ...] = ()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        shown = [name for name in super().get_readonly_fields(request, obj)
                 if name not in self.hidden]
        return shown + list(self.readonly_extra)

    readonly_extra: tuple[str, ...] = ()

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return list(self.hidden)


class JobEventInline(ReadOnlyInline):
    model = JobEvent
    fields = readonly_fields = ("at", "from_status", "to_status", "actor_label")
    show_change_link = False
    verbose_name_plural = "history (JobEvent)"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A job's history is part of the job: who may view the job sees it.
        return request.user.has_perm("jobs.view_job")


@admin.register(Job)
class JobAdmin(HidingReadOnlyAdmin):
    list_display = ("id", "organization", "model", "status", "row_count", "created_at",
                    "approved_at", "finished_at")
    list_filter = ("status", "model", "data_residency", "task_type")
    search_fields = ("id", "organization__name")
    list_select_related = ("organization",)
    show_full_result_count = False
    hidden = ("input_errors",)
    readonly_extra = ("progress", "chunks_link")
    inlines = (JobEventInline,)
    # What support reads first at the top; the job's options and internals below.
    fieldsets = (
        (None, {"fields": ("id", "organization", "input", "model", "task_type", "format",
                           "data_residency", "status", "substate", "progress",
                           "chunks_link")}),
        ("Times", {"fields": ("created_at", "cost_ready_at", "approved_at", "finished_at",
                              "data_expires_at", "data_deleted_at")}),
        ("Rows and cost", {"fields": ("row_count", "success_rows", "error_rows",
                                      "format_error_rows", "truncated_rows", "pending_rows",
                                      "partial", "est_input_tok", "est_output_tok",
                                      "est_processing_seconds", "est_cost_cents",
                                      "cost_cents", "failure_code", "failure_reason")}),
        ("Who", {"fields": ("created_by_key", "approved_by_key", "approved_by_user",
                            "parent")}),
        ("Options", {"classes": ("collapse",), "fields": (
            "max_output_tokens_requested", "max_output_tokens", "max_tokens_alias",
            "reasoning", "reasoning_budget_requested", "reasoning_budget",
            "reasoning_effort", "response_format", "dimensions", "video_fps", "row_model",
            "rerun_include", "approve_at_estimate", "collect_row_errors")}),
        ("Internals", {"classes": ("collapse",), "fields": (
            "leased_at", "claimed", "attempts", "est_usage", "sample_tokens", "sampled_at",
            "progress_sent", "data_delete_requested", "cancel_requested", "result_key")}),
    )

    @admin.display(description="Progress (rows, rate, ETA)")
    def progress(self, obj: Job) -> str:
        progress = job_progress_of(job=obj)
        rate = "-" if progress.rows_per_second is None else f"{progress.rows_per_second} rows/s"
        return (f"{progress.done_rows} of {progress.total_rows or '-'} rows, {rate}, "
                f"ETA {_duration(progress.eta_seconds)}")

    @admin.display(description="Chunks")
    def chunks_link(self, obj: Job) -> str:
        url = reverse("admin:jobs_chunk_changelist") + f"?job__id__exact={obj.pk}"
        return format_html('<a href="{}">{} chunks</a>', url, obj.chunks.count())


@admin.register(Chunk)
class ChunkAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "status", "row_count", "attempts", "deferrals", "queued_at",
                    "heartbeat_at", "finished_at")
    list_filter = ("status",)
    search_fields = ("job__id",)
    list_select_related = ("job",)
    show_full_result_count = False


@admin.register(Input)
class InputAdmin(HidingReadOnlyAdmin):
    list_display = ("id", "organization", "status", "format", "data_residency", "size_bytes",
                    "created_at", "ready_at")
    list_filter = ("status", "format", "data_residency")
    search_fields = ("id", "organization__name")
    list_select_related = ("organization",)
    show_full_result_count = False
    hidden = ("source_url", "callback_secret_encrypted")


def _age(since: Any) -> str:
    """How long ago, for a person: "3 s", "12 min", "5 h 2 min", "2 d 4 h"."""
    seconds = max(0, int((timezone.now() - since).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} h {minutes % 60} min"
    return f"{hours // 24} d {hours % 24} h"


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    return _age(timezone.now() - timedelta(seconds=seconds))


def _whole(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds)


FAILURE_MEANS = {
    FailureClass.INFRASTRUCTURE: "storage, the database or the broker: waited out, no "
                                 "attempt spent",
    FailureClass.ENGINE: "the worker's engine: handed to another worker, the breaker counts it",
    FailureClass.UNEXPECTED: "the chunk's own rows, or a bug: one of its attempts spent",
}


def operations_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The operations page (the admin site's /admin/operations/), for staff who may view
    jobs."""
    if not request.user.has_perm(OPERATIONS_PERMISSION):
        raise PermissionDenied
    depths = queue_depths()
    workers = workers_seen()
    consumed = {queue for worker in workers if worker.alive for queue in worker.heartbeat.queues}
    queues = None if depths is None else [
        depth for depth in depths
        if depth.ready or depth.delayed or "." not in depth.name or depth.name in consumed]
    running = jobs_running_by_model()
    oldest = chunk_oldest_waiting()
    chunk_failures = failures_by_class()
    context = {
        **site.each_context(request),
        "title": "Operations",
        "queues": queues,
        "workers": [{"seen": worker, "age": _age(worker.heartbeat.beat_at),
                     "up": _age(worker.heartbeat.started_at)} for worker in workers],
        "running": [{"model": group, "eta": _duration(group.eta_seconds),
                     "jobs": [{"item": item, "eta": _duration(item.progress.eta_seconds)}
                              for item in group.jobs]} for group in running],
        "oldest": oldest and {"waiting": oldest, "age": _age(oldest.since)},
        "chunk_failures": None if chunk_failures is None else [
            (name, count, FAILURE_MEANS[FailureClass(name)])
            for name, count in chunk_failures.items()],
        "jobs_failed": sorted(jobs_failed_recent().items()),
        "tiers": [{"figures": item, "mean": _duration(_whole(item.wait_mean_seconds)),
                   "longest": _duration(_whole(item.wait_max_seconds))}
                  for item in tier_figures()],
        "deliveries_given_up": deliveries_given_up_recent(),
        "now": timezone.now(),
    }
    return TemplateResponse(request, "admin/operations.html", context)

