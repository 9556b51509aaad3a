from __future__ import annotations

import atexit
import fcntl
import gc
import itertools
import json
import logging
import os
import ssl
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import trustme
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import ApiKey, Organization
from tests.dbtemplate import template_start, template_take
from tests.dispatched import dispatch_catch
from tests.factories import api_key_make, organization_make
from tests.launch import Running, make_run_launched
from tests.servers import LocalServer

# The engine fixtures (session-scoped, built or loaded only when a test takes them), for
# every tier: the session's `make run` below takes the checkpoints too.
pytest_plugins = ["tests.engine_fixtures"]

# The tiers are folders, by what a file's tests need: tests/unit nothing, tests/db
# PostgreSQL or Redis, tests/engine a real vLLM engine, tests/e2e the product's own
# processes and engines together, tests/browser chromium. The fast tier (`make test-fast`,
# `pytest --fast`) is unit and db, on xdist workers, without vLLM or torch; a test there
# that takes a real engine through its fixtures is marked engine, and runs with the engine
# tier. A test marked fuzz (Schemathesis' run of every phase over the whole API: some 1,500
# generated requests, 20 CPU-seconds on 2 cores, a sixth of the fast tier's Python CPU)
# runs with the slow tiers too; what it found stays in the fast tier, pinned as plain tests.
# `make test` (and CI) runs the fast tier, then the rest:
# -m "engine or e2e or browser or fuzz".
# The test run caches its bytecode whatever PYTHONDONTWRITEBYTECODE says (it is set on
# some machines, this one among them): without a cache every xdist worker, the template's
# migrate and each subprocess a test starts compile the project and the test modules again
# (pytest's assertion rewriting too), a third of the fast tier's CPU on 2 cores here. The
# controller has imported the apps by now; its workers and subprocesses inherit this.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# A test process's heap is large (Django, DRF, Hypothesis, each test module) and lives
# to the end: at Python's thresholds (700, 10, 10) a fast-tier worker made about 2,700
# collections, 13 of them full, some 4 s of its CPU. These thresholds make about 30. Only
# the test processes: the product's own keep Python's defaults.
gc.set_threshold(50_000, 20, 20)

TESTS = Path(__file__).resolve().parent
SLOW_TIERS = ("engine", "e2e", "browser")
SLOW_MARKERS = (*SLOW_TIERS, "fuzz")
ENGINE_FIXTURES = {"checkpoint_dirs", "chat_engine", "embedding_engine", "decision_engine",
                   "vl_engine", "audio_engine", "vl_embedding_engine"}
# The fast tier's xdist workers, when --fast is given without -n: its tests wait on
# PostgreSQL, Redis, local servers and deadlines, so twice the two cores pays. On this
# 2-core machine, quiet, 1,654 tests: 82 s with 3 workers, 69 s with 4, 67 s with 6 (whose
# tests each run slower, sharing the cores).
FAST_WORKERS = 4


# What the fast tier's slower tests took (setup, call and teardown), in seconds, by node id:
# written by `pytest --fast --store-durations`, read to start them first, spread over the
# workers (heaviest_first below). A test missing from it counts as quick; a stale entry
# only moves a test.
DURATIONS = TESTS / "durations.json"
DURATIONS_KEPT = 0.3  # seconds: the quicker tests are left where collection put them


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="only the unit and db tiers, on xdist workers (no vLLM needed)")
    parser.addoption("--store-durations", action="store_true",
                     help=f"write the tests taking {DURATIONS_KEPT} s or more to "
                          f"{DURATIONS.relative_to(TESTS.parent)}")


