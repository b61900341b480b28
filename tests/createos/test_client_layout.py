"""The client split by resource keeps the import surface of ``provider.createos.client``."""

from __future__ import annotations

from provider.createos import client, core, files, processes, sandboxes


def test_every_exported_name_resolves() -> None:
    for name in client.__all__:
        assert hasattr(client, name), name


def test_moved_names_are_the_same_objects() -> None:
    assert client.new_http_client is core.new_http_client
    assert client.HTTP11_READ_BYTES == core.HTTP11_READ_BYTES
    assert client.MAX_INPUT_BYTES == processes.MAX_INPUT_BYTES


def test_the_client_is_composed_of_every_resource() -> None:
    for mixin in (sandboxes.SandboxCalls, processes.ProcessCalls, files.FileCalls):
        assert issubclass(client.CreateOSClient, mixin)
    assert issubclass(client.CreateOSClient, core.ClientCore)
