"""Whether a lease, a setup session or a template belongs to the caller: one check for all three.

Each is a CreateOS sandbox this provider issued, named by an id and described by metadata the
host stores and hands back (docs/protocol.md 2.1; setup sessions and templates: H10.4). The
check refuses, before any HTTP request and never echoing a value: a missing id, an id that is not
a CreateOS sandbox id, metadata another provider wrote, and metadata that names another company,
environment or API endpoint than this call. Each kind words its refusals itself (:class:`Owner`);
the order of the checks is the same for all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from provider.createos.models import is_valid_id
from provider.errors import RequestRefused

PROVIDER_NAME: Final = "createos"


@dataclass(frozen=True)
class Owner:
    """The refusals of one kind of provider-issued sandbox; ``foreign`` holds ``{foreign}``,
    which becomes what differs (``"company and environment"``)."""

    missing: str
    malformed: str
    not_ours: str
    foreign: str


LEASE: Final = Owner(
    missing="This call needs a lease: providerLeaseId is missing.",
    malformed="The providerLeaseId is not a valid CreateOS sandbox id.",
    not_ours="This lease was not issued by the CreateOS provider.",
    foreign="This lease was issued for another {foreign}; it cannot be used with this environment.",
)
SETUP_SESSION: Final = Owner(
    missing="The setup session's providerLeaseId is not a CreateOS sandbox id.",
    malformed="The setup session's providerLeaseId is not a CreateOS sandbox id.",
    not_ours="This setup session was not started by the CreateOS provider.",
    foreign=(
        "This setup session was started for another {foreign}; it cannot be used with "
        "this environment."
    ),
)
TEMPLATE: Final = Owner(
    missing="The templateRef is not a valid CreateOS sandbox id.",
    malformed="The templateRef is not a valid CreateOS sandbox id.",
    not_ours="This template was not captured by the CreateOS provider.",
    foreign=(
        "This template was captured for another {foreign}; it is not deleted from this environment."
    ),
)


def check_owned(
    owner: Owner,
    sandbox_id: str | None,
    metadata: object,
    expected: Sequence[tuple[str, str, str]],
) -> tuple[str, Mapping[str, Any]]:
    """Refuse what ``owner``'s refusals describe; ``expected`` holds (what, metadata key, this
    call's value) triples. Returns the sandbox id and the metadata (empty when not a mapping)."""
    if not sandbox_id:
        raise RequestRefused(owner.missing)
    if not is_valid_id(sandbox_id):
        raise RequestRefused(owner.malformed)
    meta: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
    if meta.get("provider") != PROVIDER_NAME:
        raise RequestRefused(owner.not_ours)
    foreign = " and ".join(what for what, key, value in expected if meta.get(key) != value)
    if foreign:
        raise RequestRefused(owner.foreign.format(foreign=foreign))
    return sandbox_id, meta
