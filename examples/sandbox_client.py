#!/usr/bin/env python3
"""A client of `bottle serve`, the sandbox interface on a unix socket.

Standard library only (Python 3.11, Debian 12's). The protocol is
docs/SANDBOX.md; this file is its reference client and, run as a script, a
demo CI runs against a real bottle:

    bottle serve --socket /tmp/bottle.sock &
    python3 examples/sandbox_client.py --socket /tmp/bottle.sock \
        --manifest "$PWD/examples/bottle.toml" --agent demo

It boots a bottle, runs `echo`, checks a call past its deadline is killed,
writes a file, resets the bottle, checks the file is gone, and shuts the
bottle down; it exits non-zero on any failure.
Every result's evidence hash is recomputed here from the call this client
sent and the result it got back.

Library use:

    from sandbox_client import Sandbox
    sandbox = Sandbox("/tmp/bottle.sock")
    name = sandbox.boot("/abs/bottle.toml", "demo")
    result = sandbox.execute(name, ["ls", "-l"])
    report = sandbox.reset(name)
    sandbox.shutdown(name)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import socket
import sys
import urllib.parse
from dataclasses import dataclass
from typing import Any

#: How long a call may run when it names no deadline (the server's default).
DEFAULT_DEADLINE_MS = 60_000


# --- Errors: the server's vocabulary, keyed by code -------------------------


class SandboxError(Exception):
    """An error answer of `bottle serve`: a stable code, a message, a fix."""

    def __init__(self, code: str, message: str, fix: str | None, status: int):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fix = fix
        self.status = status


class NotAvailable(SandboxError):
    """BOT-X001: the bottle cannot offer the operation."""


class BootError(SandboxError):
    """BOT-X002, or a failed boot: the bottle or its in-box agent did not
    come up."""


class ToolTimeout(SandboxError):
    """BOT-X003: the call ran past its deadline and was killed."""


class ToolError(SandboxError):
    """BOT-X004: the call could not run (unknown tool, no such program,
    bad parameters, the channel broke)."""


class ResetError(SandboxError):
    """BOT-X005: the revert failed, or the bottle was already halted; the
    bottle is halted."""


class ResetDivergence(SandboxError):
    """BOT-X006: a verification source disagrees with its baseline; the
    bottle is halted. `report` says which and how."""

    def __init__(self, code, message, fix, status, report: dict[str, Any]):
        super().__init__(code, message, fix, status)
        self.report = report


class ChannelError(SandboxError):
    """BOT-X007: the in-box agent's channel carried a frame the host did not
    ask for; the call has no result and the channel was closed (the next
    call opens a new one)."""


class NoSuchBottle(SandboxError):
    """404: no bottle has that name."""


class EvidenceMismatch(SandboxError):
    """The result's evidence hash is not the one this client computes from
    the call it sent and the result it got (raised by the client)."""


ERRORS: dict[str, type[SandboxError]] = {
    "BOT-X001": NotAvailable,
    "BOT-X002": BootError,
    "BOT-X003": ToolTimeout,
    "BOT-X004": ToolError,
    "BOT-X005": ResetError,
    "BOT-X006": ResetDivergence,
    "BOT-X007": ChannelError,
}


# --- Calls, results and the evidence hash -----------------------------------


def call_json(
    command: dict[str, Any],
    env: dict[str, str],
    cwd: str | None,
    stdin: bytes,
    deadline_ms: int,
) -> bytes:
    """The call exactly as bottle serializes it (serde_json): fields in
    declaration order, compact, `env` and `params` objects with sorted keys,
    non-ASCII text as UTF-8, `stdin` in standard base64.

    The server hashes its own serialization of the call it parsed, so this
    client sends these very bytes: then the hash it recomputes is over the
    bytes it sent. (Numbers in tool parameters: keep to integers; a float
    may print differently in Python and in Rust.)
    """

    def compact(value: Any, sort: bool) -> str:
        return json.dumps(
            value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort
        )

    if "argv" in command:
        command_text = '{"argv":' + compact(list(command["argv"]), False) + "}"
    else:
        tool = command["tool"]
        command_text = (
            '{"tool":{"name":'
            + compact(tool["name"], False)
            + ',"params":'
            + compact(tool["params"], True)
            + "}}"
        )
    text = (
        '{"command":'
        + command_text
        + ',"env":'
        + compact(dict(sorted(env.items())), False)
        + ',"cwd":'
        + compact(cwd, False)
        + ',"stdin":'
        + compact(base64.b64encode(stdin).decode("ascii"), False)
        + ',"deadline":'
        + str(int(deadline_ms))
        + "}"
    )
    return text.encode("utf-8")


def evidence_hash(
    call: bytes, exit_code: int, stdout: bytes, stderr: bytes, truncated: bool
) -> str:
    """`sha256:<hex>` over a domain tag, the call's JSON, the exit code as
    decimal text, stdout, stderr and "1"/"0" for truncated, each preceded by
    its length as 8 bytes big-endian (bottle_core::sandbox::evidence_hash)."""
    digest = hashlib.sha256()
    for field in (
        b"bottle-evidence-v1",
        call,
        str(exit_code).encode("ascii"),
        stdout,
        stderr,
        b"1" if truncated else b"0",
    ):
        digest.update(len(field).to_bytes(8, "big"))
        digest.update(field)
    return "sha256:" + digest.hexdigest()


@dataclass(frozen=True)
class ToolResult:
    """What a call produced (`ToolResult` on the wire, outputs decoded)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool
    duration_ms: int
    evidence_hash: str


