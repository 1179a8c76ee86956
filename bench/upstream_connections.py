"""What an upstream attempt pays for its connection: kept from the attempt before, or new.

Run from the repository root: `.venv/bin/python -m bench.upstream_connections`
(options: `--attempts 200`, `--rounds 3`, `--deltas 8`). About 20 seconds.

A stand-in upstream (a keep-alive HTTP/1.1 server streaming `--deltas` Chat Completions
deltas, then `[DONE]`, in one write; over TLS with a certificate made for the run, and
in plain text; in a child process, so its CPU is not counted) takes `--attempts`
requests in turn through the engine's transport (`transport._pump` on the process's
kind of client, `_new_client`), per round and way:

- kept: as the transport does, the connection goes back to the pool after `[DONE]` and
  the next attempt reuses it;
- new: each request asks `Connection: close`, so each attempt opens a connection of its
  own (and does its TLS handshake): what every attempt paid while the transport left a
  body unread after `[DONE]`, which made the pool close the connection.

Printed per way: the time to the first payload (p50 and p99, from the request's
start), this process's CPU per attempt, and the connections the upstream accepted per
attempt. On loopback the time is the handshake's work alone; across a network a new
connection adds a round trip (TCP), and TLS another one or two, before the request
leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from core.engines.upstream.transport import END, _new_client, _pump
from tests.upstream.helpers import self_signed, serving_tls
from tests.upstream.scripted import read_request

_DELTA = (b'data: {"choices":[{"index":0,"delta":{"content":" word"},'
          b'"finish_reason":null}]}\n\n')


async def serve(deltas: int, cert: Path | None, key: Path | None) -> None:
    """The stand-in: prints its port, then each connection it accepts as a line."""
    answer = (_DELTA * deltas) + b"data: [DONE]\n\n"
    body = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(answer), answer))

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        print("connection", flush=True)
        try:
            while True:
                head, _ = await read_request(reader)
                writer.write(body)
                await writer.drain()
                if b"connection: close" in head:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    tls = serving_tls(key, cert) if cert is not None and key is not None else None
    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=tls)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class _FirstPayload:
    """Where a stream's items go (`transport.Into`): takes the time of the first batch
    of payloads; a failure stops the bench."""

    def __init__(self) -> None:
        self.first_at: float | None = None

    def put(self, item: Any) -> None:
        if isinstance(item, list) and self.first_at is None:
            self.first_at = time.perf_counter()
        elif item is not END and not isinstance(item, list):
            raise RuntimeError(f"the stand-in's stream failed: {item!r}")


async def attempts(url: str, count: int, headers: dict[str, str]) -> tuple[list[float], float]:
    """`count` requests in turn: each one's ms to its first payload, and the CPU seconds
    of this process in all."""
    client = await _new_client(httpx.Limits(max_connections=4))
    firsts: list[float] = []
    async with client:
        started_cpu = time.process_time()
        for _ in range(count):
            into = _FirstPayload()
            started = time.perf_counter()
            await _pump(client, url, {"stream": True}, headers, httpx.Timeout(10), into)
            assert into.first_at is not None
            firsts.append((into.first_at - started) * 1000)
        return firsts, time.process_time() - started_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deltas", type=int, default=8)
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the stand-in: "<cert> <key>"
    args = parser.parse_args()
    if args.serve is not None:
        cert, key = (Path(p) for p in args.serve.split()) if args.serve else (None, None)
        asyncio.run(serve(args.deltas, cert, key))
        return
    with tempfile.TemporaryDirectory() as scratch:
        key, cert = self_signed(Path(scratch))
        os.environ["SSL_CERT_FILE"] = str(cert)  # trusted as an operator's private CA
        ways = {"kept": {}, "new": {"Connection": "close"}}
        print("| scheme | connection | first payload p50 / p99 ms | CPU-ms per attempt "
              "| connections per attempt |")
        print("|---|---|---|---|---|")
        for scheme, serve_arg in (("https", f"{cert} {key}"), ("http", "")):
            stand_ins = {way: subprocess.Popen(
                [sys.executable, "-m", "bench.upstream_connections", "--deltas",
                 str(args.deltas), "--serve", serve_arg], stdout=subprocess.PIPE, text=True)
                for way in ways}
            try:
                urls = {way: f"{scheme}://127.0.0.1:{_port(stand_in)}/v1/chat/completions"
                        for way, stand_in in stand_ins.items()}
                firsts: dict[str, list[float]] = {way: [] for way in ways}
                cpu = dict.fromkeys(ways, 0.0)
                for _ in range(args.rounds):
                    for way, headers in ways.items():
                        took, used = asyncio.run(attempts(urls[way], args.attempts, headers))
                        firsts[way] += took
                        cpu[way] += used
            finally:
                accepted = {way: _accepted(stand_in) for way, stand_in in stand_ins.items()}
            total = args.rounds * args.attempts
            for way in ways:
                ordered = sorted(firsts[way])
                print(f"| {scheme} | {way} | {statistics.median(ordered):.2f} / "
                      f"{ordered[int(len(ordered) * 0.99)]:.2f} | "
                      f"{cpu[way] / total * 1000:.2f} | {accepted[way] / total:.3f} |")


def _port(stand_in: subprocess.Popen[str]) -> int:
    assert stand_in.stdout is not None
    return int(stand_in.stdout.readline())


def _accepted(stand_in: subprocess.Popen[str]) -> int:
    """Stops the stand-in; the connections it accepted."""
    stand_in.terminate()
    return stand_in.communicate(timeout=10)[0].count("connection")


if __name__ == "__main__":
    main()
