"""The host's verb names this worker serves, in the order ``supportedMethods`` lists them.

docs/protocol.md H10.1 and H10.4: the ten lease and transfer verbs, then the interactive-setup and
template verbs, then the interactive groups (login terminals, duplex channels). Shared by
:mod:`provider.rpc` (the handshake's order, the SDK's optional hooks) and :mod:`provider.driver`
(its method table); it knows neither. Standard library only: the handshake imports it before
anything else is loaded.
"""

from __future__ import annotations

from typing import Final

LEASE_VERBS: Final = (
    "environmentValidateConfig",
    "environmentProbe",
    "environmentAcquireLease",
    "environmentResumeLease",
    "environmentReleaseLease",
    "environmentDestroyLease",
    "environmentRealizeWorkspace",
    "environmentExecute",
    "environmentSyncIn",
    "environmentSyncOut",
)
SETUP_VERBS: Final = (
    "environmentStartInteractiveSetup",
    "environmentGetInteractiveSetup",
    "environmentCaptureTemplate",
    "environmentCancelInteractiveSetup",
    "environmentDeleteTemplate",
)
LOGIN_PTY_VERBS: Final = ("loginPtyOpen", "loginPtyInput", "loginPtyStop", "loginPtyClose")
DUPLEX_VERBS: Final = (
    "duplexChannelOpen",
    "duplexChannelWrite",
    "duplexChannelStop",
    "duplexChannelClose",
)

ENVIRONMENT_VERBS: Final = (*LEASE_VERBS, *SETUP_VERBS)
INTERACTIVE_VERBS: Final = (*LOGIN_PTY_VERBS, *DUPLEX_VERBS)
SERVED_VERBS: Final = (*ENVIRONMENT_VERBS, *INTERACTIVE_VERBS)