# --- The client ---------------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a unix socket (`bottle serve` listens on no TCP port)."""

    def __init__(self, path: str, timeout: float | None):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _bottle_path(name: str, *rest: str) -> str:
    """`bottles/<name>/…`, the name quoted so it stays one path segment."""
    return "/".join(["bottles", urllib.parse.quote(name, safe=""), *rest])


class Sandbox:
    """`bottle serve` on the unix socket at `socket_path`."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> Any:
        connection = _UnixConnection(self.socket_path, timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, "/v1/" + path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            answer = json.loads(data)
        except ValueError as err:
            raise SandboxError(
                "BOT-C047", f"the server answered no JSON ({err})", None, response.status
            ) from None
        if response.status == 200:
            return answer
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        code = str(error.get("code", "BOT-C047"))
        message = str(error.get("message", "no message"))
        fix = error.get("fix")
        if code == "BOT-X006":
            raise ResetDivergence(code, message, fix, response.status, answer.get("report", {}))
        kind = ERRORS.get(code) or (NoSuchBottle if response.status == 404 else SandboxError)
        raise kind(code, message, fix, response.status)

    def health(self) -> dict[str, Any]:
        """`{"status": "ok", "version": …}`."""
        return self._request("GET", "health", timeout=10)

    def boot(
        self,
        manifest: str,
        agent: str,
        backend: str | None = None,
        name: str | None = None,
    ) -> str:
        """Starts a bottle (`bottle start -d --yes`); its name. `manifest` is
        an absolute path on the host. Any failure is a `BootError` carrying
        the server's code."""
        request: dict[str, Any] = {"manifest": manifest, "agent": agent}
        if backend is not None:
            request["backend"] = backend
        if name is not None:
            request["name"] = name
        try:
            answer = self._request("POST", "bottles", json.dumps(request).encode())
        except SandboxError as err:
            if isinstance(err, BootError):
                raise
            raise BootError(err.code, err.message, err.fix, err.status) from err
        return answer["name"]

    def list(self) -> list[dict[str, Any]]:
        """The running bottles, as `bottle list --json` shows them."""
        return self._request("GET", "bottles", timeout=600)

    def execute(
        self,
        name: str,
        argv: list[str] | None = None,
        *,
        tool: str | None = None,
        params: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes = b"",
        deadline_ms: int = DEFAULT_DEADLINE_MS,
    ) -> ToolResult:
        """Runs `argv`, or the built-in `tool` with `params`, in the bottle
        `name`, and checks the result's evidence hash."""
        if (argv is None) == (tool is None):
            raise ValueError("give either argv or tool")
        command: dict[str, Any] = (
            {"argv": argv} if argv is not None else {"tool": {"name": tool, "params": params or {}}}
        )
        body = call_json(command, env or {}, cwd, stdin, deadline_ms)
        # The server answers once the call ended or was killed at its
        # deadline; a little more covers the channel and the box.
        answer = self._request(
            "POST", _bottle_path(name, "execute"), body, timeout=deadline_ms / 1000 + 30
        )
        result = ToolResult(
            exit_code=answer["exit_code"],
            stdout=base64.b64decode(answer["stdout"]),
            stderr=base64.b64decode(answer["stderr"]),
            truncated=answer["truncated"],
            duration_ms=answer["duration"],
            evidence_hash=answer["evidence_hash"],
        )
        expected = evidence_hash(
            body, result.exit_code, result.stdout, result.stderr, result.truncated
        )
        if expected != result.evidence_hash:
            raise EvidenceMismatch(
                "evidence",
                f"the server's evidence hash {result.evidence_hash} is not {expected}",
                "check that the call is sent as call_json writes it",
                200,
            )
        return result

    def reset(self, name: str) -> dict[str, Any]:
        """Reverts the bottle to its golden snapshot and verifies it from
        three sources; the `ResetReport`. A divergence raises
        `ResetDivergence` (the bottle is then halted)."""
        return self._request("POST", _bottle_path(name, "reset"), timeout=600)

    def shutdown(self, name: str) -> None:
        """Stops the bottle and removes everything it owns (`bottle stop`)."""
        self._request("DELETE", _bottle_path(name), timeout=600)


