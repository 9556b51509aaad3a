"""The chunk state machine (docs/dev/style.md rule 3): every write of Chunk.status and of a chunk's
lease is here, and nowhere else.

The moves a chunk can make are data (jobs.constants CHUNK_TRANSITIONS). Each is one
conditional UPDATE on the chunk's status, so a repeat, a duplicate message or the loser of
a race writes nothing and is told so (False); what belongs to the state entered is written
in that same UPDATE, whoever the caller:
- running: one more attempt, and the heartbeat started (a claim);
- pending: queued_at, as its message is sent again;
- done, failed, skipped: finished_at (done with its row counts and usage, recorded once).

The lease the recovery pass reads (jobs.services.recovery): queued_at dates a pending
chunk's message, heartbeat_at a running chunk's worker, attempts counts its claims. A move
the recovery pass makes is also conditional on the heartbeat it read, so a worker that beat
meanwhile keeps its chunk, and two passes at once act once.

Messages go through jobs.dispatch, after the move that makes them due; the chunk's job
(its region and model) names the queue. Which move to make, and what the job does next,
is jobs.services.running's.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from inference.constants import RowOutcome
from inference.pricing import Usage, usage_json
from jobs import dispatch
from jobs.constants import (
    CHUNK_SETTLED,
    CHUNK_TRANSITIONS,
    FLEX_PROMOTE_AFTER,
    TIER_RANK,
    ChunkStatus,
    JobStatus,
    Priority,
    dispatch_tier,
)
from jobs.models import Chunk, Job

logger = logging.getLogger(__name__)


def _sources(to: ChunkStatus) -> frozenset[ChunkStatus]:
    return frozenset(src for src, targets in CHUNK_TRANSITIONS.items() if to in targets)


def _entering(to: ChunkStatus) -> dict[str, Any]:
    """What the state entered writes beside the status."""
    now = timezone.now()
    if to == ChunkStatus.RUNNING:
        return {"attempts": F("attempts") + 1, "heartbeat_at": now,
                "started_at": Coalesce(F("started_at"), Value(now))}
    if to == ChunkStatus.PENDING:
        return {"queued_at": now}
    assert to in CHUNK_SETTLED
    return {"finished_at": now}


def chunks_transition(where: Q, *, to: ChunkStatus,
                      sources: frozenset[ChunkStatus] | None = None, **fields: Any) -> int:
    """Move the chunks `where` picks whose status is one the table allows to `to`
    (narrowed to `sources` when given), with the state's own fields and the other
    `fields`, in one UPDATE. Returns how many moved; the rest are left as they are."""
    allowed = _sources(to)
    if sources is not None:
        if not sources <= allowed:
            raise ValueError(f"{sorted(sources - allowed)} -> {to} is not a chunk transition")
        allowed = sources
    return Chunk.objects.filter(where, status__in=allowed).update(status=to, **_entering(to),
                                                                  **fields)


def chunk_transition(*, chunk_id: uuid.UUID | str, to: ChunkStatus,
                     sources: frozenset[ChunkStatus] | None = None, **fields: Any) -> bool:
    """One chunk's move; False, and nothing written, when the table does not allow it from
    the status it has now (a repeat included)."""
    return chunks_transition(Q(pk=chunk_id), to=to, sources=sources, **fields) == 1


def _reaped(chunk: Chunk) -> Q:
    # Still the beat the recovery pass read as stale (null: never beaten).
    return Q(pk=chunk.pk, heartbeat_at=chunk.heartbeat_at)


_RUNNING = frozenset({ChunkStatus.RUNNING})


# --- a worker's moves -----------------------------------------------------------------


def chunk_claim(*, chunk_id: uuid.UUID | str) -> bool:
    """pending -> running: a worker takes the chunk, once (a duplicate or redelivered
    message finds it taken); its attempts count this claim, its heartbeat starts."""
    return chunk_transition(chunk_id=chunk_id, to=ChunkStatus.RUNNING)


def chunk_heartbeat(*, chunk_id: uuid.UUID | str) -> bool:
    """The running chunk's worker is alive (jobs.services.running, every heartbeat)."""
    return Chunk.objects.filter(pk=chunk_id, status=ChunkStatus.RUNNING).update(
        heartbeat_at=timezone.now()) == 1


