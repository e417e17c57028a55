#!/usr/bin/env python3
"""Many app-like connections from one process (Python's `websockets`), for fan-out checks against the hub.

--tokens FILE has one "ACCOUNT TOKEN" per line; one connection is opened per line (Authorization header),
each subscribes to --subscribe. When every connection has its `subscribed` reply, prints
    {"ready": N}
then waits until every connection has received --expect more messages, and prints one line per connection,
in the order of the file:
    {"account": "acc_1", "messages": ["<text as received>", ...]}
Exit 0; 2 on timeout (the lines are printed anyway, with what arrived).
"""
import argparse
import asyncio
import json
import sys

from websockets.asyncio.client import connect  # the asyncio implementation (websockets >= 13)


async def run(args):
    pairs = [line.split() for line in open(args.tokens) if line.strip()]
    connections = []
    for account, token in pairs:
        ws = await connect(args.url, additional_headers={"Authorization": "Bearer " + token},
                           ping_interval=None, max_size=None, open_timeout=args.timeout)
        await ws.send(json.dumps({"type": "subscribe", "channels": args.subscribe.split(",")}))
        connections.append((account, ws))
    for account, ws in connections:
        reply = json.loads(await asyncio.wait_for(ws.recv(), args.timeout))
        if reply.get("type") != "subscribed":
            print(f"subscribe failed for {account}: {reply}", file=sys.stderr)
            return 1
    print(json.dumps({"ready": len(connections)}), flush=True)

    received = {i: [] for i in range(len(connections))}

    async def collect(i, ws):
        while len(received[i]) < args.expect:
            received[i].append(await ws.recv())

    status = 0
    try:
        await asyncio.wait_for(asyncio.gather(*(collect(i, ws) for i, (_, ws) in enumerate(connections))), args.timeout)
    except asyncio.TimeoutError:
        status = 2
    for i, (account, ws) in enumerate(connections):
        print(json.dumps({"account": account, "messages": received[i]}), flush=True)
    await asyncio.gather(*(ws.close() for _, ws in connections))
    return status


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--subscribe", default="wallet_updates")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--timeout", type=float, default=10.0)
    args = p.parse_args()
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
