"""The gateway's lean HTTP client (reviewapp/gateway/upstream.py) against raw HTTP servers on
127.0.0.1 that answer the ways a model server or a proxy in front of one may: keep-alive,
chunked, a body ended by closing, a connection closed while idle, silence, nobody listening."""

import asyncio

import httpx
import pytest

from reviewapp.gateway.upstream import UpstreamPool, usable_for

TIMEOUTS = {"read_timeout": 2.0, "connect_timeout": 2.0}


class RawServer:
    """Answers each request read on a connection with `answer(n)` (n: requests so far), then
    closes the connection when `close_after` says so."""

    def __init__(self, answer, close_after=lambda n: False) -> None:
        self.answer, self.close_after = answer, close_after
        self.requests: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answer(len(self.requests))
                if answer is None:
                    await asyncio.sleep(10)
                    return
                writer.write(answer)
                await writer.drain()
                if self.close_after(len(self.requests)):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


def sized(body: bytes, status=b"200 OK") -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def post(pool: UpstreamPool, url: str, *, stream=False, **timeouts):
    return await pool.post(
        url, b'{"model": "m"}', {"Content-Type": "application/json"}, stream=stream,
        **{**TIMEOUTS, **timeouts},
    )  # fmt: skip


async def test_calls_share_one_kept_alive_connection():
    server = RawServer(lambda n: sized(b'{"n": %d}' % n))
    async with server as url:
        pool = UpstreamPool()
        for n in (1, 2, 3):
            response = await post(pool, url)
            assert (response.status_code, response.content) == (200, b'{"n": %d}' % n)
            assert response.headers["content-type"] == "application/json"
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'\r\n\r\n{"model": "m"}')


async def test_a_connection_the_server_closed_while_idle_is_replaced_not_an_error():
    server = RawServer(lambda n: sized(b"ok"), close_after=lambda n: True)
    async with server as url:
        pool = UpstreamPool()
        assert (await post(pool, url)).content == b"ok"
        await asyncio.sleep(0.1)  # the server has closed it; the pool still holds it or not
        assert (await post(pool, url)).content == b"ok"
    assert server.connections == 2


async def test_a_chunked_stream_arrives_in_its_pieces():
    events = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    async with RawServer(lambda n: head + chunked) as url:
        response = await post(UpstreamPool(), url, stream=True)
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert received == b"".join(events)


async def test_a_body_ended_by_closing_the_connection_is_read_whole():
    answer = b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\nupstream gone"
    async with RawServer(lambda n: answer, close_after=lambda n: True) as url:
        response = await post(UpstreamPool(), url)
    assert (response.status_code, response.text) == (502, "upstream gone")


async def test_silence_is_a_read_timeout():
    async with RawServer(lambda n: None) as url:
        with pytest.raises(httpx.ReadTimeout):
            await post(UpstreamPool(), url, read_timeout=0.3)


async def test_nobody_listening_is_a_connect_error():
    async with RawServer(lambda n: None) as url:
        pass  # closed: the port is free again
    with pytest.raises(httpx.ConnectError):
        await post(UpstreamPool(), url)


async def test_garbage_is_a_protocol_error():
    async with RawServer(lambda n: b"SPDY/9 what\r\n\r\n") as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await post(UpstreamPool(), url)


def test_https_and_proxies_stay_with_httpx(monkeypatch):
    assert usable_for("http://127.0.0.1:8100/v1/chat/completions")
    assert not usable_for("https://models.internal/v1/chat/completions")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    assert not usable_for("http://127.0.0.1:8100/v1/chat/completions")