def chunk_complete(*, chunk_id: uuid.UUID | str, counts: dict[RowOutcome, int],
                   usage: Usage, error_codes: dict[str, int] | None = None) -> bool:
    """running -> done, its rows' counts by outcome (and its failed rows' by error,
    jobs.services.outcomes.error_codes_count) and their usage recorded with the move: a
    redelivered chunk's results overwrite, its counts are never added twice."""
    return chunk_transition(
        chunk_id=chunk_id, to=ChunkStatus.DONE, sources=_RUNNING,
        success_rows=counts.get(RowOutcome.SUCCESS, 0),
        error_rows=counts.get(RowOutcome.ERROR, 0),
        truncated_rows=counts.get(RowOutcome.TRUNCATED, 0),
        format_error_rows=counts.get(RowOutcome.FORMAT_ERROR, 0), usage=usage_json(usage),
        error_codes=error_codes or {})


def chunk_fail(*, chunk: Chunk, reaped: bool = False) -> bool:
    """running -> failed: its attempts ran out, or running it would pass the job's hold.
    `reaped`: the recovery pass, for a dead worker's chunk past its attempts."""
    where = _reaped(chunk) if reaped else Q(pk=chunk.pk)
    return chunks_transition(where, to=ChunkStatus.FAILED, sources=_RUNNING) == 1


def chunk_skip(*, chunk_id: uuid.UUID | str) -> bool:
    """running -> skipped: claimed after its job stopped (cancelled): nothing starts."""
    return chunk_transition(chunk_id=chunk_id, to=ChunkStatus.SKIPPED, sources=_RUNNING)


def chunks_skip_pending(*, job_id: uuid.UUID) -> int:
    """pending -> skipped, every unstarted chunk of a job cancelled with no work in flight
    (jobs.services.lifecycle.job_cancel, under the job's lock)."""
    return chunks_transition(Q(job_id=job_id), to=ChunkStatus.SKIPPED,
                             sources=frozenset({ChunkStatus.PENDING}))


def chunk_requeue(*, chunk: Chunk, delay_ms: int | None = None, reaped: bool = False,
                  deferred: bool = False, engine_failed: bool = False) -> bool:
    """running -> pending, and its message sent again (after `delay_ms`): its engine call
    failed and it has attempts left, or (`reaped`) its worker died and the recovery pass
    takes it back. The claim that runs it next counts one more attempt. `deferred`: the
    failure was the infrastructure's or the engine's, so this run's attempt is given back
    and counted as a deferral instead (jobs.failures.FailureClass). `engine_failed`: an
    engine that had been answering failed on this run (Chunk.engine_failures)."""
    where = _reaped(chunk) if reaped else Q(pk=chunk.pk)
    fields: dict[str, Any] = {"attempts": F("attempts") - 1,
                              "deferrals": F("deferrals") + 1} if deferred else {}
    if engine_failed:
        fields["engine_failures"] = F("engine_failures") + 1
    if chunks_transition(where, to=ChunkStatus.PENDING, sources=_RUNNING, **fields) != 1:
        return False
    _send(chunk, delay_ms=delay_ms)
    return True


# --- sending ------------------------------------------------------------------------------


def _send(chunk: Chunk, *, delay_ms: int | None = None) -> None:
    job = chunk.job
    dispatch.chunk_send(chunk_id=chunk.pk, region=job.data_residency, model=job.model,
                        delay_ms=delay_ms, flex=job.dispatch_tier == Priority.FLEX)


