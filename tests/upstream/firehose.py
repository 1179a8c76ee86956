"""A stand-in upstream that never stops: a 200 answer streaming the same delta, many to
a write, as fast as its connection takes them (or a write every `pause` seconds), until
the client hangs up. What a broken or hostile server could do to a task that set no
`max_output_tokens`; real servers end their text."""

from __future__ import annotations

import asyncio

from tests.upstream.scripted import LoopServer, chunk, delta, read_request

TEXT = "abcdefgh" * 8  # one delta's text
_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")


class Firehose(LoopServer):
    """The stand-in; `sent` counts the characters of delta
    text its connection has taken (written, and drained below asyncio's high-water
    mark: while the client reads nothing the count stops once the kernel's buffers are
    full)."""

    def __init__(self, *, deltas_per_write: int = 200, pause: float = 0.0) -> None:
        self.sent = 0
        self._write = chunk(delta(TEXT) * deltas_per_write)
        self._text_per_write = len(TEXT) * deltas_per_write
        self._pause = pause
        super().__init__()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            writer.write(_HEAD)
            while True:
                writer.write(self._write)
                await writer.drain()
                self.sent += self._text_per_write
                if self._pause:
                    await asyncio.sleep(self._pause)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
