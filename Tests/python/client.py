#!/usr/bin/env python3
"""An app-like hub client on Python's `websockets` (an outside, independent WebSocket implementation).

Connects to the hub's /ws like the mobile app does, subscribes, and prints every message it receives, one per
line on stdout, exactly as received (the hub's messages are one-line JSON texts; a binary message, which the hub
never sends on /ws, is printed as {"binary": "<hex>"}). Exits 0 after --count messages (the `subscribed` reply
counts), 2 on timeout, 3 when the connection closes first, 4 when the hub refuses the handshake.

On stderr, one line after the handshake:
    handshake {"status": 101, "extensions": [...], "extensionsHeader": "..."}
and on exit:
    closed {"code": ..., "reason": ...}      (when the hub closed the connection)
    refused {"status": 401, "body": "..."}   (when the hub answered the handshake with an HTTP error)

Run by Tests/HubTests/Interop*.swift; usable by hand:
    python3 Tests/python/client.py --url ws://127.0.0.1:8080/ws --token "$TOKEN" --subscribe wallet_updates
"""
import argparse
import ssl
import asyncio
import json
import sys
import urllib.parse

import websockets
from websockets.asyncio.client import connect  # the asyncio implementation (websockets >= 13)
from websockets.exceptions import InvalidStatus


def log(tag, obj):
    print(tag + " " + json.dumps(obj), file=sys.stderr, flush=True)


async def run(args):
    url = args.url
    headers = {}
    if args.auth in ("header", "both"):
        headers["Authorization"] = "Bearer " + args.token
    if args.auth in ("query", "both"):  # browser style: browsers cannot set headers on a WebSocket
        separator = "&" if "?" in url else "?"
        url += separator + "access_token=" + urllib.parse.quote(args.query_token or args.token, safe="")
    if args.platform:
        headers["X-Platform"] = args.platform
    if args.app_version:
        headers["X-App-Version"] = args.app_version

    out = sys.stdout.buffer
    received = 0
    refreshed = False
    try:
        ws = await connect(
            url,
            additional_headers=headers,
            compression="deflate" if args.compression == "deflate" else None,
            max_size=None,
            open_timeout=args.timeout,
            ping_interval=None,
            **({"ssl": ssl.create_default_context(cafile=args.cafile)} if args.cafile else {}),
        )
    except InvalidStatus as e:
        log("refused", {"status": e.response.status_code, "body": e.response.body.decode("utf-8", "replace")})
        return 4
    async with ws:
        log("handshake", {
            "status": ws.response.status_code,
            "extensions": [e.name for e in ws.protocol.extensions],
            "extensionsHeader": ws.response.headers.get("Sec-WebSocket-Extensions"),
        })
        if args.subscribe:
            await ws.send(json.dumps({"type": "subscribe", "channels": args.subscribe.split(","), "id": "py"},
                                     separators=(",", ":")))
        try:
            async with asyncio.timeout(args.timeout):
                while received < args.count:
                    message = await ws.recv()
                    if isinstance(message, str):
                        line = message.encode("utf-8")
                    else:
                        line = json.dumps({"binary": message.hex()}).encode()
                    out.write(line + b"\n")
                    out.flush()
                    received += 1
                    # Like the app: refresh the token in-band when the hub warns that it is expiring.
                    if args.refresh_token and not refreshed and isinstance(message, str) \
                            and json.loads(message).get("type") == "token_expiring":
                        refreshed = True
                        await ws.send(json.dumps({"type": "auth", "token": args.refresh_token, "id": "refresh"},
                                                 separators=(",", ":")))
        except TimeoutError:
            log("timeout", {"received": received, "expected": args.count})
            return 2
        except websockets.ConnectionClosed as e:
            rcvd = e.rcvd
            log("closed", {"code": rcvd.code if rcvd else None, "reason": rcvd.reason if rcvd else None})
            return 3
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="ws://127.0.0.1:PORT/ws")
    p.add_argument("--token", required=True)
    p.add_argument("--auth", choices=["header", "query", "both"], default="header",
                   help="Authorization: Bearer header (app), ?access_token= (browser), or both")
    p.add_argument("--query-token", default="", help="with --auth both: the token in the query (default --token)")
    p.add_argument("--subscribe", default="", help="comma-separated channels")
    p.add_argument("--cafile", default="", help="wss://: trust this CA (PEM) instead of the system's")
    p.add_argument("--platform", default="")
    p.add_argument("--app-version", default="")
    p.add_argument("--compression", choices=["none", "deflate"], default="none",
                   help="offer permessage-deflate")
    p.add_argument("--refresh-token", default="", help="send it in an `auth` message on `token_expiring`")
    p.add_argument("--count", type=int, default=1, help="exit after this many messages")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds")
    args = p.parse_args()
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
