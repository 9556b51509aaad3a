from django.urls import path

from console.views.billing import billing_page
from console.views.home import console_home
from console.views.jobs import (
    job_approve_action,
    job_cancel_action,
    job_delete_data_action,
    job_error_rows_page,
    job_list_page,
    job_new_page,
    job_page,
    job_result_download,
    job_upload_target,
)
from console.views.keys import key_revoke_page, keys_page
from console.views.organization import (
    audit_page,
    invitation_page,
    invitation_pending_page,
    members_page,
    organization_switch,
    settings_page,
)

urlpatterns = [
    path("", console_home, name="console"),
    path("jobs", job_list_page, name="console-jobs"),
    path("jobs/new", job_new_page, name="console-job-new"),
    path("jobs/upload", job_upload_target, name="console-job-upload"),
    path("jobs/<uuid:job_id>", job_page, name="console-job"),
    path("jobs/<uuid:job_id>/approve", job_approve_action, name="console-job-approve"),
    path("jobs/<uuid:job_id>/cancel", job_cancel_action, name="console-job-cancel"),
    path("jobs/<uuid:job_id>/delete-data", job_delete_data_action,
         name="console-job-delete-data"),
    path("jobs/<uuid:job_id>/result", job_result_download, name="console-job-result"),
    path("jobs/<uuid:job_id>/errors", job_error_rows_page, name="console-job-errors"),
    path("keys", keys_page, name="console-keys"),
    path("keys/<uuid:key_id>/revoke", key_revoke_page, name="console-key-revoke"),
    path("settings", settings_page, name="console-settings"),
    path("members", members_page, name="console-members"),
    path("invitations/<str:token>", invitation_page, name="console-invitation"),
    path("invitation", invitation_pending_page, name="console-invitation-pending"),
    path("organization", organization_switch, name="console-organization-switch"),
    path("audit", audit_page, name="console-audit"),
    path("billing", billing_page, name="console-billing"),
]
