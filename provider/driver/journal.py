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
- ``kept_forks``: reusable leases forked from a template, by scope tag. Forks take no
  name, so this is how the reaper knows them as this environment's (provider.driver.reaper);
  the newest :data:`KEPT_FORKS_CAP` rows are kept.

Entries carry an *owner* ``<pid>:<start time>:<boot id>`` (see :func:`current_owner`). An entry
whose owner is no longer alive was left by a crashed worker: the next call that carries the same
API origin and key cleans it up (see :mod:`provider.driver.recovery`). :func:`owner_alive` says
when an owner is gone; a killed worker its parent has not reaped yet (a zombie) is gone.

The state folder is the first writable of ``$XDG_STATE_HOME/paperclip-createos``,
``<home>/.local/state/paperclip-createos`` (``$HOME``, else the account's home: the host gives
the worker no HOME) and ``.state/`` inside the plugin's own directory, which an upgrade replaces
(:func:`state_dirs`). Resetting it is deleting that folder while no worker runs. No secret is
stored: API keys appear only as SHA-256 hashes. All methods are blocking; callers run them in
worker threads.
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from provider.driver.owners import ABANDONED, current_owner, owner_alive
from provider.driver.tracker import ScopeKey

SCHEMA = """
CREATE TABLE IF NOT EXISTS unconfirmed (
  company_id TEXT, environment_id TEXT, api_url TEXT, key_hash TEXT, lease_id TEXT,
  PRIMARY KEY (company_id, environment_id, api_url, key_hash, lease_id));
CREATE TABLE IF NOT EXISTS processes (
  process_id TEXT PRIMARY KEY, company_id TEXT, environment_id TEXT, api_url TEXT,
  key_hash TEXT, lease_id TEXT, owner TEXT);
CREATE TABLE IF NOT EXISTS creates (
  token TEXT PRIMARY KEY, api_url TEXT, key_hash TEXT, owner TEXT);
CREATE TABLE IF NOT EXISTS tempdirs (path TEXT PRIMARY KEY, owner TEXT);
CREATE TABLE IF NOT EXISTS kept_forks (
  sandbox_id TEXT PRIMARY KEY, tag TEXT, key_hash TEXT, recorded_at REAL);
"""


CREATE_WATCH_SECONDS = 900.0
"""How long recovery keeps looking for a create that may still land (15 minutes)."""
KEPT_FORKS_CAP = 10_000
"""Rows of ``kept_forks`` kept (newest first): a fork deleted behind our back leaves its row."""