def chunk_send(*, chunk: Chunk, delay_ms: int | None = None) -> bool:
    """Send a pending chunk's message (again), noting when: the message went with a dead
    worker (the recovery pass), or a worker whose breaker is open hands it back unclaimed
    (after `delay_ms`). Only while it is pending and its last send is the one read, so two
    passes at once send it once."""
    if Chunk.objects.filter(pk=chunk.pk, status=ChunkStatus.PENDING,
                            queued_at=chunk.queued_at).update(
            queued_at=timezone.now()) != 1:
        return False
    _send(chunk, delay_ms=delay_ms)
    return True


# --- fair dispatch ------------------------------------------------------------------------
#
# A job's chunks are planned at its start, all pending, but sent to the model's run queue
# only as room frees (docs/dev/decisions/2026-12-01-fair-dispatch.md): a pending chunk with no
# queued_at is waiting its turn, not lost. At most ANEX_DISPATCH_IN_FLIGHT chunks of one model in
# one region are sent or running at once, at most ANEX_DISPATCH_JOB_IN_FLIGHT of them one
# job's, and each free place goes to the organization with the fewest chunks in flight on
# that model (then its job with the fewest, then the job approved first). The database is
# the only record: a release is one transaction under a lock per model and region, so two
# dispatchers at once send nothing twice, and one that dies before its messages leave
# leaves chunks whose queued_at the recovery pass finds stale and sends again.
#
# Urgency tiers (docs/dev/decisions/2026-12-06-urgency-tiers.md): places go in strict tier
# order, priority then standard then flex, the fair share above holding inside each tier
# (an organization's chunks in flight of that tier counted).
# Flex runs only on capacity nothing else wants: its chunks are sent only when no priority
# or standard chunk is left waiting, into the model's flex queue, whose actor a worker runs
# after every other chunk it holds; the flex chunks in flight hold no place a priority or
# standard chunk needs (their room is counted without them); and a worker that takes a flex
# chunk while a priority or standard chunk of the model is pending hands it back unclaimed
# (chunk_unsend: jobs.services.running.chunk_run). So a standard chunk waits for a flex one
# at most until one running chunk ends.

# Sent (or taken and lost with a worker: the recovery pass resends it) or being run.
IN_FLIGHT = Q(status=ChunkStatus.RUNNING) | Q(status=ChunkStatus.PENDING,
                                              queued_at__isnull=False)
WAITING = Q(status=ChunkStatus.PENDING, queued_at__isnull=True)
FLEX_RANK = TIER_RANK[Priority.FLEX]


@dataclass
class Waiting:
    """A running job of the model with chunks waiting to be sent; `rank` its dispatch
    tier's (jobs.constants.TIER_RANK: lower goes first; standard's by default)."""

    job_id: uuid.UUID
    organization_id: uuid.UUID
    approved_at: datetime | None
    waiting: int
    in_flight: int
    rank: int = TIER_RANK[Priority.STANDARD]


def fair_picks(jobs: list[Waiting], organizations: Counter[uuid.UUID], room: int,
               job_cap: int) -> list[uuid.UUID]:
    """Which job each of `room` free places goes to, in order: the highest tier (lowest
    rank) with a chunk waiting, and in it the organization with the fewest chunks in
    flight (`organizations`, every one's, updated as places are given), then its job with
    the fewest, then the one approved first; a job at `job_cap`, or with nothing left
    waiting, takes no more."""
    picks: list[uuid.UUID] = []
    for _ in range(room):
        open_jobs = [job for job in jobs if job.waiting and job.in_flight < job_cap]
        if not open_jobs:
            break
        job = min(open_jobs, key=lambda job: (
            job.rank, organizations[job.organization_id], job.in_flight,
            job.approved_at or timezone.now(), str(job.job_id)))
        job.waiting -= 1
        job.in_flight += 1
        organizations[job.organization_id] += 1
        picks.append(job.job_id)
    return picks


