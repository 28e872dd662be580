"""A lean HTTP/1.1 client for the model servers, for the gateway's calls.

httpx cost ~0.9 ms of CPU per forwarded call (bench/gateway.py), more than the gateway's own
work: its request/response models, auth and redirect layers, anyio streams, a readability poll
and two socket writes per request. This client keeps connections to each server open
(asyncio protocols on the running loop), writes a request in one write and parses the answer
with httptools (uvicorn's parser, already installed with it). Errors are raised as httpx's
exception classes, so the views treat them exactly as before.

Only plain-HTTP servers without a proxy set in the environment use it; https (certificates)
and proxies stay with httpx (`usable_for`).
"""

import asyncio
import collections
import os
from urllib.parse import urlsplit

import httptools
import httpx

MAX_IDLE_PER_SERVER = 64
_PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def usable_for(url: str) -> bool:
    return url.startswith("http://") and not any(os.environ.get(v) for v in _PROXY_VARIABLES)


class UpstreamResponse:
    """What the views read of an httpx.Response: status_code, headers, content, text, aread,
    aiter_raw (the body as it arrives, transfer-decoded), aclose."""

    def __init__(self, connection: "_Connection", read_timeout: float) -> None:
        self._connection = connection
        self._read_timeout = read_timeout
        self.status_code = connection.status
        self.headers = connection.headers
        self._content: bytes | None = None

    async def aiter_raw(self):
        connection = self._connection
        try:
            while True:
                chunk = await connection.next_chunk(self._read_timeout)
                if chunk is None:
                    return
                yield chunk
        finally:
            await self.aclose()

    async def aread(self) -> bytes:
        if self._content is None:
            self._content = b"".join([chunk async for chunk in self.aiter_raw()])
        return self._content

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    async def aclose(self) -> None:
        if self._connection is not None:
            self._connection.release()
            self._connection = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, pool: "UpstreamPool", server: tuple[str, int]) -> None:
        self.pool, self.server = pool, server
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.received_any = False
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.keep_alive = False
        self.headers: dict[str, str] = {}
        self.chunks: collections.deque[bytes] = collections.deque()
        self.complete = False
        self.error: Exception | None = None
        self.headers_done: asyncio.Future | None = None
        self.waiter: asyncio.Future | None = None

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(httpx.RemoteProtocolError(f"malformed answer from the server: {error}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if exc is None and self.status and not self.complete and self._ends_at_close():
            self.on_message_complete()  # a body delimited by the end of the connection
        if not self.complete:
            self._fail(httpx.ReadError(f"the server closed the connection ({exc!r})"))

    def _ends_at_close(self) -> bool:
        return "content-length" not in self.headers and "transfer-encoding" not in self.headers

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)
        self._wake()

    def _fail(self, error: Exception) -> None:
        self.error = error
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # the request
    async def request(self, head: bytes, body: bytes, read_timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self.headers_done = loop.create_future()
        self.received_any = False
        self.transport.write(head + body)
        try:
            await asyncio.wait_for(self.headers_done, read_timeout)
        except TimeoutError:
            self.transport.close()
            raise httpx.ReadTimeout("the server did not answer in time") from None
        except BaseException:  # cancelled (the client went away) or the server failed
            self.transport.close()
            raise

    async def next_chunk(self, read_timeout: float) -> bytes | None:
        while not self.chunks:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self.waiter, read_timeout)
            except TimeoutError:
                self.transport.close()
                raise httpx.ReadTimeout("the server stopped sending") from None
            finally:
                self.waiter = None
        return self.chunks.popleft()

    def release(self) -> None:
        """Back to the pool when the answer was read whole and the server keeps the
        connection; closed otherwise (an answer left half-read cannot be resumed)."""
        if self.complete and self.keep_alive and not self.closed:
            self._reset()
            self.pool.give_back(self)
        else:
            self.closed = True
            self.transport.close()


class UpstreamPool:
    """Connections per server for one event loop."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    def give_back(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.server, [])
        if len(idle) < MAX_IDLE_PER_SERVER:
            idle.append(connection)
        else:
            connection.closed = True
            connection.transport.close()

    async def _connect(self, server: tuple[str, int], timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, server), *server), timeout
            )
        except TimeoutError:
            raise httpx.ConnectTimeout("connecting to the server timed out") from None
        except OSError as error:
            raise httpx.ConnectError(str(error)) from error
        return connection

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        stream: bool,
        read_timeout: float,
        connect_timeout: float,
    ) -> UpstreamResponse:
        parts = urlsplit(url)
        server = (parts.hostname or "", parts.port or 80)
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {parts.netloc}", "Accept: */*"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        idle = self._idle.get(server)
        while idle:
            connection = idle.pop()
            if connection.closed or connection.transport.is_closing():
                continue
            try:
                await connection.request(head, body, read_timeout)
            except httpx.ReadError:
                if connection.received_any:
                    raise
                continue  # the server closed it while idle, before reading this request
            return await self._answer(connection, read_timeout, stream=stream)
        connection = await self._connect(server, connect_timeout)
        await connection.request(head, body, read_timeout)
        return await self._answer(connection, read_timeout, stream=stream)

    @staticmethod
    async def _answer(
        connection: _Connection, read_timeout: float, *, stream: bool
    ) -> UpstreamResponse:
        response = UpstreamResponse(connection, read_timeout)
        if not stream:
            await response.aread()
        return response


_pools: dict[int, tuple[asyncio.AbstractEventLoop, UpstreamPool]] = {}


def pool() -> UpstreamPool:
    """One pool per event loop (uvicorn runs one loop per worker; tests run many)."""
    loop = asyncio.get_running_loop()
    held = _pools.get(id(loop))
    if held is None or held[0] is not loop:
        held = _pools[id(loop)] = (loop, UpstreamPool())
    return held[1]