def tier_of(path: Path) -> str | None:
    """The tier folder a test file sits in (None for a file at tests/ itself)."""
    relative = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return relative[0] if len(relative) > 1 else None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Before xdist reads -n: --fast alone runs on FAST_WORKERS workers (-n 0: in one
    # process), each taking the next test as it finishes one (worksteal: a few tests wait
    # seconds on deadlines, the rest take milliseconds).
    if (not config.getoption("--fast") or not config.pluginmanager.has_plugin("xdist")
            or config.getoption("usepdb") or os.environ.get("PYTEST_XDIST_WORKER")):
        return
    if config.option.numprocesses is None:
        config.option.numprocesses = FAST_WORKERS
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "worksteal"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """Each xdist worker its own Redis database, set in its environment before Django reads
    its settings (its broker, cache and subprocesses all follow REDIS_URL): the tests flush
    their broker. pytest-django gives each its own test database (test_NAME_gw0, ...),
    made from the template migrated here meanwhile, or by an earlier run (tests/dbtemplate.py)."""
    from django.conf import settings

    template = template_start(settings.DATABASES["default"],
                              Path(os.environ.get("ANEX_RUN_DIR", ".run")))
    base = os.environ.get("REDIS_URL")
    for spec in specs:
        spec.env.update(template)
        if base:  # (the settings refuse to start without one anyway)
            spec.env["REDIS_URL"] = redis_url_for_worker(
                base, int(spec.id.removeprefix("gw")), len(specs))


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's, with commits that do not wait for the disk (every connection to
    the test database from here on, the processes a test starts too: no test outlives a
    crash of its database); and ending first every other session still open on the test
    database: a thread a test started (a race, a live server's request) may leave its
    connection open, and PostgreSQL's DROP DATABASE then waits 5 s for it before giving
    up, at the end of a worker's last test."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            name = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
        connection.close()
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """An xdist worker's test database is created from the controller's migrated template
    (tests/dbtemplate.py)."""
    from django.conf import settings

    template_take(settings.DATABASES["default"])


def redis_url_for_worker(url: str, index: int, workers: int) -> str:
    """REDIS_URL's database number plus the worker's index (redis://host/1 gives workers
    1, 2, ...; a unix:// socket takes ?db=); past Redis's 16 databases is a usage error."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "unix":
        base = int(query.get("db") or 0)
    else:
        base = int(parts.path.lstrip("/") or 0)
    if base + workers - 1 > 15:
        raise pytest.UsageError(
            f"{workers} xdist workers need Redis databases {base} to {base + workers - 1} "
            "(from REDIS_URL's), and Redis has 0 to 15: run fewer workers (-n) or point "
            "REDIS_URL at a lower database")
    if parts.scheme == "unix":
        return f"{url.partition('?')[0]}?{urlencode({**query, 'db': base + index})}"
    return urlunsplit(parts._replace(path=f"/{base + index}"))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The engine, end-to-end and browser tiers import vLLM, torch or Playwright at the top:
    # under --fast they are not even collected.
    if config.getoption("--fast") and collection_path.parent == TESTS \
            and collection_path.name in SLOW_TIERS:
        return True
    return None


# The session fixtures that start something heavy: the tests taking one run on one worker.
SHARED_FIXTURE_GROUPS = {"make_run": "make_run", "realtime_server": "realtime_server",
                         "chat_engine": "engines", "embedding_engine": "engines",
                         "decision_engine": "engines", "vl_engine": "engines",
                         "audio_engine": "engines", "vl_embedding_engine": "engines"}


def xdist_group_of(item: pytest.Item) -> str:
    """The slow tiers run on two xdist workers (`--dist loadgroup`, Makefile): the tests that
    share a session's heavy fixture (the one `make run`, the engines loaded in process,
    the realtime engine server) on one worker, so each starts once; the others by their
    module (a module's fixtures start once too)."""
    fixtures = getattr(item, "fixturenames", ())
    return next((SHARED_FIXTURE_GROUPS[name] for name in SHARED_FIXTURE_GROUPS
                 if name in fixtures), item.path.stem)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    fast = config.getoption("--fast")
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        tier = tier_of(item.path)
        if tier in ("e2e", "browser"):
            item.add_marker(tier)
        takes_engine = bool(ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())))
        if tier == "engine" or (takes_engine and tier != "e2e"):
            item.add_marker(pytest.mark.engine)
        slow = any(item.get_closest_marker(marker) for marker in SLOW_MARKERS)
        (deselected if fast and slow else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    # The session's `make run` (make_run below) is up from its first test to the session's
    # end: its tests go last, together, in their order, and the one that stops it last.
    items[:] = sorted(kept, key=lambda item: ("make_run" in getattr(item, "fixturenames", ()),
                                              item.get_closest_marker("stops_make_run")
                                              is not None))
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers > 1 and config.getvalue("dist") == "no" and getattr(config.option, "loadgroup",
                                                                  False):
        # xdist 3.8 names a test's group by appending it to the test's id (which loadgroup
        # reads, "id@group"), through an attribute pytest 9 no longer has: done here.
        from _pytest.nodeid import coerce_node_id

        for item in items:
            item._id = coerce_node_id(f"{item.nodeid}@{xdist_group_of(item)}")  # type: ignore[attr-defined]
    elif workers > 1 and DURATIONS.exists():
        items[:] = heaviest_first(items, json.loads(DURATIONS.read_text()), workers)


def heaviest_first(items: list[pytest.Item], durations: dict[str, float],
                   workers: int) -> list[pytest.Item]:
    """The order that lets `workers` xdist workers end together: worksteal hands each worker
    one contiguous block of the collection (of len // workers, then len // the workers left,
    ...), and a worker that runs out steals from the end of another's. So the slow tests
    (by their recorded durations) are dealt out first, each to the block with the least
    recorded time so far, and start their blocks; the quick ones fill the blocks up, in
    collection order. Left as it was, a 12 s test drawn last kept a worker busy 10 s after
    the others had ended. Every worker computes the same order (xdist requires it)."""
    slow = sorted((item for item in items if durations.get(item.nodeid, 0) >= DURATIONS_KEPT),
                  key=lambda item: -durations[item.nodeid])
    quick = iter([item for item in items if durations.get(item.nodeid, 0) < DURATIONS_KEPT])
    sizes, left = [], len(items)
    for index in range(workers):
        sizes.append(left // (workers - index))
        left -= sizes[-1]
    blocks: list[list[pytest.Item]] = [[] for _ in sizes]
    loads = [0.0] * workers
    for item in slow:
        open_blocks = [index for index in range(workers) if len(blocks[index]) < sizes[index]]
        index = min(open_blocks, key=lambda index: loads[index])
        blocks[index].append(item)
        loads[index] += durations[item.nodeid]
    for index, block in enumerate(blocks):
        block.extend(itertools.islice(quick, sizes[index] - len(block)))
    return [item for block in blocks for item in block]


class DurationsStored:
    """--store-durations: each test's setup, call and teardown summed, kept when slow."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        kept = {nodeid: round(seconds, 1) for nodeid, seconds in sorted(self.seconds.items())
                if seconds >= DURATIONS_KEPT}
        DURATIONS.write_text(json.dumps(kept, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationsStored(), "durations-stored")
    if config.getoption("--fast") and hasattr(config, "workerinput"):
        atexit.register(_worker_exit, config)


def _worker_exit(config: pytest.Config) -> None:
    """A fast-tier worker's last step: its results are with the controller by now (xdist
    sends them as each test ends, and the session's end before the worker's gateway
    closes), so its process ends here instead of tearing its heap down module by module
    (Django, DRF, Hypothesis, every test module), which took 2-3 s after its last test
    while the controller waited for it. Registered at configure, it runs after the atexit
    handlers registered since (atexit runs them last first); logging's, registered before
    it, is run here. Only the fast tier: no engine runs in its workers."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(getattr(config, "_anex_exitstatus", 0)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._anex_exitstatus = exitstatus  # type: ignore[attr-defined]


def pytest_collection_finish(session: pytest.Session) -> None:
    # The local checkpoints are built (tiny-qwen3 trained: a minute alone, several on a busy
    # machine) once per run directory, by the first test to take them, within its timeout.
    # Built here instead, before any test starts, when any will take them.
    if session.config.option.collectonly:
        return
    if any("checkpoint_dirs" in getattr(item, "fixturenames", ()) for item in session.items):
        from inference.checkpoints import checkpoints_build, checkpoints_dest_default

        checkpoints_build(dest=checkpoints_dest_default())


# The tables a DELETE alone cannot empty: those with triggers of their own (the append-only
# audit log and ledger refuse DELETE, anex/db.py).
GUARDED_TABLES = "SELECT DISTINCT tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal"


# Rows the flush's post_migrate signal writes back as they were (every model's content type
# and permissions): kept, rather than deleted and inserted again after each such test.
KEPT_TABLES = {"django_content_type", "auth_permission"}
STORAGE_NUMBERS = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def flush_by_delete() -> Iterator[None]:
    """A transactional test (django_db(transaction=True), live_server) ends by emptying
    every table. Django does it with one TRUNCATE of them all, which costs PostgreSQL half
    a second here (new files for some thirty tables and their indexes) for the handful of
    rows a test wrote. A DELETE per table, in the one transaction Django runs them in (its
    foreign keys are checked at the commit), takes milliseconds. The tables whose own
    triggers refuse a DELETE are emptied with those triggers off, in that transaction, as a
    TRUNCATE (which fires no DELETE trigger) would, without its 16 ms of new files."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate_all = DatabaseOperations.sql_flush

    def sql_flush(self: DatabaseOperations, style: Any, tables: Sequence[str], *,
                  reset_sequences: bool = False, allow_cascade: bool = False) -> list[str]:
        if reset_sequences or allow_cascade:
            return truncate_all(self, style, tables, reset_sequences=reset_sequences,
                                allow_cascade=allow_cascade)
        with self.connection.cursor() as cursor:
            cursor.execute(GUARDED_TABLES)
            guarded = {name for (name,) in cursor.fetchall()}
        statements = []
        for table in tables:
            if table in KEPT_TABLES:
                continue
            name = self.quote_name(table)
            delete = f"DELETE FROM {name};"  # noqa: S608 - Django's own table names
            statements += ([f"ALTER TABLE {name} DISABLE TRIGGER USER;", delete,
                            f"ALTER TABLE {name} ENABLE TRIGGER USER;"]
                           if table in guarded else [delete])
        return statements

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", sql_flush)
        yield


@pytest.fixture(scope="session", autouse=True)
def post_flush_signal_only_where_it_writes() -> Iterator[None]:
    """After a transactional test's flush Django sends post_migrate, whose receivers here
    write every model's content type and permissions back: the rows flush_by_delete keeps
    (KEPT_TABLES). They would find each one in place, in 50 ms of queries a test here: the
    signal is left out while those are its only receivers, sent as before otherwise."""
    from django.contrib.auth.management import create_permissions
    from django.contrib.contenttypes.management import create_contenttypes
    from django.core.management.sql import emit_post_migrate_signal as send
    from django.db.models.signals import post_migrate

    writers_of_kept_rows = {create_permissions, create_contenttypes}

    def emit_post_migrate_signal(verbosity: int, interactive: bool, db: str,
                                 **kwargs: Any) -> None:
        receivers = {ref() if isinstance(ref, weakref.ReferenceType) else ref
                     for _key, ref, _is_async in post_migrate.receivers}
        if not receivers <= writers_of_kept_rows:
            send(verbosity, interactive, db, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        # (the flush command's own name for it)
        patch.setattr("django.core.management.commands.flush.emit_post_migrate_signal",
                      emit_post_migrate_signal)
        yield


@pytest.fixture(scope="session", autouse=True)
def static_files_scanned_once() -> Iterator[None]:
    """Every test client builds its own middleware chain, and WhiteNoise's (with DEBUG off)
    walks every static file of every finder when it is built: about 10-17 ms of CPU a
    client here, a sixth of the fast tier's. A web process builds the chain once; the
    tests now scan once per process too, for the same files (keyed by the settings the
    scan reads, so a test that overrides them scans its own)."""
    from django.conf import settings
    from whitenoise.middleware import WhiteNoiseMiddleware

    scan = WhiteNoiseMiddleware.add_files_from_finders
    scanned: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add_files_from_finders(self: WhiteNoiseMiddleware) -> None:
        key = (self.static_prefix, self.max_age, self.allow_all_origins, self.charset,
               tuple(map(str, settings.STATICFILES_DIRS)), tuple(settings.INSTALLED_APPS),
               tuple(settings.STATICFILES_FINDERS))
        if key not in scanned:
            before = dict(self.files)
            scan(self)
            scanned[key] = {url: static for url, static in self.files.items()
                            if before.get(url) is not static}
        self.files.update(scanned[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WhiteNoiseMiddleware, "add_files_from_finders", add_files_from_finders)
        yield


@pytest.fixture
def organization(db: None) -> Organization:
    return organization_make()


@pytest.fixture
def key_pair(organization: Organization) -> tuple[ApiKey, str]:
    return api_key_make(organization)


@pytest.fixture
def api_key(key_pair: tuple[ApiKey, str]) -> ApiKey:
    return key_pair[0]


@pytest.fixture
def client_for() -> Callable[[str], APIClient]:
    def make(plaintext: str) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        return client

    return make


@pytest.fixture
def api(key_pair: tuple[ApiKey, str], client_for: Callable[[str], APIClient]) -> APIClient:
    return client_for(key_pair[1])


@pytest.fixture(autouse=True)
def breakers_closed() -> Iterator[None]:
    """A worker's breakers (jobs.failures) are per process: one test's dead engine must not
    keep the next test's chunks from being taken."""
    from jobs.failures import breakers_reset

    yield
    breakers_reset()


@pytest.fixture(autouse=True)
def fast_password_hasher(settings: Settings) -> None:
    """Django's default hasher spends a quarter of a second of CPU on each password, by
    design; the tests' passwords guard nothing, and the fast tier hashes dozens of them."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session")
def storage_roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("storage")


@pytest.fixture(autouse=True)
def local_storage(settings: Settings, storage_roots: Path) -> Path:
    """Every test stores objects in its own local storage; tests of S3 switch backends.
    A folder of the session's, named per test and made only when something is written
    (the storage makes its folders as it writes): a tmp_path for each of the fast tier's
    1,500 tests cost a directory scan, a mkdir and a later rmtree, where most store nothing."""
    root = storage_roots / str(next(STORAGE_NUMBERS))
    settings.ANEX_STORAGE_BACKEND = "local"
    settings.ANEX_STORAGE_ROOT = root
    return root


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The chunk ids sent to the run queues, which nothing consumes here: the test runs or
    records the chunks itself (tests/chunks.py)."""
    calls: list[str] = []
    dispatch_catch(monkeypatch, lambda sent: calls.append(sent.id), "chunk_run_task")
    return calls


@pytest.fixture
def loopback(settings: Settings) -> None:
    """Let the SSRF-safe fetcher reach this machine's test servers (off everywhere else)."""
    settings.ANEX_FETCH_ALLOW_LOOPBACK = True


@pytest.fixture
def make_server() -> Iterator[Callable[..., LocalServer]]:
    servers: list[LocalServer] = []

    def make(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> LocalServer:
        server = LocalServer(host, tls)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def connections_many() -> Iterator[None]:
    """For a test that opens dozens of PostgreSQL connections at once (64 concurrent
    requests, one connection each): such tests take turns across the xdist workers, so two
    of them never pass PostgreSQL's 100 connections between them (a refusal there reads as
    the API's 503, not as the test's subject)."""
    lock = Path(os.environ.get("ANEX_RUN_DIR", ".run")) / "connections-many.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@pytest.fixture
def server(make_server: Callable[..., LocalServer]) -> LocalServer:
    return make_server()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def trust_ca(ca: trustme.CA, tmp_path: Path, settings: Settings) -> None:
    """Make the fetcher trust the test CA (tls_context issues server certificates)."""
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    settings.ANEX_FETCH_CA_BUNDLE = str(bundle)


CORPUS = ["Say hello in French.", "a plain text string", "We were billed twice for March.",
          "Please refund it today.", "Which team should handle this?", "How frustrated is the "
          "customer?", "invoices, payments, refunds", "bugs and outages", "everything else"]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory with a real tokenizer.json, trained here (no download): what a
    deployment's checkpoint carries and the estimator counts with."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]"]))
    directory = tmp_path_factory.mktemp("checkpoint")
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def checkpoints(settings: Settings, tokenizer_dir: Path) -> Path:
    """Every catalog model served from the test checkpoint."""
    from inference.catalog import catalog

    settings.ANEX_CHECKPOINTS = {model_id: tokenizer_dir for model_id in catalog()}
    return tokenizer_dir


@pytest.fixture(scope="session")
def make_run(checkpoint_dirs: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One `make run` per session on a bare environment (tests/launch.py), shared by every
    test that drives one as a newcomer does (the first-job walkthroughs, the CLI, the
    realtime README, the launcher's own start): it takes a minute or more to come up, and
    each test brings its own work to it. Its tests run last, together
    (pytest_collection_modifyitems), so it is up only while they run; the last of them
    (tests/e2e/test_devstack.py, marked stops_make_run) presses its Ctrl-C."""
    with make_run_launched(tmp_path_factory.mktemp("make-run"), checkpoint_dirs) as running:
        yield running


@pytest.fixture(autouse=True)
def staff_without_mfa(settings: Settings) -> None:
    """The admin's tests sign staff in with force_login, without TOTP; the rule that staff
    need it (ANEX_STAFF_MFA_REQUIRED) has its own test, tests/db/test_staff_mfa.py."""
    settings.ANEX_STAFF_MFA_REQUIRED = False
