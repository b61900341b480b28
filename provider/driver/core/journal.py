"""Durable lease state: what must survive a crashed or restarted worker.

Upstream keeps this only in memory, so a worker restart forgets that a lease is poisoned or that
a command was running. We journal it in a small SQLite database (stdlib ``sqlite3``, WAL mode,
safe for several worker processes at once) in the worker's state folder:

- ``unconfirmed``: leases whose cleanup could not be confirmed (refused until destroyed);
- ``processes``: managed processes started and not yet seen to end, with their owner;
- ``creates``: sandbox creates in flight (name token), so an acquire cut short by a crash is
  found and deleted later; also creates whose call ended with the outcome still open (a create
  that timed out may land after its lookup), which later calls keep looking for;
- ``tempdirs``: host temp folders of file transfers in flight;
- ``scratches``: sandbox scratch files of file transfers in flight (sandbox id and path), so an
  upload's copy of the host files left by a crash is removed from a kept sandbox;
- ``kept_forks``: reusable leases forked from a template, by scope tag. Forks take no
  name, so this is how the reaper knows them as this environment's (provider.driver.leases.reaper);
  the newest :data:`KEPT_FORKS_CAP` rows are kept;
- ``gone``: sandboxes this worker deleted or CreateOS answered 404 for, so calls on their
  leases are refused without a request after a restart too (provider.driver.core.gone); the newest
  :data:`GONE_CAP` rows are kept.
- ``expiring``: leases acquired with a deadline (``requestedExpiresAt``), until released, so a
  worker restarted after the deadline deletes them (provider.driver.leases.expiry).

Entries carry an *owner* ``<pid>:<start time>:<boot id>`` (see :func:`current_owner`). An entry
whose owner is no longer alive was left by a crashed worker: the next call that carries the same
API origin and key cleans it up (see :mod:`provider.driver.leases.recovery`). :func:`owner_alive`
says when an owner is gone; a killed worker its parent has not reaped yet (a zombie) is gone.

Each Paperclip instance has its own journal; :mod:`provider.driver.core.state_folder` chooses the
folder. A journal may also read a *legacy* one (the journal every instance of the account shared
before per-instance folders): its entries are found and cleared like this journal's own, and new
entries are never written there. No secret is stored: API keys appear only as SHA-256 hashes.
All methods are blocking; callers run them in worker threads.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provider.driver.core.owners import ABANDONED, current_owner, owner_alive
from provider.driver.core.tracker import ScopeKey

SCHEMA = """
CREATE TABLE IF NOT EXISTS {db}.unconfirmed (
  company_id TEXT, environment_id TEXT, api_url TEXT, key_hash TEXT, lease_id TEXT,
  PRIMARY KEY (company_id, environment_id, api_url, key_hash, lease_id));
CREATE TABLE IF NOT EXISTS {db}.processes (
  process_id TEXT PRIMARY KEY, company_id TEXT, environment_id TEXT, api_url TEXT,
  key_hash TEXT, lease_id TEXT, owner TEXT);
CREATE TABLE IF NOT EXISTS {db}.creates (
  token TEXT PRIMARY KEY, api_url TEXT, key_hash TEXT, owner TEXT);
CREATE TABLE IF NOT EXISTS {db}.tempdirs (path TEXT PRIMARY KEY, owner TEXT);
CREATE TABLE IF NOT EXISTS {db}.scratches (
  path TEXT PRIMARY KEY, sandbox_id TEXT, api_url TEXT, key_hash TEXT, owner TEXT);
CREATE TABLE IF NOT EXISTS {db}.kept_forks (
  sandbox_id TEXT PRIMARY KEY, tag TEXT, key_hash TEXT, recorded_at REAL);
CREATE TABLE IF NOT EXISTS {db}.gone (
  api_url TEXT, key_hash TEXT, lease_id TEXT, reason TEXT, recorded_at REAL,
  PRIMARY KEY (api_url, key_hash, lease_id));
CREATE TABLE IF NOT EXISTS {db}.expiring (
  sandbox_id TEXT PRIMARY KEY, api_url TEXT, key_hash TEXT, deadline REAL);
