"""Where the worker keeps its durable state: one folder per Paperclip instance.

**What the host tells a worker.** Paperclip forks the worker with a scrubbed environment (no
``HOME``, no ``XDG_*``, no ``PAPERCLIP_HOME`` or ``PAPERCLIP_INSTANCE_ID``), names no data folder,
and the ``instanceInfo.instanceId`` of ``initialize`` is ``"default"`` on every instance of the
2026.916 server. Two instances run by one Unix account do differ in ``PAPERCLIP_PLUGIN_ID``: the
UUID of the plugin's record in that instance's own database. It stays the same across worker
restarts, server restarts, upgrades, and ``plugin uninstall`` followed by a reinstall (the record
is only marked uninstalled); ``plugin uninstall --force`` deletes the record, and the next
install gets a new id, hence a new folder.

**Layout**, under the first usable state root (:func:`state_roots`)::

    <root>/instances/<plugin id>/leases.sqlite3   this instance's journal
    <root>/leases.sqlite3                        the legacy journal: before per-instance
                                                 folders, every instance of the account shared it

State roots, best first: ``$XDG_STATE_HOME/paperclip-createos``,
``<home>/.local/state/paperclip-createos`` (``$HOME``, else the account's home from the password
database: under the host, always the latter) and ``.state/`` inside the plugin's own folder, which
an upgrade replaces. A plugin id that is not a plain name (letters, digits, ``.``, ``_``, ``-``)
is replaced by ``id-`` and a hash of it; a worker started without one (by hand, outside a host)
uses ``instances/standalone``.

**Upgrade.** The legacy journal may name billable sandboxes (creates in flight, kept forks) and
poisoned leases. Moving its rows into one instance's folder would hand another instance's rows
to the wrong owner, so it is never moved and never written again: while it holds entries,
every instance's journal reads it as well (:class:`~provider.driver.core.journal.LeaseJournal`
``legacy``), and an entry there is cleared by whichever worker handles it, exactly as when the
folder was shared. Once it holds none it may be deleted while no worker runs.

The request pacing folder is not here: every instance shares it on purpose, one budget per IP
(:func:`provider.createos.pacer.default_runtime_dir`).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from provider.driver.core.journal import LeaseJournal

ENV_PLUGIN_ID: Final = "PAPERCLIP_PLUGIN_ID"
"""The host's id of this plugin's record, one per Paperclip instance (see the module docstring)."""
STANDALONE: Final = "standalone"
"""The instance folder of a worker started without a plugin id."""
JOURNAL_NAME: Final = "leases.sqlite3"

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def state_roots(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where the state folders may live, best first (see the module docstring)."""
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


def instance_name(environ: Mapping[str, str] | None = None) -> str:
    """The folder name of this worker's instance under ``<root>/instances``."""
    env = os.environ if environ is None else environ
    plugin_id = env.get(ENV_PLUGIN_ID, "").strip()
    if not plugin_id:
        return STANDALONE
    if _PLAIN_NAME.fullmatch(plugin_id):
        return plugin_id
    return "id-" + hashlib.sha256(plugin_id.encode()).hexdigest()[:32]


def instance_dir(root: Path, environ: Mapping[str, str] | None = None) -> Path:
    return root / "instances" / instance_name(environ)


def open_journal(environ: Mapping[str, str] | None = None) -> LeaseJournal:
    """This instance's journal under the first usable state root, reading that root's legacy
    journal when there is one; in memory (with a warning on stderr) when no root can be used,
    so a read-only install still serves."""
    roots = state_roots(environ)
    for root in roots:
        legacy = root / JOURNAL_NAME
        folder = instance_dir(root, environ)
        try:
            for private in (root, folder.parent):  # the account's alone, like the journal
                private.mkdir(mode=0o700, parents=True, exist_ok=True)
            return LeaseJournal(folder / JOURNAL_NAME, legacy=legacy if legacy.is_file() else None)
        except (OSError, sqlite3.Error):
            continue
    tried = ", ".join(str(root) for root in roots)
    print(
        "paperclip-createos: lease state is kept in memory only: no state folder is writable"
        f" (tried {tried}); make the first of them writable for the server's account.",
        file=sys.stderr,
    )
    return LeaseJournal(None)


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