# --- The demo -----------------------------------------------------------------


def shown(value: Any) -> str:
    """Text from the box or the server, safe for a terminal: every control
    character escaped."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


class DemoFailure(Exception):
    """A step of the demo did not do what it should."""


def check(condition: bool, what: str) -> None:
    if not condition:
        raise DemoFailure(what)


DEMO_FILE = "/tmp/sandbox-client-demo.txt"


def demo(sandbox: Sandbox, manifest: str, agent: str, backend: str | None, name: str | None) -> None:
    health = sandbox.health()
    print(f"serve: {shown(health.get('status'))} (bottle {shown(health.get('version'))})")
    bottle = sandbox.boot(manifest, agent, backend=backend, name=name)
    print(f"booted {shown(bottle)}")
    try:
        listed = [b.get("name") for b in sandbox.list()]
        check(bottle in listed, f"{bottle} is not listed: {listed}")

        echoed = sandbox.execute(bottle, ["echo", "hello from the bottle"])
        check(
            echoed.exit_code == 0 and echoed.stdout == b"hello from the bottle\n",
            f"echo gave exit {echoed.exit_code}, stdout {shown(echoed.stdout)!r}",
        )
        print(f"echo: {shown(echoed.stdout.strip())} ({echoed.evidence_hash})")

        try:
            sandbox.execute(bottle, ["sleep", "30"], deadline_ms=300)
            raise DemoFailure("`sleep 30` with a deadline of 300 ms was not killed")
        except ToolTimeout as err:
            print(f"sleep 30: killed at its deadline ({shown(err.code)})")

        written = sandbox.execute(
            bottle,
            tool="write_file",
            params={"path": DEMO_FILE, "content": "written before the reset\n"},
        )
        check(written.exit_code == 0, f"write_file exited {written.exit_code}: {shown(written.stderr)}")
        present = sandbox.execute(bottle, ["cat", DEMO_FILE])
        check(
            present.stdout == b"written before the reset\n",
            f"the file reads {shown(present.stdout)!r}",
        )
        print(f"wrote {DEMO_FILE}")

        report = sandbox.reset(bottle)
        check(report.get("verified") is True, f"the reset is not verified: {report}")
        sources = ", ".join(shown(c.get("source")) for c in report.get("checks", []))
        print(
            f"reset: verified ({sources}), reverted by {shown(report.get('method'))}"
            f" in {report.get('revert')} + {report.get('verify')} ms"
        )

        gone = sandbox.execute(bottle, ["test", "-e", DEMO_FILE])
        check(gone.exit_code == 1, f"{DEMO_FILE} survived the reset (test -e exited {gone.exit_code})")
        print(f"{DEMO_FILE} is gone")
    finally:
        sandbox.shutdown(bottle)
        print(f"shut down {shown(bottle)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the socket `bottle serve` listens on")
    parser.add_argument("--manifest", required=True, help="the manifest, an absolute path")
    parser.add_argument("--agent", required=True, help="the agent to boot")
    parser.add_argument("--backend", help="docker or smolmachines (default: the server's)")
    parser.add_argument("--name", help="the bottle's name (default: the agent's)")
    args = parser.parse_args(argv)
    try:
        demo(Sandbox(args.socket), args.manifest, args.agent, args.backend, args.name)
    except SandboxError as err:
        print(f"error[{shown(err.code)}]: {shown(err.message)}", file=sys.stderr)
        if err.fix:
            print(f"  fix: {shown(err.fix)}", file=sys.stderr)
        if isinstance(err, ResetDivergence):
            for c in err.report.get("checks", []):
                if not c.get("matched"):
                    print(
                        f"  {shown(c.get('source'))}: expected {shown(c.get('expected'))}, "
                        f"observed {shown(c.get('observed'))}",
                        file=sys.stderr,
                    )
        return 1
    except (DemoFailure, OSError) as err:
        print(f"error: {shown(err)}", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
