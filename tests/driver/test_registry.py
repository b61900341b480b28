"""The lease registry (docs/protocol.md 2.12), as a plain mapping (unit)."""

from __future__ import annotations

from provider.driver.interactive.registry import LeaseRef, LeaseRegistry


def test_the_latest_registration_wins_and_remove_forgets() -> None:
    registry: LeaseRegistry[str] = LeaseRegistry()
    ref = LeaseRef("company", "env", "sb_1")
    registry.register(ref, "config A")
    registry.register(ref, "config B")
    assert registry.lookup(ref) == "config B" and len(registry) == 1
    assert registry.lookup(LeaseRef("company", "other-env", "sb_1")) is None
    assert registry.lookup(LeaseRef("other", "env", "sb_1")) is None
    registry.remove(ref)
    registry.remove(ref)  # twice is fine
    assert registry.lookup(ref) is None and len(registry) == 0
