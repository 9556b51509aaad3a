"""A worker's metrics directory (anex/workermetrics.py, issue 40 L3): every process of the
worker writes its metrics there and the forked server serves what it finds, so a directory
another local user made first (a name from the master's pid is one anybody can make) would
let them read the worker's figures and plant their own. The worker role makes a private one
with mkdtemp; a bare Dramatiq with a port and no directory named is refused."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from anex import workermetrics


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("ANEX_WORKER_METRICS_PORT", "9191")
    # recorded, so what the role sets is undone after the test
    monkeypatch.setenv("ANEX_WORKER_METRICS_DIR", "")
    monkeypatch.delenv("ANEX_WORKER_METRICS_DIR")
    return tmp_path


def test_the_role_makes_a_private_directory_nobody_could_plant(temporary: Path) -> None:
    # given another local user's directory, open to all, under the name the worker once
    # used (the prefix and its Dramatiq master's pid: this process's, as exec keeps it)
    planted = temporary / f"{workermetrics.DIR_PREFIX}{os.getpid()}"
    planted.mkdir()
    planted.chmod(0o777)
    # when the worker role prepares its metrics port
    workermetrics.metrics_dir_make()
    # then its processes write into a fresh directory only its own user can enter
    made = workermetrics.metrics_dir()
    assert made != planted and made.parent == temporary
    assert made.name.startswith(f"{workermetrics.DIR_PREFIX}{os.getpid()}-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert made.owner() == Path(tempfile.gettempdir()).owner()
    # and its worker processes (its children) read the same one from their environment
    assert os.environ["ANEX_WORKER_METRICS_DIR"] == str(made)


def test_a_named_directory_is_kept(temporary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANEX_WORKER_METRICS_DIR", str(temporary / "mine"))
    workermetrics.metrics_dir_make()
    assert workermetrics.metrics_dir() == temporary / "mine"


def test_a_bare_worker_with_a_port_and_no_directory_is_refused(temporary: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="needs ANEX_WORKER_METRICS_DIR"):
        workermetrics.metrics_dir()


def test_without_a_port_nothing_is_made(temporary: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANEX_WORKER_METRICS_PORT")
    workermetrics.metrics_dir_make()
    assert "ANEX_WORKER_METRICS_DIR" not in os.environ
    assert list(temporary.iterdir()) == []
