"""Fork tokens (provider.driver.leases.forks): how a fork, which takes no name, is recognised
again."""

from __future__ import annotations

import re

from provider.createos.models import SandboxView
from provider.driver.leases.forks import carries_token, fork_token


def test_fork_tokens_are_fresh_env_keys() -> None:
    tokens = {fork_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(re.fullmatch(r"PAPERCLIP_CREATEOS_FORK_[0-9a-f]{32}", t) for t in tokens)


def test_a_fork_is_recognised_by_its_token_and_its_source_when_the_view_names_one() -> None:
    token = fork_token()
    mine = SandboxView("sb_1", "running", envs=["HOME_ENV", token], forked_from="sb_tpl")
    assert carries_token(mine, token, "sb_tpl")
    assert carries_token(mine, token)
    assert not carries_token(mine, fork_token(), "sb_tpl")  # another fork's token
    assert not carries_token(mine, token, "sb_other")  # a fork of another template
    unsourced = SandboxView("sb_2", "running", envs={token: "***"})  # no forked_from shown
    assert carries_token(unsourced, token, "sb_tpl")
    assert not carries_token(SandboxView("sb_3", "running", name=token), token)  # names differ
