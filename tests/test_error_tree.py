"""The worker's error tree, pinned: every deliberate error class, its parent, and what the
dispatcher makes of it (the JSON-RPC code and the level the failure is logged at).

docs/architecture.md (section "Errors") draws this tree; a class added, moved or mapped anew
fails here until the drawing and this table are changed together.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import provider
from provider.errors import ProviderError
from provider.rpc import wire
from provider.rpc.errors import error_for_exception, failure_log_level

W, P = wire.WORKER_ERROR, wire.INVALID_PARAMS

#: class name -> (parent's name, JSON-RPC code, log level of a request that fails with it)
TREE: dict[str, tuple[str, int, str]] = {
    "ProviderError": ("Exception", W, "error"),
    "ConfigError": ("ProviderError", W, "warn"),
    "RequestRefused": ("ProviderError", W, "warn"),
    "InvalidParams": ("RequestRefused", P, "warn"),
    "LeaseGone": ("RequestRefused", W, "warn"),
    "LinkEscapes": ("RequestRefused", W, "warn"),
    "RateLimitQueued": ("ProviderError", W, "error"),
    "OperationCancelled": ("ProviderError", W, "warn"),
    "CleanupUnconfirmed": ("ProviderError", W, "error"),
    "CommandLost": ("ProviderError", W, "error"),
    "ForkRefused": ("ProviderError", W, "error"),
    "SandboxStateError": ("ProviderError", W, "error"),
    "TransferError": ("ProviderError", W, "error"),
    "ArchiveRefused": ("TransferError", W, "error"),
    "CreateOSError": ("ProviderError", W, "error"),
    "APIStatusError": ("CreateOSError", W, "error"),
    "AuthError": ("APIStatusError", W, "error"),
    "NotFound": ("APIStatusError", W, "error"),
    "ExecStreamUnsupported": ("NotFound", W, "error"),
    "Conflict": ("APIStatusError", W, "error"),
    "OutputEvicted": ("APIStatusError", W, "error"),
    "RateLimited": ("APIStatusError", W, "error"),
    "ServerError": ("APIStatusError", W, "error"),
    "APIConnectionError": ("CreateOSError", W, "error"),
    "APITimeout": ("APIConnectionError", W, "error"),
    "APIProtocolError": ("CreateOSError", W, "error"),
    "InvalidIdentifier": ("APIProtocolError", W, "error"),
    "MalformedFrame": ("APIProtocolError", W, "error"),
    "StreamGap": ("APIProtocolError", W, "error"),
    "StreamError": ("APIProtocolError", W, "error"),
    "MissingExitStatus": ("APIProtocolError", W, "error"),
    "ReconnectBudgetExhausted": ("APIProtocolError", W, "error"),
}

#: Outside the worker's tree: the emulator imports nothing from the worker.
OUTSIDE = ("provider.emulator",)


def _worker_error_classes() -> list[type[ProviderError]]:
    """Every ProviderError subclass the worker defines, once every worker module is loaded."""
    for module in pkgutil.walk_packages(provider.__path__, "provider."):
        if not module.name.startswith(OUTSIDE) and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found: list[type[ProviderError]] = []
    pending: list[type[ProviderError]] = [ProviderError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


CLASSES = _worker_error_classes()


def _instance(cls: type[ProviderError]) -> ProviderError:
    """An instance of ``cls`` whatever its constructor asks for (the mapping reads only its
    class and its public message)."""
    error = cls.__new__(cls)
    ProviderError.__init__(error, f"{cls.__name__}: the public message")
    return error


def test_every_class_and_its_parent_is_the_drawn_tree() -> None:
    names = [cls.__name__ for cls in CLASSES]
    assert len(names) == len(set(names)), "two error classes share a name"
    drawn = {name: parent for name, (parent, _, _) in TREE.items()}
    actual = {cls.__name__: cls.__bases__[0].__name__ for cls in CLASSES}
    assert all(len(cls.__bases__) == 1 for cls in CLASSES)
    assert actual == drawn


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_the_dispatcher_answers_each_class_with_its_code_and_message(
    cls: type[ProviderError],
) -> None:
    _, code, level = TREE[cls.__name__]
    error = _instance(cls)
    assert error_for_exception("environmentExecute", error) == (code, str(error))
    assert failure_log_level(error) == level
    grouped = ExceptionGroup("one task failed", [error])
    assert error_for_exception("environmentExecute", grouped) == (code, str(error))
    assert failure_log_level(grouped) == level


def test_anything_else_is_an_internal_worker_error_with_a_generic_message() -> None:
    code, message = error_for_exception("environmentExecute", KeyError("api-key-secret"))
    assert code == wire.WORKER_ERROR
    assert message == (
        "environmentExecute failed: internal worker error (details in the worker log)"
    )
    assert failure_log_level(KeyError("x")) == "error"
