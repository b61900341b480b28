"""Durable lease state: what must survive a crashed or restarted worker.

Upstream keeps this only in memory, so a worker restart forgets that a lease is poisoned or that
a command was running. We journal it in a small SQLite database (stdlib ``sqlite3``, WAL mode,
safe for several worker processes at once) in the worker's state folder:

- ``unconfirmed``: leases whose cleanup could not be confirmed (refused until destroyed);
- ``processes``: managed processes started and not yet seen to end, with their owner;
- ``creates``: sandbox creates in flight (name token), so an acquire cut short by a crash is
  found and deleted later; also creates whose call ended with the outcome still open (a create
  that timed out may land after its lookup), which later calls keep looking for;
- ``tempdirs``: host temp folders of file transfers in flight.

Entries carry an *owner* ``<pid>:<start time>:<boot id>`` (see :func:`current_owner`). An entry
whose owner is no longer alive was left by a crashed worker: the next call that carries the same
API origin and key cleans it up (see :mod:`provider.driver.recovery`). :func:`owner_alive` says
when an owner is gone; a killed worker its parent has not reaped yet (a zombie) is gone.

The state folder is ``$XDG_STATE_HOME/paperclip-createos`` when that variable is set, else
``.state/`` inside the plugin's own directory (the host gives the worker no HOME). Resetting it
is deleting that folder while no worker runs. No secret is stored: API keys appear only as
SHA-256 hashes. All methods are blocking; callers run them in worker threads.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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
"""


ABANDONED = "abandoned-until:"
CREATE_WATCH_SECONDS = 900.0
"""How long recovery keeps looking for a create that may still land (15 minutes)."""


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "paperclip-createos"
    return Path(__file__).resolve().parents[2] / ".state"


DEAD_STATES = frozenset("ZXx")
"""Process states of /proc/<pid>/stat that mean the process has ended: ``Z`` a zombie (exited,
not reaped yet by its parent), ``X`` dead (``x`` on Linux 2.6.33 to 3.13)."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that liveness needs."""

    state: str
    start_time: str
    """Field 22, ``starttime``: clock ticks from boot to the process's start (decimal text)."""


def parse_proc_stat(text: str) -> ProcStat | None:
    """Parse a ``/proc/<pid>/stat`` line; None when malformed.

    The line is ``pid (comm) state ppid ...``; ``comm`` (up to 15 bytes of the program name) may
    hold spaces and parentheses, so it ends at the *last* ``)``.
    """
    head, paren, tail = text.rpartition(")")
    if not paren or "(" not in head:
        return None
    fields = tail.split()  # fields[0] is field 3 (state), fields[19] is field 22 (starttime)
    if len(fields) < 20 or len(fields[0]) != 1 or not _is_decimal(fields[19]):
        return None
    return ProcStat(state=fields[0], start_time=fields[19])


