from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from console.views.base import Console, console_page


@require_GET
@console_page()
def console_home(request: HttpRequest, console: Console) -> HttpResponse:
    return redirect("console-jobs")
