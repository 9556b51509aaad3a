"""The geometry of the console's server-rendered SVG charts (issue 44;
docs/dev/decisions/2026-12-06-the-job-as-a-picture.md): numbers in, shapes out, drawn by
the templates. No script draws them and no `style=` colours them (the Content-Security-
Policy allows neither inline): shapes carry classes that static/css/site.css colours.

Every chart is a viewBox of CHART_WIDTH wide stretched to the page's width
(preserveAspectRatio="none", strokes kept thin by `vector-effect: non-scaling-stroke`), so
it fills a phone's screen as it fills a desktop's; its words (axis ends, legend, summary)
are HTML beside it, which keep their size at any width, and each chart has a table or a
sentence that says in words what it draws."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from billing.selectors import JobMoney
from jobs.selectors import Progress
from jobs.services.outcomes import Outcomes, TimePoint

CHART_WIDTH = 600
ROWS_HEIGHT = 200
BAR_HEIGHT = 20
SPEND_HEIGHT = 160
PAD = 2
# Distinct classes for an error's (or a model's) colour, then the rest share the last.
ERROR_CLASSES = 6
MODEL_CLASSES = 8


def _n(value: float) -> str:
    """A coordinate as the SVG reads it: one decimal, no trailing zero."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


# --- rows over time ---------------------------------------------------------------------


def rows_chart(*, points: list[TimePoint], progress: Progress, start: datetime | None,
               now: datetime, running: bool) -> dict[str, Any] | None:
    """The job's rows over time: the rows finished (green) and failed (red, stacked on
    them) by each chunk's finish, a step at each; while it runs, the ETA as a dashed line
    from now to the last row at the measured pace (progress.eta_seconds, the one ETA, as
    GET /jobs/{id}/progress tells it). None before approval: nothing has run."""
    if start is None:
        return None
    done = points[-1].finished + points[-1].failed if points else 0
    total = max(progress.total_rows or 0, done, 1)
    eta_end = (now + timedelta(seconds=progress.eta_seconds)
               if running and progress.eta_seconds else None)
    end = max(eta_end or now, now)
    span = max((end - start).total_seconds(), 1.0)

    def x(at: datetime) -> float:
        return CHART_WIDTH * max((at - start).total_seconds(), 0) / span

    def y(rows: int) -> float:
        return ROWS_HEIGHT - (ROWS_HEIGHT - PAD) * rows / total

    # Steps: flat until a chunk's finish, then up to the rows counted by it.
    finished_edge = [(0.0, y(0))]
    done_edge = [(0.0, y(0))]
    for point in points:
        finished_edge += [(x(point.at), finished_edge[-1][1]), (x(point.at), y(point.finished))]
        done_edge += [(x(point.at), done_edge[-1][1]),
                      (x(point.at), y(point.finished + point.failed))]
    finished_edge.append((x(now), finished_edge[-1][1]))
    done_edge.append((x(now), done_edge[-1][1]))

    def path(edge: list[tuple[float, float]]) -> str:
        return " ".join(f"{'M' if n == 0 else 'L'}{_n(px)} {_n(py)}"
                        for n, (px, py) in enumerate(edge))

    baseline = y(0)
    finished_area = (path(finished_edge) + f" L{_n(x(now))} {_n(baseline)} Z")
    failed_area = (path(done_edge) + " " + " ".join(
        f"L{_n(px)} {_n(py)}" for px, py in reversed(finished_edge)) + " Z")
    last = points[-1] if points else None
    return {
        "width": CHART_WIDTH, "height": ROWS_HEIGHT, "baseline": _n(baseline),
        "finished_area": finished_area, "failed_area": failed_area,
        "done_line": path(done_edge), "total_y": _n(y(total)),
        "now_x": _n(x(now)) if eta_end else None,
        "eta": ({"x1": _n(x(now)), "y1": _n(y(done)), "x2": _n(x(eta_end)),
                 "y2": _n(y(total)), "at": eta_end} if eta_end else None),
        "total": total, "done": done, "start": start, "end": end, "now": now,
        "finished": last.finished if last else 0, "failed": last.failed if last else 0,
        "points": points,
    }


# --- the outcome breakdown ----------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    label: str
    rows: int
    css: str
    key: str = ""  # an error's key: its rows have a page of their own
    x: str = "0"
    width: str = "0"


