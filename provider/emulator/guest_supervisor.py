# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: PTH100, PTH120
"""In-guest supervisor: pid 1 of one sandbox's PID namespace, run by the host's python3.

Standard library only; the emulator never imports it, it copies this file and its helpers into
its data dir and bubblewrap binds that folder read-only into the guest: ``guest_channel.py``
(the control socket: ``marshal`` requests in, JSON replies and events out, file descriptors
passed with SCM_RIGHTS, so process output and file bodies never pass through this process),
``guest_ops.py`` (what each request does), ``guest_trees.py`` (one subreaper per command),
``guest_members.py`` (a tree's processes, and killing them), ``guest_files.py`` (file
operations) and ``guest_agent.py`` (``127.0.0.1:1029``, opened when argv[2] is ``agent``: its
requests become ``self`` events). Only builtin modules are imported at start: this start-up is
on the create path.

This module is the loop: requests on the socket (fd given as argv[1]), reaper status pipes,
reaping, and the kill rounds of trees being deleted. Events (``exit``, ``tree_exit``, naming
the ``tree`` id a spawn answered) carry no id. When the socket closes the supervisor exits, and
the kernel kills every process of the namespace with it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no enum import, unlike signal
import _socket
import errno
import os
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

if TYPE_CHECKING or __package__:  # imported by the emulator's tests
    from . import guest_agent
    from .guest_channel import NOTHING, SIGNAL_NAMES, Channel
    from .guest_files import OpError
    from .guest_members import descendants, freeze_and_kill, scan, send, unowned
    from .guest_ops import OPS, op_unknown
    from .guest_trees import Tree
else:  # run in the guest as a script: the helpers are bound next to it
    sys.dont_write_bytecode = True  # the folder is read-only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import guest_agent
    from guest_channel import NOTHING, SIGNAL_NAMES, Channel
    from guest_files import OpError
    from guest_members import descendants, freeze_and_kill, scan, send, unowned
    from guest_ops import OPS, op_unknown
    from guest_trees import Tree

TREE_POLL_S = 0.05


class Supervisor:
    """One selector loop: control requests, reaper status pipes, reaping and kill rounds."""

    def __init__(self, ctrl: _socket.socket, agent: guest_agent.Agent | None = None) -> None:
        self.channel = Channel(ctrl)
        self.agent = agent
        self.poller = select.epoll()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.trees: dict[int, Tree] = {}  # tree id -> tree, until its tree_exit is sent
        self.by_fd: dict[int, Tree] = {}  # status pipe -> tree, until the pipe ends
        self.reapers: dict[int, Tree] = {}  # live reaper pid -> its tree
        self.next_tid = 0

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        _signal.set_wakeup_fd(self.wake_w)
        _signal.signal(_signal.SIGCHLD, lambda *_: None)
        self.poller.register(self.channel.fileno(), select.EPOLLIN)
        self.poller.register(self.wake_r, select.EPOLLIN)
        if self.agent is not None:
            self.poller.register(self.agent.fileno(), select.EPOLLIN)
        self.channel.send({"event": "ready", "pid": os.getpid()})
        while True:
            try:
                ready = self.poller.poll(self.timeout())
            except InterruptedError:
                ready = []
            if self.agent is not None:  # also drops its expired connections
                for action, reason in self.agent.service():
                    self.channel.send(guest_agent.event(action, reason))
            for fd, _ in ready:
                if self.agent is not None and fd == self.agent.fileno():
                    continue
                if fd == self.wake_r:
                    try:
                        while os.read(self.wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                elif fd in self.by_fd:
                    self.read_status(self.by_fd[fd])
                elif not self.read_ctrl():
                    return
            self.poll_trees()

    def read_ctrl(self) -> bool:
        """Perform the next request, if one is ready; False once the socket closed."""
        msg = self.channel.receive()
        if msg is None:
            return False
        if msg is NOTHING:
            return True
        rid = msg.get("id")
        try:
            OPS.get(str(msg.get("op")), op_unknown)(self, rid, msg)
        except OpError as exc:
            self.channel.fail(rid, exc.code, exc.message)
        except OSError as exc:
            self.channel.fail(rid, "os", os.strerror(exc.errno or errno.EIO))
        return True

    def timeout(self) -> float:
        """How long the loop may sleep: kill rounds and agent connections have deadlines."""
        waits = []
        if any(t.detached or t.deadline is not None for t in self.trees.values()):
            waits.append(TREE_POLL_S)
        expiry = self.agent.timeout() if self.agent is not None else None
        if expiry is not None:
            waits.append(expiry)
        return min(waits) if waits else -1

    # -- trees ----------------------------------------------------------------------------
    def reap(self) -> None:
        """Reap ended reapers, and leaders whose reaper a guest SIGKILLed (pid 1 adopted them)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for tree in self.trees.values():
                if tree.status is None and tree.leader == pid:
                    self.leader_exit(tree, status)

    def read_status(self, tree: Tree) -> None:
        try:
            chunk = os.read(tree.fd, 4096)
        except BlockingIOError:
            return
        if chunk:
            tree.buf += chunk
            self.feed(tree)
            return
        self.poller.unregister(tree.fd)
        os.close(tree.fd)
        del self.by_fd[tree.fd]
        if not tree.finished:  # the reaper was killed: its orphans now belong to pid 1
            tree.detached = True
            self.reapers.pop(tree.reaper, None)

    def feed(self, tree: Tree) -> None:
        for line in tree.lines():
            if line.startswith(b"X") and tree.status is None:
                self.leader_exit(tree, int(line[1:]))
            elif line == b"D":
                self.finish(tree)

    def leader_exit(self, tree: Tree, status: int) -> None:
        tree.status = status
        event: dict[str, Any] = {"event": "exit", "tree": tree.tid}
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            event["signal"] = SIGNAL_NAMES.get(number, f"SIG{number}")
        else:
            event["code"] = os.waitstatus_to_exitcode(status)
        self.channel.send(event)

    def finish(self, tree: Tree) -> None:
        """The tree is empty: report it (after the leader's exit) and answer the kills."""
        if tree.finished:
            return
        tree.finished = True
        if tree.status is None:  # a killed reaper took the leader's status with it
            self.leader_exit(tree, _signal.SIGKILL)
        self.channel.send({"event": "tree_exit", "tree": tree.tid})
        for rid in tree.waiters:
            self.channel.reply(rid)
        del self.trees[tree.tid]
        self.reapers.pop(tree.reaper, None)

    def members(self, tree: Tree) -> list[int]:
        """Live processes of the tree: below its reaper, or unowned once it is detached."""
        if tree.detached:
            return unowned(scan(), set(self.reapers))
        return descendants(tree.reaper, scan())

    def poll_trees(self) -> None:
        now = time.monotonic()
        for tree in list(self.trees.values()):
            if tree.detached and not self.members(tree) and not self.members(tree):
                self.finish(tree)  # empty twice in a row: /proc is not read atomically
            elif tree.deadline is not None and now >= tree.deadline:
                if not tree.detached:
                    send(tree.reaper, _signal.SIGCONT)  # a guest may have stopped it
                freeze_and_kill(self._members_of(tree))

    def _members_of(self, tree: Tree) -> Callable[[], list[int]]:
        def members() -> list[int]:
            return self.members(tree)

        return members


def main() -> None:
    os.umask(0o022)
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)
    ctrl = _socket.socket(fileno=fd)
    ctrl.setblocking(True)
    os.chdir("/")
    agent = None
    if sys.argv[2:] == ["agent"]:
        try:
            agent = guest_agent.Agent.open()
        except OSError as exc:  # logged to the sandbox's supervisor.log; the guest runs on
            sys.stderr.write(f"guest agent: cannot listen on 127.0.0.1:1029: {exc}\n")
    Supervisor(ctrl, agent).run()


if __name__ == "__main__":
    main()