def _boot_id() -> str | None:
    """The kernel's boot id (a fresh UUID at every boot); None where Linux does not offer it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return boot if boot and ":" not in boot else None


def _proc_usable() -> bool:
    return Path("/proc/self/stat").exists()


def _pid_exists(pid: int) -> bool:
    """Whether ``pid`` exists, for systems without /proc (no zombie or pid-reuse check there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, run by another user
    except (OSError, OverflowError):
        return False
    return True


def _is_decimal(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20


@dataclass(frozen=True)
class Owner:
    """A parsed owner string (see :func:`current_owner`)."""

    pid: int
    start_time: str | None
    """``starttime`` of ``/proc/<pid>/stat``; None when unknown (not recorded)."""
    boot_id: str | None
    """Kernel boot id at recording; None when unknown or in the legacy format."""


def current_owner() -> str:
    """This process as an owner: ``<pid>:<start time>:<boot id>``.

    The start time (clock ticks since boot, /proc/<pid>/stat field 22) tells this process from a
    later one given the same pid; the boot id tells this boot from a later one, where pids and
    start times count again from zero. A field Linux does not give (no /proc) is left empty.
    Databases written before boot ids were recorded hold ``<pid>:<start time>`` (or
    ``<pid>:None``); :func:`parse_owner` reads both.
    """
    pid = os.getpid()
    try:
        stat = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text(errors="replace"))
    except OSError:
        stat = None
    return f"{pid}:{stat.start_time if stat else ''}:{_boot_id() or ''}"


def parse_owner(owner: str) -> Owner | None:
    """Read an owner string; None when malformed.

    Accepted: ``<pid>:<start>:<boot>[:...]`` (fields after the third are ignored, so a later
    version may append some) and the legacy ``<pid>:<start>``. An empty start or boot field, or
    the legacy ``None`` start, means unknown. The pid must be a positive decimal number and a
    known start time a decimal number.
    """
    parts = owner.split(":")
    if len(parts) < 2 or not _is_decimal(parts[0]) or len(parts[0]) > 10 or int(parts[0]) <= 0:
        return None  # pids stay below 2**22 (Linux pid_max); 10 digits keeps int() cheap
    start = None if parts[1] in ("", "None") else parts[1]
    if start is not None and not _is_decimal(start):
        return None
    boot = parts[2] if len(parts) >= 3 and parts[2] else None
    return Owner(pid=int(parts[0]), start_time=start, boot_id=boot)


def owner_alive(owner: str) -> bool:
    """Whether the worker that recorded ``owner`` still runs.

    Dead: an abandoned create's marker; a malformed owner (no worker writes one); a boot id other
    than the current one (recorded before a reboot); no ``/proc/<pid>`` entry; a zombie or dead
    process there (``Z``/``X``: a SIGKILLed worker whose parent has not reaped it yet); a start
    time other than the recorded one (the pid now belongs to another process).

    Where the record cannot tell, the owner counts as alive, since treating a live worker as dead
    would kill the command it is running while a wrong "alive" only delays a cleanup: a legacy
    owner without boot id is judged by pid, state and start time alone (a pid and start tick both
    repeating after a reboot is the remaining, unlikely, gap); an owner without start time by
    pid and state; and without /proc (not Linux) a pid that exists is alive.
    """
    if owner.startswith(ABANDONED):
        return False  # handed to recovery (LeaseJournal.abandon_create)
    parsed = parse_owner(owner)
    if parsed is None:
        return False
    if parsed.boot_id is not None:
        boot = _boot_id()
        if boot is not None and boot != parsed.boot_id:
            return False  # recorded before a reboot
    try:
        text = Path(f"/proc/{parsed.pid}/stat").read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return not _proc_usable() and _pid_exists(parsed.pid)  # no such process, or no /proc
    except OSError:
        return _pid_exists(parsed.pid)  # there but unreadable (hidepid=1): judge by existence
    stat = parse_proc_stat(text)
    if stat is None:
        return _pid_exists(parsed.pid)
    if stat.state in DEAD_STATES:
        return False
    return parsed.start_time is None or parsed.start_time == stat.start_time


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

    @classmethod
    def open_default(cls, environ: Mapping[str, str] | None = None) -> LeaseJournal:
        return cls(default_state_dir(environ) / "leases.sqlite3")

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


def open_journal(environ: Mapping[str, str] | None = None) -> LeaseJournal:
    """The durable journal in the default state folder; in memory (with a warning on stderr)
    when that folder cannot be used, so a read-only install still serves."""
    try:
        return LeaseJournal.open_default(environ)
    except (OSError, sqlite3.Error) as exc:
        print(
            f"paperclip-createos: lease state is kept in memory only ({type(exc).__name__}: "
            "the state folder is not writable); set XDG_STATE_HOME to a writable folder.",
            file=sys.stderr,
        )
        return LeaseJournal(None)


def _scope_row(scope: ScopeKey) -> tuple[str, str, str, str, str]:
    return (scope.company_id, scope.environment_id, scope.api_url, scope.key_hash, scope.lease_id)