"""
"""The tables, in schema ``{db}`` (``main``, or ``legacy`` for an attached legacy journal)."""
_LEGACY_ROWS = (
    "SELECT EXISTS (SELECT 1 FROM legacy.unconfirmed) OR EXISTS (SELECT 1 FROM legacy.processes)"
    " OR EXISTS (SELECT 1 FROM legacy.creates) OR EXISTS (SELECT 1 FROM legacy.tempdirs)"
    " OR EXISTS (SELECT 1 FROM legacy.kept_forks)"
)
"""Whether an attached legacy journal holds any entry."""


CREATE_WATCH_SECONDS = 900.0
"""How long recovery keeps looking for a create that may still land (15 minutes)."""
KEPT_FORKS_CAP = 10_000
"""Rows of ``kept_forks`` kept (newest first): a fork deleted behind our back leaves its row."""
GONE_CAP = 4_096
"""Rows of ``gone`` kept (newest first)."""


@dataclass(frozen=True)
class OrphanProcess:
    process_id: str
    scope: ScopeKey


class LeaseJournal:
    """The journal described in the module docstring; ``path=None`` keeps it in memory.

    ``legacy`` names a journal to read as well (:attr:`legacy` is None when there is none or it
    cannot be used, which is said on stderr): lookups and removals cover both, writes go to
    ``path`` only.
    """

    def __init__(self, path: Path | None, *, legacy: Path | None = None) -> None:
        self.path = path
        self.legacy: Path | None = None
        self.owner = current_owner()
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Created 0600 before SQLite opens it: its -wal and -shm files copy that mode.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        target = ":memory:" if path is None else path.absolute().as_uri()
        self._db = sqlite3.connect(target, timeout=10.0, check_same_thread=False, uri=True)
        self._schemas: tuple[str, ...] = ("main",)
        with self._tx() as db:
            if path is not None:
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA.format(db="main"))
        if path is not None:
            path.chmod(0o600)
        if legacy is not None and legacy != path:
            self._attach_legacy(legacy)

    def _attach_legacy(self, legacy: Path) -> None:
        """Read the journal at ``legacy`` too, if it holds any entry. It must be writable (its
        entries are removed once handled), else it is left alone and stderr says why. An empty
        one is not attached: after the upgrade only a worker of the earlier version that still
        runs can write there, and what it leaves is read by the worker started after it."""
        try:
            self._db.execute(
                "ATTACH DATABASE ? AS legacy", (f"{legacy.absolute().as_uri()}?mode=rw",)
            )
            self._db.executescript(SCHEMA.format(db="legacy"))
            with self._tx() as db:  # a write: fails here, not mid-call, when it is read-only
                db.execute("DELETE FROM legacy.tempdirs WHERE rowid=-1")
                in_use = bool(db.execute(_LEGACY_ROWS).fetchone()[0])
        except sqlite3.Error as exc:
            in_use = False
            print(
                f"paperclip-createos: the legacy lease journal {legacy} is not read ({exc});"
                " entries recorded there before the upgrade are not cleaned up.",
                file=sys.stderr,
            )
        if not in_use:
            with contextlib.suppress(sqlite3.Error):  # not attached when ATTACH failed
                self._db.execute("DETACH DATABASE legacy")
            return
        self.legacy = legacy
        self._schemas = ("main", "legacy")

    @contextmanager
    def _tx(self, *, synced: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction. ``synced=False``: its commit is not flushed to disk by itself (the
        next synced commit flushes it, in order): it survives a crashed worker, not a power cut,
        and saves an fsync. Only for writes whose loss merely repeats a harmless cleanup."""
        with self._lock:
            if not synced:
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                with self._db:
                    yield self._db
            finally:
                if not synced:
                    self._db.execute("PRAGMA synchronous=FULL")

    def _select(self, sql: str, params: tuple[object, ...] = ()) -> list[Any]:
        """The rows of ``sql`` (its tables spelled ``{db}.table``) in every journal read."""
        with self._tx() as db:
            return [
                row
                for schema in self._schemas
                for row in db.execute(sql.format(db=schema), params).fetchall()
            ]

    def _delete(self, sql: str, params: tuple[object, ...], *, synced: bool = True) -> None:
        """Run the ``DELETE`` ``sql`` (tables spelled ``{db}.table``) on every journal read:
        an entry is cleared wherever it was recorded."""
        with self._tx(synced=synced) as db:
            for schema in self._schemas:
                db.execute(sql.format(db=schema), params)

    def close(self) -> None:
        self._db.close()

    # -- poisoned leases ---------------------------------------------------------------------

    def mark_unconfirmed(self, scope: ScopeKey) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO unconfirmed VALUES (?,?,?,?,?)", _scope_row(scope))

    def clear_unconfirmed(self, scope: ScopeKey) -> None:
        self._delete(
            "DELETE FROM {db}.unconfirmed WHERE company_id=? AND environment_id=? AND api_url=?"
            " AND key_hash=? AND lease_id=?",
            _scope_row(scope),
        )

    def is_unconfirmed(self, scope: ScopeKey) -> bool:
        rows = self._select(
            "SELECT 1 FROM {db}.unconfirmed WHERE company_id=? AND environment_id=? AND api_url=?"
            " AND key_hash=? AND lease_id=?",
            _scope_row(scope),
        )
        return bool(rows)

    # -- processes ---------------------------------------------------------------------------

    def add_process(self, scope: ScopeKey, process_id: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO processes VALUES (?,?,?,?,?,?,?)",
                (process_id, *_scope_row(scope), self.owner),
            )

    def remove_process(self, process_id: str) -> None:
        """Unsynced (:meth:`_tx`): a removal lost to a power cut only has the next worker kill
        an ended command's tree again, confirmed at once, while every command saves an fsync."""
        self._delete("DELETE FROM {db}.processes WHERE process_id=?", (process_id,), synced=False)

    def orphan_processes(self, api_url: str, key_hash: str) -> list[OrphanProcess]:
        rows = self._select(
            "SELECT process_id, company_id, environment_id, lease_id, owner FROM {db}.processes"
            " WHERE api_url=? AND key_hash=?",
            (api_url, key_hash),
        )
        return [
            OrphanProcess(pid, ScopeKey(company, env, api_url, key_hash, lease))
            for pid, company, env, lease, owner in rows
            if not owner_alive(owner)
        ]

    # -- sandbox creates ---------------------------------------------------------------------

    def add_create(self, api_url: str, key_hash: str, token: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO creates VALUES (?,?,?,?)",
                (token, api_url, key_hash, self.owner),
            )

    def remove_create(self, token: str) -> None:
        self._delete("DELETE FROM {db}.creates WHERE token=?", (token,))

    def abandon_create(self, token: str, *, watch_seconds: float = CREATE_WATCH_SECONDS) -> None:
        """Hand an unresolved create to recovery: its call is over, but the sandbox may exist
        (a cleanup failed) or still appear (a timed-out create can be served late). Later calls
        with this origin and key look for it until ``watch_seconds`` have passed."""
        until = time.time() + watch_seconds
        with self._tx() as db:
            db.execute("UPDATE creates SET owner=? WHERE token=?", (f"{ABANDONED}{until!r}", token))

    def watching_create(self, token: str) -> bool:
        """Whether recovery should keep looking for ``token`` although a lookup missed it."""
        rows = self._select("SELECT owner FROM {db}.creates WHERE token=?", (token,))
        if not rows or not str(rows[0][0]).startswith(ABANDONED):
            return False
        try:
            return time.time() < float(str(rows[0][0]).removeprefix(ABANDONED))
        except ValueError:
            return False

    def orphan_creates(self, api_url: str, key_hash: str) -> list[str]:
        rows = self._select(
            "SELECT token, owner FROM {db}.creates WHERE api_url=? AND key_hash=?",
            (api_url, key_hash),
        )
        return [token for token, owner in rows if not owner_alive(owner)]

    # -- host temp folders -------------------------------------------------------------------

    def add_tempdir(self, path: Path) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO tempdirs VALUES (?,?)", (str(path), self.owner))

    def remove_tempdir(self, path: Path) -> None:
        self._delete("DELETE FROM {db}.tempdirs WHERE path=?", (str(path),))

    def orphan_tempdirs(self) -> list[Path]:
        rows = self._select("SELECT path, owner FROM {db}.tempdirs")
        return [Path(path) for path, owner in rows if not owner_alive(owner)]

    # -- sandbox scratch files ---------------------------------------------------------------

    def add_scratch(self, scope: ScopeKey, path: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO scratches VALUES (?,?,?,?,?)",
                (path, scope.lease_id, scope.api_url, scope.key_hash, self.owner),
            )

    def remove_scratch(self, path: str) -> None:
        self._delete("DELETE FROM {db}.scratches WHERE path=?", (path,))

    def orphan_scratches(self, api_url: str, key_hash: str) -> list[tuple[str, str]]:
        """``(sandbox id, scratch path)`` of transfers whose worker is gone."""
        rows = self._select(
            "SELECT sandbox_id, path, owner FROM {db}.scratches WHERE api_url=? AND key_hash=?",
            (api_url, key_hash),
        )
        return [(sandbox_id, path) for sandbox_id, path, owner in rows if not owner_alive(owner)]

    # -- kept forks ---------------------------------------------------------------------------

    def add_kept_fork(self, tag: str, key_hash: str, sandbox_id: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO kept_forks VALUES (?,?,?,?)",
                (sandbox_id, tag, key_hash, time.time()),
            )
            db.execute(
                "DELETE FROM kept_forks WHERE sandbox_id NOT IN (SELECT sandbox_id FROM"
                " kept_forks ORDER BY rowid DESC LIMIT ?)",
                (KEPT_FORKS_CAP,),
            )

    def remove_kept_fork(self, sandbox_id: str) -> None:
        self._delete("DELETE FROM {db}.kept_forks WHERE sandbox_id=?", (sandbox_id,))

    def kept_forks(self, tag: str) -> frozenset[str]:
        """This scope's kept forks, whichever key recorded them: a sweep only deletes those its
        own listing shows (a rotated key still sees the account's sandboxes)."""
        rows = self._select("SELECT sandbox_id FROM {db}.kept_forks WHERE tag=?", (tag,))
        return frozenset(sandbox_id for (sandbox_id,) in rows)

    # -- expiring leases ----------------------------------------------------------------------

    def add_expiring(self, api_url: str, key_hash: str, sandbox_id: str, deadline: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO expiring VALUES (?,?,?,?)",
                (sandbox_id, api_url, key_hash, deadline),
            )

    def remove_expiring(self, sandbox_id: str) -> None:
        self._delete("DELETE FROM {db}.expiring WHERE sandbox_id=?", (sandbox_id,))

    def expiring(self, api_url: str, key_hash: str) -> list[tuple[str, float]]:
        """The leases with a deadline of this origin and key: (sandbox id, deadline)."""
        rows = self._select(
            "SELECT sandbox_id, deadline FROM {db}.expiring WHERE api_url=? AND key_hash=?",
            (api_url, key_hash),
        )
        return [(sandbox_id, float(deadline)) for sandbox_id, deadline in rows]

    def is_expiring(self, sandbox_id: str) -> bool:
        return bool(self._select("SELECT 1 FROM {db}.expiring WHERE sandbox_id=?", (sandbox_id,)))

    # -- gone sandboxes -----------------------------------------------------------------------

    def add_gone(self, scope: ScopeKey, reason: str) -> None:
        """Record that ``scope``'s sandbox is gone (``reason``: how we know); keeps the newest
        :data:`GONE_CAP` rows."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO gone VALUES (?,?,?,?,?)",
                (scope.api_url, scope.key_hash, scope.lease_id, reason, time.time()),
            )
            db.execute(
                "DELETE FROM gone WHERE rowid NOT IN"
                " (SELECT rowid FROM gone ORDER BY recorded_at DESC LIMIT ?)",
                (GONE_CAP,),
            )

    def gone(self, scope: ScopeKey, *, since: float) -> tuple[str, float] | None:
        """The reason and time (wall clock) recorded for ``scope``'s sandbox no earlier than
        ``since``, or None."""
        rows = self._select(
            "SELECT reason, recorded_at FROM {db}.gone WHERE api_url=? AND key_hash=?"
            " AND lease_id=? AND recorded_at>=?",
            (scope.api_url, scope.key_hash, scope.lease_id, since),
        )
        return (str(rows[0][0]), float(rows[0][1])) if rows else None


def _scope_row(scope: ScopeKey) -> tuple[str, str, str, str, str]:
    return (scope.company_id, scope.environment_id, scope.api_url, scope.key_hash, scope.lease_id)
