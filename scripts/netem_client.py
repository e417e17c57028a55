#!/usr/bin/env python3
"""One subscriber for scripts/netem, run inside a network namespace (`ip netns exec NS python netem_client.py ...`).

Connects with Python's `websockets` (it answers the hub's pings itself and sends none of its own, so the hub's
heartbeat is the only liveness check), subscribes, and reports everything as JSON lines on stdout, stamped with
CLOCK_MONOTONIC (shared by every process on the machine, whatever its network namespace):
    {"k":"subscribed","t":...}
    {"k":"event","ch":"wallet_updates","seq":17,"b":false,"target":"acc_l0","tp":<publish time>,"tr":<receive time>}
    {"k":"reply","type":"pong","id":"b1","t":...}
    {"k":"closed","code":4002,"reason":"PONG_TIMEOUT","t":...}       (code 1006: no close frame: reset / EOF)
    {"k":"error","message":"..."}
Commands on stdin, one per line: `ping ID` (an app-level ping: its pong comes after every event queued before it),
`close` (close 1000 and exit), `exit` (drop the connection without a close frame and exit).
"""
import argparse
import asyncio
import json
import sys
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


def out(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--channels", default="profile_updates,wallet_updates")
    ap.add_argument("--platform", default="netem")
    ap.add_argument("--open-timeout", type=float, default=20)
    args = ap.parse_args()
    channels = args.channels.split(",")

    try:
        ws = await connect(args.url, additional_headers={"Authorization": f"Bearer {args.token}",
                                                          "X-Platform": args.platform},
                           compression=None, ping_interval=None, open_timeout=args.open_timeout, close_timeout=5,
                           max_queue=None)
    except Exception as e:  # noqa: BLE001
        out({"k": "error", "message": f"connect failed: {e!r}"})
        return 1

    async def reader():
        try:
            async for msg in ws:
                t = time.monotonic()
                obj = json.loads(msg)
                if "seq" in obj:
                    data = obj.get("data") or {}
                    out({"k": "event", "ch": obj.get("channel"), "seq": obj.get("seq"),
                         "b": obj.get("broadcast", False), "target": data.get("target"), "tp": data.get("t"),
                         "tr": t, "type": obj.get("type")})
                elif obj.get("type") == "subscribed":
                    out({"k": "subscribed", "t": t})
                else:
                    out({"k": "reply", "type": obj.get("type"), "id": obj.get("id"), "t": t, "raw": msg[:300]})
            code, reason = ws.close_code, ws.close_reason
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd is not None else 1006
            reason = e.rcvd.reason if e.rcvd is not None else "no close frame"
        out({"k": "closed", "code": code if code is not None else 1006, "reason": reason, "t": time.monotonic()})

    read_task = asyncio.create_task(reader())
    await ws.send(json.dumps({"type": "subscribe", "channels": channels, "id": "s"}))

    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while not read_task.done():
        line_task = asyncio.create_task(stdin.readline())
        done, _ = await asyncio.wait({line_task, read_task}, return_when=asyncio.FIRST_COMPLETED)
        if line_task not in done:
            line_task.cancel()
            break
        line = line_task.result().decode().strip()
        if not line or line == "exit":
            ws.transport.abort()
            break
        if line == "close":
            try:
                await asyncio.wait_for(ws.close(1000), 10)
            except Exception:  # noqa: BLE001
                ws.transport.abort()
            break
        if line.startswith("ping "):
            rid = line.split(" ", 1)[1]
            out({"k": "sent", "id": rid, "t": time.monotonic()})
            try:
                await ws.send(json.dumps({"type": "ping", "id": rid}))
            except ConnectionClosed:
                pass
    try:
        await asyncio.wait_for(read_task, 10)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001
        read_task.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