def tier_picks(jobs: list[Waiting], organizations: dict[int, Counter[uuid.UUID]], *,
               firm_in_flight: int, flex_in_flight: int, cap: int,
               job_cap: int) -> list[uuid.UUID]:
    """The places given in one release, tier by tier (lowest rank first), each tier's
    shared out by fair_picks over its own organizations' chunks in flight
    (`organizations[rank]`): priority and standard chunks (the firm tiers) up to `cap` of
    theirs in flight, the flex chunks in flight not counted; then, only if no firm chunk
    that could be sent is left waiting, flex chunks into what is left of `cap` with every
    chunk in flight counted."""
    picks: list[uuid.UUID] = []
    firm = [job for job in jobs if job.rank < FLEX_RANK]
    for rank in sorted({job.rank for job in firm}):
        picks += fair_picks([job for job in firm if job.rank == rank],
                            organizations.setdefault(rank, Counter()),
                            max(cap - firm_in_flight - len(picks), 0), job_cap)
    if any(job.waiting and job.in_flight < job_cap for job in firm):
        return picks
    flex = [job for job in jobs if job.rank >= FLEX_RANK]
    room = cap - firm_in_flight - len(picks) - flex_in_flight
    return picks + fair_picks(flex, organizations.setdefault(FLEX_RANK, Counter()),
                              max(room, 0), job_cap)


def _release_lock(region: str, model: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                       [f"anex.chunks_release:{region}:{model}"])


def chunks_release(*, region: str, model: str) -> list[uuid.UUID]:
    """Send the model's waiting chunks in this region as far as there is room, in tier
    order and fairly across organizations inside a tier; the ids sent."""
    with transaction.atomic():
        _release_lock(region, model)
        # A cancelling job's running chunks hold their places until they end.
        model_chunks = Chunk.objects.filter(
            job__data_residency=region, job__model=model,
            job__status__in=[JobStatus.IN_PROGRESS, JobStatus.CANCELLING])
        # Each tier's chunks in flight by organization: the fair share inside a tier.
        flying: dict[int, Counter[uuid.UUID]] = {}
        firm_in_flight = flex_in_flight = 0
        for organization_id, priority, promoted_at, count in model_chunks.filter(
                IN_FLIGHT).values_list("job__organization_id", "job__priority",
                                       "job__promoted_at").annotate(n=Count("pk")).values_list(
                "job__organization_id", "job__priority", "job__promoted_at", "n"):
            tier = dispatch_tier(priority, promoted_at)
            flying.setdefault(TIER_RANK[tier], Counter())[organization_id] += count
            if tier == Priority.FLEX:
                flex_in_flight += count
            else:
                firm_in_flight += count
        cap = settings.ANEX_DISPATCH_IN_FLIGHT
        if cap - firm_in_flight <= 0:
            return []
        jobs = [Waiting(job_id=row["pk"], organization_id=row["organization_id"],
                        approved_at=row["approved_at"], waiting=row["waiting"],
                        in_flight=row["in_flight"],
                        rank=TIER_RANK[dispatch_tier(row["priority"], row["promoted_at"])])
                for row in Job.objects.filter(
                    status=JobStatus.IN_PROGRESS, data_residency=region, model=model).annotate(
                    waiting=Count("chunks", filter=Q(chunks__status=ChunkStatus.PENDING,
                                                     chunks__queued_at__isnull=True)),
                    in_flight=Count("chunks", filter=Q(chunks__status=ChunkStatus.RUNNING) | Q(
                        chunks__status=ChunkStatus.PENDING,
                        chunks__queued_at__isnull=False))).filter(waiting__gt=0).values(
                    "pk", "organization_id", "approved_at", "waiting", "in_flight",
                    "priority", "promoted_at")]
        flex_jobs = {job.job_id for job in jobs if job.rank >= FLEX_RANK}
        picks = Counter(tier_picks(jobs, flying, firm_in_flight=firm_in_flight,
                                   flex_in_flight=flex_in_flight, cap=cap,
                                   job_cap=settings.ANEX_DISPATCH_JOB_IN_FLIGHT))
        released: list[tuple[uuid.UUID, bool]] = []
        now = timezone.now()
        for job_id, count in picks.items():
            # Each job's next chunks in row order, so its results come back front first.
            ids = list(Chunk.objects.filter(WAITING, job_id=job_id).order_by("index")
                       .values_list("pk", flat=True)[:count])
            Chunk.objects.filter(WAITING, pk__in=ids).update(queued_at=now)
            released.extend((chunk_id, job_id in flex_jobs) for chunk_id in ids)
    # Sent once their queued_at is committed (a caller holds no transaction of its own: a
    # start, a chunk's end, the recovery pass). A dispatcher that dies here leaves them
    # sent-looking but unsent: the recovery pass sends them again once that goes stale.
    for chunk_id, flex in released:
        dispatch.chunk_send(chunk_id=chunk_id, region=region, model=model, flex=flex)
    return [chunk_id for chunk_id, _ in released]


