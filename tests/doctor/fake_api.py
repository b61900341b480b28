"""A small scripted CreateOS endpoint for the doctor, served by pytest-httpserver.

It answers exactly the calls the doctor makes, well-behaved by default (heartbeats every
0.2 s on both streams, idle pause after the PATCHed window, 404 for the second key, 409 on a
paused sandbox), with knobs that break one assumption or one call at a time. Every request is
logged as (method, path, status) for the tests' request counts.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import selectors
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from werkzeug import Request, Response

from provider.doctor.checks_agent import ANSWER_PATH

KEY = "doctor-key-Q7x-not-for-output"
OTHER_KEY = "doctor-other-key-not-for-output"
HEARTBEAT_S = 0.2


@dataclass
class Box:
    id: str
    name: str
    status: str = "running"
    window: int | None = None
    last_touch: float = field(default_factory=time.monotonic)

    def view(self) -> dict[str, Any]:
        status = "running" if self.status == "pausing-late" else self.status  # not yet seen
        return {"id": self.id, "name": self.name, "status": status}


@dataclass
class FakeCreateOS:
    """Knobs: ``foreign_status`` (second key's GET), ``idle_pauses``, ``fail`` (a
    ``(method, path regex)`` -> status map answered instead), ``drop_create_answer`` (the
    create happens but answers 500), ``limit_once`` (the first list answers 429 with this
    ``Retry-After``, ``""`` for none), ``delete_delay`` (seconds a sandbox delete takes),
    ``connect_heartbeats`` (off: a silent process's ``connect`` sends nothing until its exit),
    ``sse`` (the exec stream frames lines as ``data: {...}`` and adds ``: ping`` comments),
    ``guest_agent`` (off: ``127.0.0.1:1029`` refuses inside the sandbox), ``agent_pause_late``
    (the sandbox pauses only as the next exec arrives, which answers 409)."""

    foreign_status: int = 404
    idle_pauses: bool = True
    fail: dict[tuple[str, str], int] = field(default_factory=dict)
    drop_create_answer: bool = False
    limit_once: str | None = None
    delete_delay: float = 0.0
    connect_heartbeats: bool = True
    sse: bool = False
    guest_agent: bool = True
    agent_pause_late: bool = False
    agent_answer: str | None = None
    boxes: dict[str, Box] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    log: list[tuple[str, str, int]] = field(default_factory=list)
    armed: threading.Event = field(default_factory=threading.Event)
    deleting: threading.Event = field(default_factory=threading.Event)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, request: Request) -> Response:
        with self._lock:
            response = self._answer(request)
        self.log.append((request.method, request.path, response.status_code))
        return response

    def count(self, method: str, pattern: str) -> int:
        return sum(1 for m, p, _ in self.log if m == method and re.fullmatch(pattern, p))

    def _answer(self, request: Request) -> Response:
        method, path = request.method, request.path
        for (fail_method, pattern), status in self.fail.items():
            if method == fail_method and re.fullmatch(pattern, path):
                return _json({"status": "error", "message": "scripted", "code": status}, status)
        key = request.headers.get("X-Api-Key")
        if key not in (KEY, OTHER_KEY):
            return _json({"status": "fail", "data": "bad key"}, 401)
        if path == "/v1/sandboxes":
            return self._collection(request)
        match = re.fullmatch(r"/v1/sandboxes/([^/]+)(/.*)?", path)
        box = self.boxes.get(match.group(1)) if match else None
        if box is None or box.status == "destroyed":
            return _fail(404)
        if key == OTHER_KEY:
            return _fail(self.foreign_status)
        self._tick(box)
        return self._member(request, box, match.group(2) if match else None)

    def _tick(self, box: Box) -> None:
        """The idle pause, evaluated lazily: this request finds it paused if it came late."""
        now = time.monotonic()
        idle = now - box.last_touch
        if self.idle_pauses and box.window and box.status == "running" and idle > box.window:
            box.status = "paused"
        box.last_touch = now

    def _collection(self, request: Request) -> Response:
        if request.method == "POST":
            body = json.loads(request.get_data())
            box = Box(f"sb_fake{next(self._ids)}", body["name"])
            self.boxes[box.id] = box
            if self.drop_create_answer:
                return _json({"status": "error", "message": "lost", "code": 500}, 500)
            return _ok(box.view())
        if self.limit_once is not None:
            hint, self.limit_once = self.limit_once, None
            headers = {"Retry-After": hint} if hint else {}
            return _json({"status": "fail", "data": "slow down"}, 429, headers)
        wanted = request.args.get("status")
        views = [b.view() for b in self.boxes.values() if wanted in (None, b.status)]
        return _ok({"data": views, "pagination": {"total": len(views)}})

    def _member(self, request: Request, box: Box, rest: str | None) -> Response:
        method = request.method
        if rest is None:
            if method == "DELETE":
                self.deleting.set()
                time.sleep(self.delete_delay)
                box.status = "destroyed"
            elif method == "PATCH":
                box.window = json.loads(request.get_data())["auto_pause_after_seconds"]
                self.armed.set()
            return _ok(box.view())
        if rest in ("/pause", "/resume"):
            box.status = "paused" if rest == "/pause" else "running"
            return _ok(box.view())
        if box.status == "pausing-late":
            box.status = "paused"
        if box.status != "running":
            return _fail(409)
        if rest == "/exec":
            return self._exec(json.loads(request.get_data()), box)
        if rest == "/processes":
            return _ok({"process_id": "proc_fake1", "state": "running"})
        if rest.endswith("/connect"):
            beats = _beats(0.6, {"type": "heartbeat"}) if self.connect_heartbeats else [0.6]
            return _stream([*beats, {"type": "exit", "exit_code": 0}])
        if rest == "/files" and method == "PUT":
            self.files[request.args["path"]] = request.get_data()
            return _ok({"bytes": len(self.files[request.args["path"]])})
        if rest == "/files" and request.args["path"] in self.files:
            return Response(self.files[request.args["path"]], 200)
        return _fail(404)

    def _exec(self, body: dict[str, Any], box: Box) -> Response:
        script = body["args"][-1]
        if "127.0.0.1/1029" in script:  # the guest agent check asks the sandbox to pause
            if self.guest_agent:
                box.status = "pausing-late" if self.agent_pause_late else "paused"
                self.agent_answer = "HTTP/1.1 202 Accepted"
            else:
                self.agent_answer = "no answer (connection refused or closed)"
            return _ok({"result": {"stdout": "", "stderr": "", "exit_code": 0}})
        if body["cmd"] == "/bin/cat" and script == ANSWER_PATH:
            found = self.agent_answer
            result = {"stdout": found or "", "stderr": "", "exit_code": 0 if found else 1}
            return _ok({"result": result})
        if body["cmd"] == "/usr/bin/env" or "paperclip-kill" in script:
            return _run_for_real(body)  # the worker's own command path (its token, its kill)
        if not body.get("stream"):
            return _ok({"result": {"stdout": "", "stderr": "", "exit_code": 0}})
        if "child-done" in script:
            return _stream([{"stdout": "leader-done\n"}, {"exit_code": 0}])
        return _stream([*_beats(0.6, {"hb": True}), {"exit_code": 0}], sse=self.sse)


def _run_for_real(body: dict[str, Any]) -> Response:
    """Run the exec on this machine, as the sandbox would: buffered, or streamed as frames
    until both pipes close (the worst case: a child holding stdout keeps the stream open)."""
    argv = [body["cmd"], *body["args"]]
    stdin = str(body.get("stdin") or "").encode()
    if not body.get("stream"):
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=60, check=False)
        result = {"stdout": done.stdout.decode(), "stderr": done.stderr.decode()}
        return _ok({"result": {**result, "exit_code": done.returncode}})
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(stdin)
    process.stdin.close()
    pipes = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr"}

    def frames() -> Iterator[bytes]:
        try:
            with selectors.DefaultSelector() as selector:
                for fd in pipes:
                    selector.register(fd, selectors.EVENT_READ)
                while selector.get_map():
                    for key, _ in selector.select():
                        data = os.read(key.fd, 65536)
                        if not data:
                            selector.unregister(key.fd)
                            continue
                        yield json.dumps({pipes[key.fd]: data.decode()}).encode() + b"\n"
            yield json.dumps({"exit_code": process.wait()}).encode() + b"\n"
        finally:  # the client may hang up mid-stream: nothing of ours outlives the response
            if process.poll() is None:
                process.kill()
            with process:
                pass

    return Response(frames(), 200, content_type="application/x-ndjson", direct_passthrough=True)


def _beats(seconds: float, frame: dict[str, Any]) -> list[dict[str, Any] | float]:
    count = round(seconds / HEARTBEAT_S)
    return [item for _ in range(count) for item in (HEARTBEAT_S, frame)]


def _stream(items: list[dict[str, Any] | float], *, sse: bool = False) -> Response:
    """NDJSON lines (with ``sse``: ``data:`` lines, each after a ``: ping`` comment and a
    blank line); a float item is a pause of that many seconds."""

    def body() -> Iterator[bytes]:
        for item in items:
            if isinstance(item, float):
                time.sleep(item)
            elif sse:
                yield b": ping\n\ndata: " + json.dumps(item).encode() + b"\n"
            else:
                yield json.dumps(item).encode() + b"\n"

    return Response(body(), 200, content_type="application/x-ndjson", direct_passthrough=True)


def _ok(data: Any) -> Response:
    return _json({"status": "success", "data": data}, 200)


def _fail(status: int) -> Response:
    return _json({"status": "fail", "data": None}, status)


def _json(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status, headers, content_type="application/json")
