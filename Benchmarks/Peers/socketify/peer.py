#!/usr/bin/env python3
"""socketify peer for the hub benchmarks: uWebSockets' C core (through PyPI's socketify) + PyJWT.

WebSocket:  ws://HOST:PORT/ws?access_token=<HS256 JWT>   (or Authorization: Bearer; secret: env PEER_JWT_SECRET;
            account = sub). A bad token is refused at the handshake with 401.
Publish:    POST http://HOST:PORT/publish   (same port)
            body: one JSON object -> one JSON reply line;
                  NDJSON (one object per line) -> NDJSON replies, one per line, in order.

Fan-out is uWebSockets' own pub/sub: each connection subscribes to one topic per (channel, its account) and one
per channel for broadcasts, and a publish frames the event once and hands it to `App.publish`, uWS's topic tree,
which writes it to every subscriber (the same encode-once fan-out as the hub). `delivered` is the topic's
subscriber count (`App.num_subscribers`) at publish time.

One process, one uWS event loop on one thread: socketify's `App` (and uWS's topic tree) belongs to one loop, so a
second thread or process would not see the first one's subscriptions, and the HTTP publish would reach only one.
"""

import argparse
import json
import os
import signal
import sys

from socketify import App, CompressOptions, OpCode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import peerlib  # noqa: E402  (Benchmarks/Peers/peerlib.py)
from peerlib import dumps  # noqa: E402

SECRET = None
app = None
streams = peerlib.Streams()


def topic(channel: str, account) -> str:
    """uWS topic of a stream: one per (channel, account), one per channel for broadcasts (account None). The
    channel's length makes the name unambiguous whatever characters the channel and account hold."""
    return "b:" + channel if account is None else "a%d:%s:%s" % (len(channel), channel, account)


def publish(line) -> tuple:
    """One publish request (str or bytes holding a JSON object) -> (reply line, ok)."""
    key, result = streams.frame(line)
    if key is None:
        return result, False
    seq, frame = result
    name = topic(*key)
    delivered = app.num_subscribers(name)
    if delivered:
        app.publish(name, frame, OpCode.TEXT, False)
    return peerlib.ok_reply(seq, delivered), True


MAX_BODY = 64 * 1024 * 1024


# Responses whose body is still arriving. socketify hands uWS a handle to the response object, not a reference:
# nothing else keeps it alive between `on_data` calls, and once the garbage collector takes it the next chunk's
# callback aborts the process ("ffi.from_handle() ... already been garbage collected"; seen under the publish
# scenario's pipelined NDJSON batches).
in_flight = set()


def on_publish(res, req):
    chunks = []
    size = [0]
    state = {"aborted": False}
    in_flight.add(res)

    def aborted(res):
        state["aborted"] = True
        in_flight.discard(res)

    def data(res, chunk, is_end):
        if state["aborted"]:
            return
        if chunk:
            size[0] += len(chunk)
            if size[0] > MAX_BODY:
                state["aborted"] = True
                in_flight.discard(res)
                res.write_status("413 Payload Too Large").end("body too large\n", True)
                return
            chunks.append(bytes(chunk))
        if is_end:
            ok, ctype, out = peerlib.publish_body(b"".join(chunks), publish)
            res.write_status("200 OK" if ok else "400 Bad Request").write_header("Content-Type", ctype).end(out)
            in_flight.discard(res)

    res.on_aborted(aborted)
    res.on_data(data)


# ---------------------------------------------------------------- WebSocket side


def ws_upgrade(res, req, socket_context):
    token = None
    auth = req.get_header("authorization")
    if auth and auth.startswith("Bearer "):
        token = auth[7:]
    else:
        token = req.get_query("access_token")
    account = peerlib.verify(token, SECRET) if token else None
    if account is None:
        res.write_status("401 Unauthorized").end("unauthorized\n")
        return
    res.upgrade(
        req.get_header("sec-websocket-key"),
        req.get_header("sec-websocket-protocol"),
        req.get_header("sec-websocket-extensions"),
        socket_context,
        account,
    )


def reply(ws, obj, msg_id):
    if msg_id is not None:
        obj["id"] = msg_id
    ws.send(dumps(obj), OpCode.TEXT)


def ws_message(ws, message, opcode):
    if opcode != OpCode.TEXT:
        return
    account = ws.get_user_data()
    try:
        msg = json.loads(message)
    except ValueError:
        msg = None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        reply(ws, {"type": "error", "error": {"code": "VALIDATION_ERROR", "message": "expected a JSON object with a type"}}, None)
        return
    mtype, msg_id = msg["type"], msg.get("id")
    if mtype in ("subscribe", "unsubscribe"):
        names = msg.get("channels")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            reply(ws, {"type": "error", "error": {"code": "VALIDATION_ERROR", "message": "channels must be an array of strings"}}, msg_id)
            return
        for ch in names:
            if mtype == "subscribe":
                ws.subscribe(topic(ch, account))
                ws.subscribe(topic(ch, None))
            else:
                ws.unsubscribe(topic(ch, account))
                ws.unsubscribe(topic(ch, None))
        reply(ws, {"type": mtype + "d", "channels": names}, msg_id)
    elif mtype == "ping":
        reply(ws, {"type": "pong"}, msg_id)
    else:
        reply(ws, {"type": "error", "error": {"code": "VALIDATION_ERROR", "message": "unknown type"}}, msg_id)


def main():
    global SECRET, app
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="WebSocket and publish port")
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args()
    SECRET = peerlib.secret_from_environment()

    app = App()
    app.ws(
        "/ws",
        {
            "compression": CompressOptions.DISABLED,  # the hub does not negotiate permessage-deflate on /ws either
            "max_payload_length": 64 * 1024,
            "idle_timeout": 120,
            "send_pings_automatically": True,
            # Like the hub's 1 MiB per-connection queue: a subscriber that falls that far behind is closed.
            "max_backpressure": 1024 * 1024,
            "close_on_backpressure_limit": True,
            "upgrade": ws_upgrade,
            "message": ws_message,
        },
    )
    app.post("/publish", on_publish)
    app.get("/healthz", lambda res, req: res.end("ok\n"))
    app.any("/*", lambda res, req: res.write_status("404 Not Found").end("not found\n"))

    def stop(*_):
        app.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    app.listen(
        {"port": args.port, "host": args.host},
        lambda config: print(f"socketify peer: ws://{args.host}:{args.port}/ws  publish http://{args.host}:{args.port}/publish", flush=True),
    )
    app.run()


if __name__ == "__main__":
    main()