def state_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where the journal may live, best first (see the module docstring)."""
    env = os.environ if environ is None else environ
    found: list[Path] = []
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        found.append(Path(xdg) / "paperclip-createos")
    home = _home(env)
    if home is not None:
        found.append(home / ".local" / "state" / "paperclip-createos")
    found.append(Path(__file__).resolve().parents[2] / ".state")
    return list(dict.fromkeys(found))


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    return state_dirs(environ)[0]


def _home(env: Mapping[str, str]) -> Path | None:
    """``$HOME``, else the account's home from the password database (the host gives the worker
    no ``HOME``); None when neither is an absolute path."""
    text = env.get("HOME", "").strip()
    if not text:
        try:
            text = pwd.getpwuid(os.getuid()).pw_dir
        except (KeyError, OSError):
            return None
    path = Path(text)
    return path if path.is_absolute() and path != Path("/") else None


@dataclass(frozen=True)
class OrphanProcess:
    process_id: str
    scope: ScopeKey


class LeaseJournal:
    """The journal described in the module docstring; ``path=None`` keeps it in memory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.owner = current_owner()
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            ":memory:" if path is None else str(path), timeout=10.0, check_same_thread=False
        )
        with self._tx() as db:
            if path is not None:
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
        if path is not None:
            path.chmod(0o600)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._db:
            yield self._db

    def close(self) -> None:
        self._db.close()

    # -- poisoned leases ---------------------------------------------------------------------

    def mark_unconfirmed(self, scope: ScopeKey) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO unconfirmed VALUES (?,?,?,?,?)", _scope_row(scope))

    def clear_unconfirmed(self, scope: ScopeKey) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM unconfirmed WHERE company_id=? AND environment_id=? AND api_url=?"
                " AND key_hash=? AND lease_id=?",
                _scope_row(scope),
            )

    def is_unconfirmed(self, scope: ScopeKey) -> bool:
        with self._tx() as db:
            row = db.execute(
                "SELECT 1 FROM unconfirmed WHERE company_id=? AND environment_id=? AND api_url=?"
                " AND key_hash=? AND lease_id=?",
                _scope_row(scope),
            ).fetchone()
        return row is not None

    # -- processes ---------------------------------------------------------------------------

    def add_process(self, scope: ScopeKey, process_id: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO processes VALUES (?,?,?,?,?,?,?)",
                (process_id, *_scope_row(scope), self.owner),
            )

    def remove_process(self, process_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM processes WHERE process_id=?", (process_id,))

    def orphan_processes(self, api_url: str, key_hash: str) -> list[OrphanProcess]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT process_id, company_id, environment_id, lease_id, owner FROM processes"
                " WHERE api_url=? AND key_hash=?",
                (api_url, key_hash),
            ).fetchall()
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
        with self._tx() as db:
            db.execute("DELETE FROM creates WHERE token=?", (token,))

    def abandon_create(self, token: str, *, watch_seconds: float = CREATE_WATCH_SECONDS) -> None:
        """Hand an unresolved create to recovery: its call is over, but the sandbox may exist
        (a cleanup failed) or still appear (a timed-out create can be served late). Later calls
        with this origin and key look for it until ``watch_seconds`` have passed."""
        until = time.time() + watch_seconds
        with self._tx() as db:
            db.execute("UPDATE creates SET owner=? WHERE token=?", (f"{ABANDONED}{until!r}", token))

    def watching_create(self, token: str) -> bool:
        """Whether recovery should keep looking for ``token`` although a lookup missed it."""
        with self._tx() as db:
            row = db.execute("SELECT owner FROM creates WHERE token=?", (token,)).fetchone()
        if row is None or not str(row[0]).startswith(ABANDONED):
            return False
        try:
            return time.time() < float(str(row[0]).removeprefix(ABANDONED))
        except ValueError:
            return False

    def orphan_creates(self, api_url: str, key_hash: str) -> list[str]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT token, owner FROM creates WHERE api_url=? AND key_hash=?",
                (api_url, key_hash),
            ).fetchall()
        return [token for token, owner in rows if not owner_alive(owner)]

    # -- host temp folders -------------------------------------------------------------------

    def add_tempdir(self, path: Path) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO tempdirs VALUES (?,?)", (str(path), self.owner))

    def remove_tempdir(self, path: Path) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM tempdirs WHERE path=?", (str(path),))

    def orphan_tempdirs(self) -> list[Path]:
        with self._tx() as db:
            rows = db.execute("SELECT path, owner FROM tempdirs").fetchall()
        return [Path(path) for path, owner in rows if not owner_alive(owner)]

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
        with self._tx() as db:
            db.execute("DELETE FROM kept_forks WHERE sandbox_id=?", (sandbox_id,))

    def kept_forks(self, tag: str) -> frozenset[str]:
        """This scope's kept forks, whichever key recorded them: a sweep only deletes those its
        own listing shows (a rotated key still sees the account's sandboxes)."""
        with self._tx() as db:
            rows = db.execute("SELECT sandbox_id FROM kept_forks WHERE tag=?", (tag,)).fetchall()
        return frozenset(sandbox_id for (sandbox_id,) in rows)


def open_journal(environ: Mapping[str, str] | None = None) -> LeaseJournal:
    """The durable journal in the first usable state folder of :func:`state_dirs`; in memory
    (with a warning on stderr) when none can be used, so a read-only install still serves."""
    for folder in state_dirs(environ):
        try:
            return LeaseJournal(folder / "leases.sqlite3")
        except (OSError, sqlite3.Error):
            continue
    print(
        "paperclip-createos: lease state is kept in memory only (no state folder is "
        "writable); set XDG_STATE_HOME to a writable folder.",
        file=sys.stderr,
    )
    return LeaseJournal(None)


def _scope_row(scope: ScopeKey) -> tuple[str, str, str, str, str]:
    return (scope.company_id, scope.environment_id, scope.api_url, scope.key_hash, scope.lease_id)
