#!/usr/bin/env python3
"""A user-space `tc netem` for scripts/netem: an Ethernet bridge between two interfaces that delays, drops and
reorders frames.

Why it exists: this machine's kernel is built without the netem qdisc (CONFIG_NET_SCH_NETEM is not set and there
are no loadable modules), so `tc qdisc add ... netem` answers "Specified qdisc kind is unknown". scripts/netem
puts this forwarder in a middle network namespace that holds one end of each of two veth pairs and no IP address:
every frame between the hub's namespace and the clients' namespace crosses it. It reads frames with AF_PACKET
raw sockets (promiscuous, outgoing copies ignored) and writes them to the other interface, after:

- loss:    each frame is dropped with probability `loss` (1.0 = a silent partition: nothing in either direction,
           no RST, no ICMP, exactly what a dead path looks like to TCP);
- delay:   each frame waits `delay` +- `jitter` seconds (uniform, as netem's default without a distribution
           table); frames are sent in order of their due time, so jitter alone reorders them;
- reorder: with probability `reorder` a frame is sent at once, overtaking the delayed ones (netem's
           "reorder P": P of the frames go immediately, the rest are delayed).

Both directions get the same impairment. Runs until SIGTERM/SIGINT. Control: a Unix stream socket (path given
with --control), one JSON object per line, one reply line each:
    {"delay":0.05,"jitter":0.02,"loss":0.05,"reorder":0.1}   set (fields absent keep their value)
    {"stats":true}                                           counters only
Reply: {"ok":true,"config":{...},"stats":{"forwarded":N,"dropped":N,"immediate":N,"reordered":N,"queued":N}}.

Only frames that arrive on the two named interfaces are forwarded, only to each other: the forwarder has no
address and routes nothing, so it cannot send traffic anywhere else.
"""
import argparse
import heapq
import json
import os
import random
import selectors
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
PACKET_IGNORE_OUTGOING = 23  # linux/if_packet.h, Linux >= 4.20
SOL_PACKET = 263


def open_raw(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernel: outgoing copies are filtered by pkttype below
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((ifname, 0))
    s.setblocking(False)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="first interface")
    ap.add_argument("--b", required=True, help="second interface")
    ap.add_argument("--control", required=True, help="Unix socket path for commands")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    config = {"delay": 0.0, "jitter": 0.0, "loss": 0.0, "reorder": 0.0}
    stats = {"forwarded": 0, "dropped": 0, "immediate": 0, "reordered": 0, "queued": 0}

    sa, sb = open_raw(args.a), open_raw(args.b)
    peer = {sa: sb, sb: sa}
    try:
        os.unlink(args.control)
    except FileNotFoundError:
        pass
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctl.bind(args.control)
    ctl.listen(4)
    ctl.setblocking(False)

    sel = selectors.DefaultSelector()
    sel.register(sa, selectors.EVENT_READ, "raw")
    sel.register(sb, selectors.EVENT_READ, "raw")
    sel.register(ctl, selectors.EVENT_READ, "accept")
    buffers = {}

    heap = []  # (due, order, out_socket, frame)
    order = 0
    last_due = {sa: 0.0, sb: 0.0}  # per output: to count frames that overtake earlier ones
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"netem_forwarder: bridging {args.a} <-> {args.b}, control {args.control}", file=sys.stderr, flush=True)

    def handle_command(line):
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
            for key in ("delay", "jitter", "loss", "reorder"):
                if key in req:
                    value = float(req[key])
                    if value < 0 or (key in ("loss", "reorder") and value > 1):
                        raise ValueError(f"{key} out of range")
                    config[key] = value
            stats["queued"] = len(heap)
            return {"ok": True, "config": dict(config), "stats": dict(stats)}
        except (ValueError, TypeError) as e:
            return {"ok": False, "error": str(e)}

    while running:
        timeout = None
        if heap:
            timeout = max(0.0, heap[0][0] - time.monotonic())
        try:
            events = sel.select(timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for key, _ in events:
            kind = key.data
            sock = key.fileobj
            if kind == "raw":
                for _ in range(256):
                    try:
                        frame, addr = sock.recvfrom(65535)
                    except (BlockingIOError, InterruptedError):
                        break
                    if addr[2] == PACKET_OUTGOING:
                        continue
                    if config["loss"] > 0 and rng.random() < config["loss"]:
                        stats["dropped"] += 1
                        continue
                    out = peer[sock]
                    if config["reorder"] > 0 and rng.random() < config["reorder"]:
                        due = now
                        stats["immediate"] += 1
                    else:
                        d = config["delay"]
                        if config["jitter"] > 0:
                            d += rng.uniform(-config["jitter"], config["jitter"])
                        due = now + max(0.0, d)
                    if due < last_due[out]:
                        stats["reordered"] += 1
                    last_due[out] = max(last_due[out], due)
                    order += 1
                    heapq.heappush(heap, (due, order, out, frame))
            elif kind == "accept":
                try:
                    conn, _ = ctl.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                buffers[conn] = b""
                sel.register(conn, selectors.EVENT_READ, "ctl")
            else:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sock)
                    buffers.pop(sock, None)
                    sock.close()
                    continue
                buffers[sock] += data
                while b"\n" in buffers[sock]:
                    line, buffers[sock] = buffers[sock].split(b"\n", 1)
                    reply = handle_command(line)
                    try:
                        sock.setblocking(True)
                        sock.sendall((json.dumps(reply) + "\n").encode())
                        sock.setblocking(False)
                    except OSError:
                        pass
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, out, frame = heapq.heappop(heap)
            try:
                out.send(frame)
                stats["forwarded"] += 1
            except (BlockingIOError, OSError):
                stats["dropped"] += 1
    try:
        os.unlink(args.control)
    except OSError:
        pass
    print(f"netem_forwarder: stopped: {json.dumps(stats)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