# Pending chunks of the firm tiers (priority, standard, or a promoted flex job's).
FIRM_PENDING = Q(status=ChunkStatus.PENDING, job__status=JobStatus.IN_PROGRESS) & (
    ~Q(job__priority=Priority.FLEX) | Q(job__promoted_at__isnull=False))


def firm_pending(*, region: str, model: str) -> bool:
    """Whether a priority or standard chunk of the model waits in this region: to be sent,
    or sent and not yet started (in a queue, or held by a worker whose threads are busy)."""
    return Chunk.objects.filter(FIRM_PENDING, job__data_residency=region,
                                job__model=model).exists()


def chunk_unsend(*, chunk: Chunk) -> bool:
    """A sent flex chunk back to waiting its turn (queued_at cleared), unclaimed: a worker
    took its message while priority or standard work waited (flex runs only on capacity
    nothing else wants). The dispatcher sends it again when no firm chunk waits. Only
    while it is pending and its last send is the one read."""
    return Chunk.objects.filter(pk=chunk.pk, status=ChunkStatus.PENDING,
                                queued_at=chunk.queued_at).update(queued_at=None) == 1


def jobs_flex_promote() -> int:
    """Promote every flex job still running FLEX_PROMOTE_AFTER after its approval: its
    chunks are dispatched as standard from then on (Job.promoted_at; its price stays
    flex's), and its model's waiting chunks released at once. How many were promoted."""
    now = timezone.now()
    due = Job.objects.filter(priority=Priority.FLEX, promoted_at__isnull=True,
                             status__in=[JobStatus.IN_PROGRESS, JobStatus.CANCELLING],
                             approved_at__lte=now - FLEX_PROMOTE_AFTER)
    promoted = list(due.values_list("pk", "data_residency", "model"))
    if not promoted:
        return 0
    count = Job.objects.filter(pk__in=[pk for pk, _, _ in promoted],
                               promoted_at__isnull=True).update(promoted_at=now)
    for pk, _, _ in promoted:
        logger.info("job %s: flex, unfinished %s after approval, promoted to standard "
                    "dispatch", pk, FLEX_PROMOTE_AFTER)
    for region, model in {(region, model) for _, region, model in promoted}:
        chunks_release(region=region, model=model)
    return count


def chunks_waiting_models() -> list[tuple[str, str]]:
    """The (region, model) pairs with chunks waiting to be sent: what the recovery pass
    releases, in case no chunk's end did (a start or a dispatcher that died)."""
    return list(Job.objects.filter(status=JobStatus.IN_PROGRESS).filter(
        Exists(Chunk.objects.filter(WAITING, job=OuterRef("pk")))).values_list(
        "data_residency", "model").distinct())


def chunks_skip_waiting(*, job_id: uuid.UUID) -> int:
    """pending -> skipped, a cancelling job's chunks that were never sent: no message of
    theirs will come to skip them."""
    return chunks_transition(Q(job_id=job_id) & WAITING, to=ChunkStatus.SKIPPED,
                             sources=frozenset({ChunkStatus.PENDING}))
