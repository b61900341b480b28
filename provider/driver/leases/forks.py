"""Forking a snapshot template (docs/protocol.md 8.4, docs/protocol.md C3.9).

A template is a paused sandbox; a lease (or a setup session started from a template) forks it with
``{"start_paused": false, "egress": <effective or ["*"]>, "ingress_enabled": false, "envs": {<fork
token>: "1"}}``. Right after a pause CreateOS may answer 409 while the snapshot bundle becomes
durable: that is the one POST we repeat on a status other than 429 and 503 (every 250 ms, at most 40
times, within the caller's deadline), because a 409 means the server did nothing. A 404 means the
template is gone (or belongs to another key). Those two, and any other definite rejection (a status
below 500 or a 503, after the client's own retries), created nothing:
:class:`ForkRefused` or the status error itself.

Forks take no name, so the fork token is how a fork whose outcome is unknown (a 5xx other than 503,
connection lost, a malformed answer, the deadline during the call) is found again: an env key
``PAPERCLIP_CREATEOS_FORK_<32 hex>``, fresh per fork, which sandbox views list by name (values are
never shown). :func:`carries_token` matches it; the acquire looks the fork up and deletes it, and
the journal keeps looking on later calls (:mod:`provider.driver.leases.recovery`). The variable is
visible to the sandbox's processes; it holds no secret.
"""

from __future__ import annotations

import uuid
from typing import Final

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import Conflict, NotFound
from provider.createos.models import SandboxView
from provider.driver.leases.placement import Placement
from provider.errors import ProviderError

FORK_RETRY_INTERVAL: Final = 0.25
FORK_CONFLICT_RETRIES: Final = 40
FORK_ENV_PREFIX: Final = "PAPERCLIP_CREATEOS_FORK_"


class ForkRefused(ProviderError):
    """CreateOS definitely forked nothing (the template is gone, or it kept answering 409)."""


def fork_token() -> str:
    """A fresh fork token: the env key that identifies one fork (``PAPERCLIP_CREATEOS_FORK_``
    and 32 hex digits)."""
    return f"{FORK_ENV_PREFIX}{uuid.uuid4().hex}"


def carries_token(view: SandboxView, token: str, source_id: str | None = None) -> bool:
    """Whether ``view`` is the fork that carried ``token`` (of ``source_id``, when the view
    says where it was forked from)."""
    if token not in view.env_keys:
        return False
    return source_id is None or view.forked_from in (None, source_id)


async def fork_template(
    client: CreateOSClient, source_id: str, placement: Placement, token: str
) -> tuple[str, str | None]:
    """Fork ``source_id`` for ``placement``, carrying ``token``: the new sandbox's id and the
    status it answered. Whatever else fails propagates unchanged: its outcome is unknown."""
    retries = 0
    while True:
        try:
            return await client.fork_sandbox(
                source_id,
                start_paused=False,
                egress=placement.fork_egress(),
                ingress_enabled=False,
                envs={token: "1"},
            )
        except Conflict:
            if retries >= FORK_CONFLICT_RETRIES:
                raise ForkRefused(
                    f"CreateOS kept refusing to fork template {source_id} (HTTP 409 after "
                    f"{retries} retries): it must be paused and its snapshot durable. Try again "
                    "later, or capture a new template."
                ) from None
        except NotFound:
            raise ForkRefused(
                f"The template sandbox {source_id} no longer exists (or belongs to another API "
                "key): capture a new template in a setup session."
            ) from None
        retries += 1
        await anyio.sleep(FORK_RETRY_INTERVAL)
