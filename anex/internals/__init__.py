"""The performance shortcuts that reach into the frameworks' internals, fenced in one place.

Each module here leans on something its framework does not promise: the ORM's compiler and
related-object populators (prepared), Django's BaseHandler built a second time around a
shorter middleware chain (lean), a DRF serializer's built fields shared between threads
(prototyped), Dramatiq's private Redis consumer subclassed through the broker's
consumer_class hook (doorbell). Each was verified, and is tested, on the release series
VERIFIED names; pyproject.toml allows only those series, and tests/unit/test_internals.py
fails when either the installed frameworks or pyproject's ranges leave them, so an upgrade
starts by verifying every module here again (each has a test comparing it with the
framework's own path: tests/db/test_prepared_*.py, test_lean_path.py, the job read's
serializer tests, test_doorbell.py).

The realtime engine client's socket (realtime/engine_client.py) is a shortcut too, but
into no framework: it speaks HTTP/1.1 over the standard library's socket and ssl, and its
tests run it against raw socket servers; it stays with the realtime app.
"""

from __future__ import annotations

# The distribution and the release series (major.minor) each shortcut was verified on.
VERIFIED = {"django": "5.2", "djangorestframework": "3.18", "dramatiq": "2.2"}
