"""A stand-in upstream for the tests that need one to misbehave exactly so: a one-route
HTTP/1.1 server streaming scripted reads. It is not an inference server (a user does
not run it); the tests of what real servers do run llama-server (tests/upstream/llama.py)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading


def delta(text: str, finish: str | None = None) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\n'


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request off `reader`, for a stand-in server: its head, lowercased,
    and its body (by its Content-Length). `asyncio.IncompleteReadError` when the
    client closed the connection instead."""
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


def chunk(data: bytes) -> bytes:
    """`data` as one piece of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class LoopServer:
    """A stand-in server's plumbing: `_answer` serves each connection on a loop thread
    of its own, over TLS with `tls` (the server's context); `stop` ends them all."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._answer, "127.0.0.1", 0, ssl=tls), self._loop).result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/v1"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        async def shut() -> None:
            self._server.close()
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


class Scripted(LoopServer):
    """A one-route HTTP/1.1 server streaming `reads` (each written, then a pause, so each
    is one network read) as a chunked SSE body. It closes the connection after its
    answer, or with `keep_alive` answers the next request on it too."""

    def __init__(self, reads: list[bytes], pause: float = 0.05, headers: bytes = b"",
                 keep_alive: bool = False, tls: ssl.SSLContext | None = None) -> None:
        self.reads = reads
        self.pause = pause
        self.headers = headers  # more header lines, each ending in CRLF
        self.keep_alive = keep_alive
        self.connections = 0  # accepted so far
        self.closed = threading.Event()
        super().__init__(tls)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                await read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n" + self.headers + b"\r\n")
                for data in self.reads:
                    writer.write(chunk(data))
                    await writer.drain()
                    await asyncio.sleep(self.pause)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                if not self.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed.set()



class AnswersBadRequest(Scripted):
    """A server that answers whatever comes first, a TLS hello included, with a plain
    HTTP 400 and hangs up, as uvicorn (vLLM's server) does."""

    def __init__(self) -> None:
        super().__init__([])

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.read(1)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()
