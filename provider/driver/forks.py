"""Forking a snapshot template (provider-behavior.md 8.4, createos-api.md 3.9).

A template is a paused sandbox; a lease (or a setup session started from a template) forks it
with ``{"start_paused": false, "egress": <effective or ["*"]>, "ingress_enabled": false}``.
Right after a pause CreateOS may answer 409 while the snapshot bundle becomes durable: that is
the one POST we repeat on a status other than 429 (every 250 ms, at most 40 times, within the
caller's deadline), because a 409 means the server did nothing. A 404 means the template is gone
(or belongs to another key). Any other definite rejection (a status below 500 other than 429,
after the client's own 429 retries) created nothing either. A fork whose outcome is unknown (5xx,
connection lost, a malformed answer, the deadline during the call) may have created a billable
sandbox that cannot be found again, since forks take no name: the call fails with that warning.
"""

from __future__ import annotations

from typing import Final

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    APIStatusError,
    Conflict,
    InvalidIdentifier,
    NotFound,
)
from provider.driver.placement import Placement
from provider.driver.runtime import deadline_warning
from provider.errors import CleanupUnconfirmed, ProviderError

FORK_RETRY_INTERVAL: Final = 0.25
FORK_CONFLICT_RETRIES: Final = 40


def _left_behind(source_id: str) -> str:
    return (
        f"A sandbox forked from template {source_id} may have been created anyway and left "
        f"behind: look in CreateOS for a sandbox forked from {source_id} and delete it."
    )


async def fork_template(
    client: CreateOSClient, source_id: str, placement: Placement
) -> tuple[str, str | None]:
    """Fork ``source_id`` for ``placement``: the new sandbox's id and answered status."""
    retries = 0
    while True:
        try:
            with deadline_warning(_left_behind(source_id)):
                return await client.fork_sandbox(
                    source_id,
                    start_paused=False,
                    egress=placement.fork_egress(),
                    ingress_enabled=False,
                )
        except Conflict:
            if retries >= FORK_CONFLICT_RETRIES:
                raise ProviderError(
                    f"CreateOS kept refusing to fork template {source_id} (HTTP 409 after "
                    f"{retries} retries): it must be paused and its snapshot durable. Try again "
                    "later, or capture a new template."
                ) from None
        except NotFound:
            raise ProviderError(
                f"The template sandbox {source_id} no longer exists (or belongs to another API "
                "key): capture a new template in a setup session."
            ) from None
        except APIStatusError as exc:
            if exc.rejected:
                raise  # a definite rejection: nothing was forked
            raise CleanupUnconfirmed(f"{exc} {_left_behind(source_id)}") from exc
        except InvalidIdentifier:
            raise  # refused before any request
        except ProviderError as exc:  # transport failure or a malformed answer: unknown outcome
            raise CleanupUnconfirmed(f"{exc} {_left_behind(source_id)}") from exc
        retries += 1
        await anyio.sleep(FORK_RETRY_INTERVAL)