def outcomes_chart(outcomes: Outcomes) -> dict[str, Any]:
    """One bar of the job's rows, a segment per outcome and per error, in the order the
    table beside it lists them (it is the bar's legend and its words)."""
    parts = [Segment("Succeeded", outcomes.succeeded, "seg-ok"),
             Segment("Truncated (stopped at the output cap)", outcomes.truncated, "seg-warn")]
    parts += [Segment(error.key, error.rows, f"seg-e{min(n, ERROR_CLASSES - 1)}", key=error.key)
              for n, error in enumerate(outcomes.errors)]
    parts += [Segment("Failed (before errors were counted by code)", outcomes.unrecorded,
                      f"seg-e{ERROR_CLASSES - 1}"),
              Segment("Not run (stopped before them)", outcomes.not_run, "seg-skip"),
              Segment("Waiting to run", outcomes.waiting, "seg-wait")]
    total = max(outcomes.total, sum(part.rows for part in parts), 1)
    drawn, at = [], 0.0
    for part in parts:
        if not part.rows:
            continue
        width = CHART_WIDTH * part.rows / total
        drawn.append(Segment(part.label, part.rows, part.css, part.key, _n(at), _n(width)))
        at += width
    return {"width": CHART_WIDTH, "height": BAR_HEIGHT, "segments": drawn,
            "total": outcomes.total, "failed": outcomes.failed}


# --- cost so far against the hold ---------------------------------------------------------


def cost_chart(*, cost_so_far: int, money: JobMoney, minimum: int) -> dict[str, Any] | None:
    """The job's cost against what approval held: while it runs, what it would be charged
    were it to end now; once settled, the charge and the release. None when nothing was
    held (not approved yet, or an estimate of 0). `minimum`: the model's minimum job price,
    which a small job's cost is from its first row (the caption says so)."""
    if not money.held:
        return None
    spent = money.charged if money.settled else cost_so_far
    spent = min(spent, money.held)
    return {"width": CHART_WIDTH, "height": BAR_HEIGHT, "held": money.held, "spent": spent,
            "spent_width": _n(CHART_WIDTH * spent / money.held), "settled": money.settled,
            "released": money.released, "minimum": minimum,
            "at_minimum": bool(spent) and spent == minimum,
            "percent": round(100 * spent / money.held)}


# --- spend per day by model ---------------------------------------------------------------


def spend_chart(days: list[date], spend: dict[tuple[date, str], int]) -> dict[str, Any]:
    """Bars of credits charged per day, each stacked by model (the busiest models first,
    past MODEL_CLASSES - 1 the rest as one), scaled to the busiest day."""
    by_model: dict[str, int] = {}
    for (_day, model), cents in spend.items():
        by_model[model] = by_model.get(model, 0) + cents
    ranked = sorted(by_model, key=lambda model: (-by_model[model], model))
    shown = ranked if len(ranked) <= MODEL_CLASSES else ranked[:MODEL_CLASSES - 1]
    rest = [model for model in ranked if model not in shown]
    legend = [{"model": model, "css": f"m{n}", "spent": by_model[model]}
              for n, model in enumerate(shown)]
    if rest:
        legend.append({"model": f"{len(rest)} other models", "css": f"m{MODEL_CLASSES - 1}",
                       "spent": sum(by_model[model] for model in rest)})
    css = {entry["model"]: entry["css"] for entry in legend}
    daily = {day: sum(cents for (when, _m), cents in spend.items() if when == day)
             for day in days}
    top = max(daily.values(), default=0) or 1
    slot = CHART_WIDTH / max(len(days), 1)
    bars, table = [], []
    for n, day in enumerate(days):
        stack: list[dict[str, Any]] = []
        floor = float(SPEND_HEIGHT - PAD)
        models = sorted(((model, cents) for (when, model), cents in spend.items()
                         if when == day and cents), key=lambda item: ranked.index(item[0]))
        for model, cents in models:
            height = (SPEND_HEIGHT - PAD) * cents / top
            floor -= height
            stack.append({"model": model, "cents": cents, "y": _n(floor),
                          "height": _n(height),
                          "css": css.get(model, f"m{MODEL_CLASSES - 1}")})
        bars.append({"day": day, "x": _n(n * slot + 1), "width": _n(max(slot - 2, 1)),
                     "stack": stack, "spent": daily[day]})
        if daily[day]:
            table.append({"day": day, "spent": daily[day], "models": models})
    return {"bars": bars, "legend": legend, "table": table, "width": CHART_WIDTH,
            "height": SPEND_HEIGHT, "baseline": SPEND_HEIGHT - PAD, "top": top,
            "total": sum(daily.values()), "first": days[0], "last": days[-1]}
