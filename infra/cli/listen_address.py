"""Where `serve` and `run` listen: their `--host`/`--port` options, and the check that
this machine lets a new server listen there before anything starts.

granian binds each worker's socket with SO_REUSEPORT. A second server on a port that
another process of the same user already listens on therefore does not fail: the
kernel shares the port and spreads the connections over both (measured: a `run` on a
second store answered 7 of 40 requests meant for the first, with 401s). granian cannot
be told not to, so the address is tried first with a plain socket (no SO_REUSEPORT),
which any listener refuses, taskward or not. The same bind names a host that is not an
address of this machine, where granian would dump a panic.

Port 0 is settled by the same bind: the kernel picks a free port for the probe, and the
server is started on that port, so `run`'s `serving on` line and granian's own name the
port that answers (granian given 0 listened on a random port and printed `:0`).

What the check cannot close: a server that starts listening between the check and
granian's own bind (two servers started together; for `run`, during its migrations).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable
from typing import TypeVar

import click

from infra.cli.option_types import DecimalRange

Command = TypeVar("Command", bound=Callable[..., object])

# Port 0 is accepted: `ensure_free` turns it into a free port the kernel picks.
PORT = DecimalRange(0, 65535)


class IPAddress(click.ParamType):
    """An IPv4 or IPv6 address, normalised: granian listens on an address, never on a
    name (it raised `ValueError: invalid IP address syntax` for `localhost`)."""

    name = "ip-address"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            return str(ipaddress.ip_address(str(value)))
        except ValueError:
            self.fail(f"{value!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)",
                      param, ctx)


def listen_options(command: Command) -> Command:
    """`--host` and `--port`, the same for every command that serves the API."""
    command = click.option("--port", default=8000, show_default=True, type=PORT,
                           help="TCP port to listen on.")(command)
    return click.option("--host", default="127.0.0.1", show_default=True, type=IPAddress(),
                        help="IP address of this machine to listen on.")(command)


def ensure_free(host: str, port: int) -> int:
    """The port a server could listen on at `host` now: `port` itself, or for 0 the free
    one the kernel picked (the server must be started on it, so that what it prints and
    what answers agree); otherwise end the command with one line saying why (exit
    status 1).

    SO_REUSEADDR is set so that connections of an earlier server still in TIME_WAIT do
    not block a restart; a socket that listens still refuses the bind.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.ClickException(_refusal(host, port, exc)) from None
        return int(probe.getsockname()[1])


def url_authority(host: str, port: int) -> str:
    """`host:port` as a URL writes it: an IPv6 address in brackets (`[::1]:8000`), or
    `http://::1:8000` would be no URL a browser or curl takes."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _refusal(host: str, port: int, exc: OSError) -> str:
    where = url_authority(host, port)
    if exc.errno == errno.EADDRINUSE:
        return (f"{where} is already in use (another taskward or another program listens "
                "there); stop it or choose another --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {host}: {exc.strerror}; --host must be an IP address "
                "of this machine")
    return f"cannot listen on {where}: {exc.strerror}"
