"""The reuse rules as pure functions: reusable, keepable, the name tag, the reaper's selection."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from provider.config import parse_config
from provider.createos.models import SandboxView
from provider.driver.core.names import is_ours, name_token, scope_tag
from provider.driver.leases.placement import egress_in_place, is_keepable
from provider.driver.leases.reuse import (
    ReapChoice,
    is_reusable,
    parse_time,
    select_for_reaping,
)

BASE: dict[str, Any] = {"apiUrl": "http://127.0.0.1:8790", "apiKey": "k", "shape": "s-1vcpu-1gb"}
REUSE = parse_config({**BASE, "reuseLease": True})
NO_REUSE = parse_config(BASE)
TAG = scope_tag("company-1", "env-1", "http://127.0.0.1:8790")
OTHER_TAG = scope_tag("company-1", "env-2", "http://127.0.0.1:8790")
NOW = datetime(2026, 9, 20, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0


def stamp(seconds_ago: float) -> str:
    moment = datetime.fromtimestamp(NOW - seconds_ago, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def kept(
    sandbox_id: str,
    *,
    paused_ago: float | None = None,
    created_ago: float = 10 * HOUR,
    tag: str = TAG,
    status: str = "paused",
    name: str | None = None,
) -> SandboxView:
    return SandboxView(
        id=sandbox_id,
        status=status,
        name=name if name is not None else name_token(tag),
        created_at=stamp(created_ago),
        paused_at=None if paused_ago is None else stamp(paused_ago),
    )


def select(views: list[SandboxView], **overrides: Any) -> list[ReapChoice]:
    options: dict[str, Any] = {
        "tag": TAG,
        "now": NOW,
        "max_idle_seconds": 86_400,
        "max_kept": 5,
        "current": "sb_current",
        "current_kept": False,
    }
    options.update(overrides)
    return select_for_reaping(views, **options)


# -- reusable and keepable ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workspace", "agent", "reusable"),
    [
        ("ws-1", "agent-1", True),
        (None, "agent-1", False),
        ("ws-1", None, False),
        ("", "agent-1", False),
        ("ws-1", "   ", False),
        (42, "agent-1", False),
        ("ws-1", ["agent-1"], False),
    ],
)
def test_a_lease_is_reusable_only_with_reuse_on_and_both_ids(
    workspace: object, agent: object, reusable: bool
) -> None:
    assert is_reusable(REUSE, workspace, agent) is reusable
    assert is_reusable(NO_REUSE, workspace, agent) is False


@pytest.mark.parametrize(
    ("metadata", "keepable"),
    [
        ({"reuseLease": True, "autoPauseAfterSeconds": 600}, True),
        ({"reuseLease": True}, False),  # issued before the warm window: no stored window
        ({"reuseLease": True, "autoPauseAfterSeconds": 0}, False),  # the window changed
        ({"reuseLease": True, "autoPauseAfterSeconds": True}, False),
        ({"reuseLease": False, "autoPauseAfterSeconds": 600}, False),
        ({"reuseLease": "true"}, False),
        ({"reuseLease": 1}, False),
        ({}, False),
        (None, False),
    ],
)
def test_release_keeps_only_with_reuse_on_now_and_a_reusable_lease(
    metadata: dict[str, Any] | None, keepable: bool
) -> None:
    assert is_keepable(REUSE, metadata) is keepable
    assert is_keepable(NO_REUSE, metadata) is False


# -- the name tag ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "stored", "in_place"),
    [
        (["github.com", "10.0.0.0/8"], ["github.com", "10.0.0.0/8"], True),
        ([], [], True),
        (["*"], [], True),  # a fork's allow-all (2.9.3) is the stored allow-all
        (["10.0.0.0/8", "github.com"], ["github.com", "10.0.0.0/8"], False),  # order counts
        (["*"], ["github.com"], False),  # widened by someone: resume puts it back
        ([], ["github.com"], False),
        (["github.com"], [], False),
        (None, [], False),  # the view did not say: PUT
        ("github.com", ["github.com"], False),
    ],
)
def test_resume_puts_the_egress_only_when_the_view_holds_another_list(
    current: object, stored: list[str], in_place: bool
) -> None:
    assert egress_in_place(current, stored) is in_place


def test_the_tag_is_the_first_twelve_hex_of_the_scope_hash() -> None:
    expected = hashlib.sha256(b"company-1\nenv-1\nhttp://127.0.0.1:8790").hexdigest()[:12]
    assert expected == TAG
    assert re.fullmatch(r"[0-9a-f]{12}", TAG)


def test_the_tag_is_stable_and_differs_when_company_environment_or_url_changes() -> None:
    assert scope_tag("company-1", "env-1", "http://127.0.0.1:8790") == TAG
    variants = {
        scope_tag("company-2", "env-1", "http://127.0.0.1:8790"),
        scope_tag("company-1", "env-2", "http://127.0.0.1:8790"),
        scope_tag("company-1", "env-1", "http://127.0.0.1:8791"),
        scope_tag("company-1\nenv-1", "", "http://127.0.0.1:8790"),
    }
    assert TAG not in variants and len(variants) == 4


def test_names_carry_the_tag_and_a_fresh_uuid_and_nothing_else() -> None:
    first, second = name_token(TAG), name_token(TAG)
    uuid_re = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
    assert re.fullmatch(f"pc-{TAG}-{uuid_re}", first)
    assert first != second
    assert is_ours(first, TAG) and not is_ours(first, OTHER_TAG)


@pytest.mark.parametrize(
    "name",
    [
        None,
        "",
        "my-own-sandbox",
        "pc-setup-0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21",
        "pc-0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21",  # the old untagged form
        f"pc-{TAG}-",
        f"pc-{TAG}-handmade",
        f"pc-{TAG}-0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21-copy",
        f"pc-{TAG.upper()}-0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21",
        f"xpc-{TAG}-0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21",
    ],
)
def test_only_names_made_with_this_tag_are_ours(name: str | None) -> None:
    assert not is_ours(name, TAG)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-09-20T12:00:00Z", NOW),
        ("2026-09-20T12:00:00.000Z", NOW),
        ("2026-09-20T14:00:00+02:00", NOW),
        ("2026-09-20T12:00:00", NOW),  # naive: UTC
        ("yesterday", None),
        ("", None),
        (None, None),
        (1758369600, None),
    ],
)
def test_api_timestamps_are_read_as_epoch_seconds(text: object, expected: float | None) -> None:
    assert parse_time(text) == expected


# -- selection ---------------------------------------------------------------------------------


def test_kept_sandboxes_idle_longer_than_the_bound_are_chosen() -> None:
    views = [kept("sb_old", paused_ago=601), kept("sb_young", paused_ago=599)]
    assert select(views, max_idle_seconds=600) == [ReapChoice("sb_old", "idle")]


def test_age_counts_from_paused_at_else_created_at() -> None:
    views = [
        kept("sb_recently_paused", paused_ago=60, created_ago=30 * 86_400),
        kept("sb_never_paused_stamp", created_ago=2 * 86_400),
    ]
    assert select(views) == [ReapChoice("sb_never_paused_stamp", "idle")]


def test_the_oldest_beyond_the_cap_are_chosen_oldest_first() -> None:
    views = [kept(f"sb_{age}", paused_ago=age * HOUR) for age in (3, 7, 1, 5, 2, 6, 4)]
    assert select(views) == [ReapChoice("sb_7", "over the cap"), ReapChoice("sb_6", "over the cap")]


def test_idle_ones_go_first_and_the_cap_counts_what_is_left() -> None:
    views = [kept(f"sb_{age}", paused_ago=age * HOUR) for age in (1, 2, 3, 4, 5, 6, 30)]
    assert select(views) == [ReapChoice("sb_30", "idle"), ReapChoice("sb_6", "over the cap")]


def test_the_lease_just_kept_counts_toward_the_cap_but_is_never_chosen() -> None:
    views = [kept(f"sb_{age}", paused_ago=age * HOUR) for age in (1, 2, 3, 4, 5)]
    chosen = select(views, current="sb_new", current_kept=True)
    assert chosen == [ReapChoice("sb_5", "over the cap")]
    listed = [*views, kept("sb_new", paused_ago=0)]
    assert select(listed, current="sb_new", current_kept=True) == chosen


def test_the_current_lease_is_never_chosen_even_when_oldest_or_idle() -> None:
    views = [kept("sb_current", paused_ago=40 * 86_400), kept("sb_other", paused_ago=HOUR)]
    assert select(views, max_kept=5) == []
    # Over the cap the newer one goes: the current lease still counts but is never chosen.
    assert select(views, max_kept=1) == [ReapChoice("sb_other", "over the cap")]
    assert select(views[:1], max_kept=1, max_idle_seconds=600, current_kept=True) == []


def test_an_acquired_lease_does_not_count_toward_the_cap() -> None:
    views = [kept(f"sb_{age}", paused_ago=age * HOUR) for age in (1, 2, 3, 4, 5)]
    assert select(views, current="sb_running", current_kept=False) == []


def test_zero_means_no_bound() -> None:
    views = [kept(f"sb_{age}", paused_ago=age * 86_400) for age in range(2, 13)]
    assert select(views, max_idle_seconds=0, max_kept=0) == []
    assert len(select(views, max_idle_seconds=0, max_kept=5)) == 6
    assert [c.reason for c in select(views, max_kept=0)] == ["idle"] * 11


def test_never_another_scope_untagged_setup_or_unpaused_sandbox() -> None:
    ancient = 90 * 86_400
    decoys = [
        kept("sb_other_env", paused_ago=ancient, tag=OTHER_TAG),
        kept("sb_other_company", paused_ago=ancient, tag=scope_tag("c-2", "env-1", "x")),
        kept("sb_untagged", paused_ago=ancient, name="my-own-sandbox"),
        kept("sb_nameless", paused_ago=ancient, name=""),
        kept("sb_setup", paused_ago=ancient, name="pc-setup-0b5c3b1e-9a55-4b8e-8f0e-3c2f4f6a7d21"),
        kept("sb_warm", paused_ago=ancient, status="running"),
        kept("sb_pausing", paused_ago=ancient, status="pausing"),
        kept("sb_gone", paused_ago=ancient, status="destroyed"),
    ]
    assert select(decoys, max_kept=1, max_idle_seconds=600) == []
    mine = kept("sb_mine", paused_ago=ancient)
    assert select([*decoys, mine], max_idle_seconds=600) == [ReapChoice("sb_mine", "idle")]


def test_a_sandbox_without_a_readable_time_is_never_idle_and_counts_as_newest() -> None:
    undated = SandboxView(id="sb_undated", status="paused", name=name_token(TAG))
    views = [undated, kept("sb_old", paused_ago=2 * HOUR), kept("sb_older", paused_ago=3 * HOUR)]
    assert select(views, max_idle_seconds=600, max_kept=5) == [
        ReapChoice("sb_old", "idle"),
        ReapChoice("sb_older", "idle"),
    ]
    assert select(views, max_idle_seconds=0, max_kept=1) == [
        ReapChoice("sb_older", "over the cap"),
        ReapChoice("sb_old", "over the cap"),
    ]
