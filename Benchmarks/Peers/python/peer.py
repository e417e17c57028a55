#!/usr/bin/env python3
"""Python peer for the hub benchmarks: asyncio + websockets (>= 14, new asyncio API) + PyJWT.

WebSocket:  ws://HOST:PORT/ws?access_token=<HS256 JWT>   (secret: env PEER_JWT_SECRET; account = sub)
Publish:    POST http://HOST:PUBLISH_PORT/publish        (default PUBLISH_PORT = PORT + 1)
            body: one JSON object -> one JSON reply line;
                  NDJSON (one object per line) -> NDJSON replies, one per line, in order.

websockets' HTTP parser accepts only GET requests without a body, so the publish API is a tiny
asyncio HTTP/1.1 server (keep-alive, Content-Length bodies) on a second port of the same event loop.
One process, one thread (the event loop).
"""

import argparse
import asyncio
import json
import os
import signal
import sys
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import broadcast, serve
from websockets.protocol import State

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import peerlib  # noqa: E402  (Benchmarks/Peers/peerlib.py)
from peerlib import dumps  # noqa: E402

SECRET = None

# (channel, account) -> set of connections; channel -> set of connections
account_subs: dict = {}
broadcast_subs: dict = {}
streams = peerlib.Streams()


def publish(line) -> tuple:
    """One publish request (str or bytes holding a JSON object) -> (reply line, ok)."""
    key, result = streams.frame(line)
    if key is None:
        return result, False
    seq, frame = result
    channel, account = key
    conns = broadcast_subs.get(channel) if account is None else account_subs.get(key)
    delivered = 0
    if conns:
        open_conns = [c for c in conns if c.state is State.OPEN]
        delivered = len(open_conns)
        # broadcast() writes synchronously, without waiting for each socket to drain.
        broadcast(open_conns, frame)
    return peerlib.ok_reply(seq, delivered), True


# ---------------------------------------------------------------- WebSocket side


def process_request(connection, request):
    url = urlsplit(request.path)
    if url.path != "/ws":
        return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
    token = None
    auth = request.headers.get("Authorization")
    if auth and auth.startswith("Bearer "):
        token = auth[7:]
    else:
        token = (parse_qs(url.query).get("access_token") or [None])[0]
    account = peerlib.verify(token, SECRET) if token else None
    if account is None:
        return connection.respond(HTTPStatus.UNAUTHORIZED, "unauthorized\n")
    connection.peer_account = account
    return None


def subscribe(ws, account, channels):
    for ch in channels:
        account_subs.setdefault((ch, account), set()).add(ws)
        broadcast_subs.setdefault(ch, set()).add(ws)


def unsubscribe(ws, account, channels):
    for ch in channels:
        key = (ch, account)
        s = account_subs.get(key)
        if s is not None:
            s.discard(ws)
            if not s:
                del account_subs[key]
        s = broadcast_subs.get(ch)
        if s is not None:
            s.discard(ws)
            if not s:
                del broadcast_subs[ch]


async def handler(ws):
    account = ws.peer_account
    channels = set()

    def reply(obj, msg_id):
        if msg_id is not None:
            obj["id"] = msg_id
        # Same synchronous write path as events, so the reply precedes every event that follows it.
        broadcast([ws], dumps(obj))

    try:
        async for message in ws:
            if not isinstance(message, str):
                continue
            try:
                msg = json.loads(message)
            except ValueError:
                msg = None
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                reply({"type": "error", "error": {"code": "VALIDATION_ERROR", "message": "expected a JSON object with a type"}}, None)
                continue
            mtype, msg_id = msg["type"], msg.get("id")
            if mtype in ("subscribe", "unsubscribe"):
                names = msg.get("channels")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    reply({"type": "error", "error": {"code": "VALIDATION_ERROR", "message": "channels must be an array of strings"}}, msg_id)
                    continue
                if mtype == "subscribe":
                    subscribe(ws, account, names)
                    channels.update(names)
                    reply({"type": "subscribed", "channels": names}, msg_id)
                else:
                    unsubscribe(ws, account, names)
                    channels.difference_update(names)
                    reply({"type": "unsubscribed", "channels": names}, msg_id)
            elif mtype == "ping":
                reply({"type": "pong"}, msg_id)
            else:
                reply({"type": "error", "error": {"code": "VALIDATION_ERROR", "message": "unknown type"}}, msg_id)
    finally:
        unsubscribe(ws, account, channels)


# ---------------------------------------------------------------- HTTP publish side

MAX_BODY = 64 * 1024 * 1024


async def http_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                await respond(writer, 400, "text/plain", b"bad request\n", False)
                return
            headers = {}
            for h in lines[1:]:
                if ":" in h:
                    k, v = h.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
            length = int(headers.get("content-length", "0") or 0)
            if length > MAX_BODY:
                await respond(writer, 413, "text/plain", b"body too large\n", False)
                return
            body = await reader.readexactly(length) if length else b""
            path = target.split("?", 1)[0]
            if path == "/healthz" and method == "GET":
                await respond(writer, 200, "text/plain", b"ok\n", keep_alive)
            elif path != "/publish":
                await respond(writer, 404, "text/plain", b"not found\n", keep_alive)
            elif method != "POST":
                await respond(writer, 405, "text/plain", b"method not allowed\n", keep_alive)
            else:
                status, ctype, out = handle_publish_body(body)
                await respond(writer, status, ctype, out, keep_alive)
            if not keep_alive:
                return
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


def handle_publish_body(body: bytes):
    ok, ctype, out = peerlib.publish_body(body, publish)
    return (200 if ok else 400), ctype, out.encode()


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}


async def respond(writer, status, ctype, body: bytes, keep_alive: bool):
    writer.write(
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: %s\r\n\r\n"
        % (status, REASONS.get(status, "").encode(), ctype.encode(), len(body), b"keep-alive" if keep_alive else b"close")
        + body
    )
    await writer.drain()


# ---------------------------------------------------------------- main


async def main():
    global SECRET
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="WebSocket port (/ws)")
    p.add_argument("--publish-port", type=int, help="HTTP publish port (default: PORT + 1)")
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args()
    SECRET = peerlib.secret_from_environment()
    publish_port = args.publish_port or args.port + 1

    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))

    http_server = await asyncio.start_server(http_connection, args.host, publish_port, limit=MAX_BODY)
    async with serve(
        handler,
        args.host,
        args.port,
        process_request=process_request,
        compression=None,  # the hub does not negotiate permessage-deflate on /ws either
        max_size=64 * 1024,
        ping_interval=25,
        ping_timeout=10,
    ):
        print(f"python peer: ws://{args.host}:{args.port}/ws  publish http://{args.host}:{publish_port}/publish", flush=True)
        await stop
    http_server.close()


if __name__ == "__main__":
    asyncio.run(main())
