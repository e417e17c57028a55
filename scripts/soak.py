#!/usr/bin/env python3
"""The soak run behind scripts/soak: one release hub, a modest mixed load for DURATION, invariants checked all along.

Load (all at once, for the whole duration):
- stable subscribers (Python `websockets`): one or two per account, subscribed from start to end, reading
  everything; they are the "others" that must be unaffected;
- connect churn (`websockets`): workers that connect as a random account, subscribe, read for a while and leave
  gracefully (unsubscribe, wait for the reply, close), by close frame alone, or by dropping TCP;
- publishes through the Unix socket from two pipelined publishers: per-account events and broadcasts, every
  event's `data` naming its target account ("*" for a broadcast) and the publisher's send time;
- slow consumers (raw sockets, receive buffer 4 KiB): subscribe, read a little, stop reading while their account
  gets bulk events, then either resume reading or wait longer; each must end with close 4008 or a reset;
- bad frames (raw sockets, valid token): protocol violations each with its documented close code, sent whole or
  one octet per TCP segment, followed by a message that must not be processed; bad HTTP heads too;
- bad socket lines: garbage, invalid JSON, oversized lines, invalid requests, each with its documented error code,
  on a connection that must keep working.

Invariants (a violation prints `VIOLATION: ...`, stops the load and makes the exit status 1):
- no cross-account delivery; no event on a channel the connection did not subscribe to;
- seq contiguous per stream per connection; the publishers' acknowledged seqs per stream are exactly 1..N;
- every acknowledged publish is delivered to every live, reading subscriber of its stream (checked for every
  stable subscriber and every churn connection that left gracefully), and `delivered` is at least that count;
- the hub's queued bytes per connection stay within --max-queued-bytes;
- RSS and descriptors bounded during the run and back near the baseline after it (thresholds in --help);
- the hub is alive throughout and exits 0 on SIGTERM.
"""
import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import bisect

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faultlib import (HubProcess, RawWS, RawError, SocketClient, close_payload, encode_frame, mint_token,  # noqa: E402
                      make_secret, parse_duration, percentile, proc_cpu_seconds, proc_fd_count,
                      proc_rss_kib)

from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

CHANNELS = ["profile_updates", "wallet_updates"]
EVENT_TYPE = "soak_event"


def now():
    return time.monotonic()


class Sub:
    """What one subscribing connection saw, for the end-of-run delivery check."""

    def __init__(self, label, account, channels):
        self.label = label
        self.account = account
        self.channels = list(channels)
        self.t_ack = None      # when the "subscribed" reply was read
        self.t_leave = None    # when the leave (unsubscribe / barrier ping) was sent; None: no completeness check
        self.last = {}         # stream -> last seq seen
        self.received = collections.defaultdict(set)
        self.events = 0


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.violations = []
        self.stop_load = None
        self.loop = None
        self.lock = threading.Lock()
        self.accounts = [f"acc_{i}" for i in range(args.accounts)]
        self.slow_accounts = [f"slow_{i}" for i in range(args.slow)]
        self.acks = collections.defaultdict(list)        # stream -> [(t_send, seq, t_reply, delivered)]
        self.subs = []                                   # Sub records that are checked for completeness
        self.stalled = set()                             # slow accounts getting bulk events now
        self.counts = collections.Counter()
        self.closes = collections.Counter()              # "who: code" -> n
        self.bad_frames = collections.Counter()
        self.bad_lines = collections.Counter()
        self.latencies = []                              # stable subscribers, seconds
        self.samples = []                                # (t, rss KiB, fds)
        self.hub_stats = None
        self.max_queued_seen = 0
        self.t0 = None

    # -------------------------------------------------------------------------------------------------------------
    def violate(self, message):
        line = f"VIOLATION: {message}"
        with self.lock:
            self.violations.append(message)
            first = len(self.violations) <= 50
        if first:
            print(line, flush=True)
        if self.loop is not None and self.stop_load is not None:
            try:
                self.loop.call_soon_threadsafe(self.stop_load.set)
            except RuntimeError:
                pass  # the event loop is already closed (end of the run)

    def count(self, key, n=1):
        with self.lock:
            self.counts[key] += n

    def note_close(self, who, code):
        with self.lock:
            self.closes[f"{who} {code}"] += 1

    def log(self, message):
        t = now() - self.t0 if self.t0 else 0.0
        print(f"[{t:7.1f}s] {message}", flush=True)

    # -------------------------------------------------------------------------------------------------------------
    # Events, as every client checks them

    def check_event(self, sub, obj, t_recv, latency_list=None):
        """Cross-account, channel and per-stream contiguity checks for one event seen by `sub`."""
        channel, seq, data = obj.get("channel"), obj.get("seq"), obj.get("data")
        broadcast = obj.get("broadcast", False)
        if not isinstance(data, dict) or not isinstance(seq, int):
            self.violate(f"{sub.label}: malformed event {json.dumps(obj)[:200]}")
            return
        if data.get("bad"):
            self.violate(f"{sub.label}: received an event from a rejected publish: {json.dumps(obj)[:200]}")
        if obj.get("type") != EVENT_TYPE:
            self.violate(f"{sub.label}: event type {obj.get('type')!r}, published {EVENT_TYPE!r}")
        if channel not in sub.channels:
            self.violate(f"{sub.label}: event on channel {channel!r}, subscribed to {sub.channels}")
        target = data.get("target")
        if broadcast is True:
            if target != "*":
                self.violate(f"{sub.label}: broadcast flag on an event published for {target!r}")
            stream = (channel, "*")
        else:
            if "broadcast" in obj:
                self.violate(f"{sub.label}: event with broadcast={broadcast!r}")
            if target != sub.account:
                self.violate(f"{sub.label}: CROSS-ACCOUNT delivery: connection of {sub.account!r} got the event "
                             f"published for {target!r} ({channel} seq {seq})")
            stream = (channel, target)
        if self.args.inject == "lose-event" and sub.label.startswith("stable#0(") and sub.events == 100:
            sub.events += 1
            sub.last[stream] = seq
            return  # self-test: pretend this event never arrived
        last = sub.last.get(stream)
        if last is not None and seq != last + 1:
            self.violate(f"{sub.label}: seq not contiguous on {stream}: {last} then {seq}")
        sub.last[stream] = seq
        sub.received[stream].add(seq)
        sub.events += 1
        if latency_list is not None and isinstance(data.get("t"), float):
            latency_list.append(t_recv - data["t"])

    # -------------------------------------------------------------------------------------------------------------
    # Well-behaved clients (Python websockets)

    async def ws_open(self, account, platform):
        token = mint_token(self.secret, account)
        return await connect(self.url, additional_headers={"Authorization": f"Bearer {token}", "X-Platform": platform},
                             compression=None, ping_interval=None, max_queue=4096, open_timeout=10, close_timeout=5,
                             max_size=1 << 20)

    async def ws_session(self, sub, ws, until, leave, stable=False):
        """Reads `ws` for `sub` until `until()` is true, then leaves as `leave` says:
        "graceful" (unsubscribe, wait for the reply, close), "barrier" (ping, wait for the pong, close),
        "close" (close frame only) or "abort" (drop TCP). Returns the close code seen (None for abort)."""
        replies = {}
        lat = self.latencies if stable else None

        async def wait_reply(rid, timeout=15.0):
            deadline = now() + timeout
            while rid not in replies:
                left = deadline - now()
                if left <= 0:
                    raise TimeoutError(f"no reply {rid!r} within {timeout}s")
                msg = await asyncio.wait_for(ws.recv(), left)
                handle(msg)
            return replies.pop(rid)

        def handle(msg):
            t = now()
            obj = json.loads(msg)
            if "seq" in obj:
                self.check_event(sub, obj, t, lat)
            elif obj.get("type") in ("subscribed", "unsubscribed", "pong", "error"):
                replies[obj.get("id")] = obj
            elif obj.get("type") == "token_expiring":
                pass
            else:
                self.violate(f"{sub.label}: unexpected message {msg[:200]}")

        try:
            await ws.send(json.dumps({"type": "subscribe", "channels": sub.channels, "id": "s"}))
            r = await wait_reply("s")
            if r.get("type") != "subscribed":
                self.violate(f"{sub.label}: subscribe answered {r}")
                return None
            sub.t_ack = now()
            while not until():
                try:
                    msg = await asyncio.wait_for(ws.recv(), 0.25)
                except asyncio.TimeoutError:
                    continue
                handle(msg)
            if leave == "abort":
                ws.transport.abort()
                return None
            if leave in ("graceful", "barrier"):
                sub.t_leave = now()
                if leave == "graceful":
                    await ws.send(json.dumps({"type": "unsubscribe", "channels": sub.channels, "id": "u"}))
                    r = await wait_reply("u")
                    want = "unsubscribed"
                else:
                    await ws.send(json.dumps({"type": "ping", "id": "b"}))
                    r = await wait_reply("b")
                    want = "pong"
                if r.get("type") != want:
                    self.violate(f"{sub.label}: {leave} answered {r}")
            await ws.close(1000)
            code = ws.close_code
            if code != 1000:
                self.violate(f"{sub.label}: closed with 1000, the hub answered {code}")
            return code
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd is not None else 1006
            self.violate(f"{sub.label}: the hub closed a well-behaved reading connection: {code} "
                         f"{e.rcvd.reason if e.rcvd else '(no close frame)'}")
            return code
        except (TimeoutError, asyncio.TimeoutError) as e:
            self.violate(f"{sub.label}: {e}")
            ws.transport.abort()
            return None

    async def stable_client(self, index, account, channels):
        sub = Sub(f"stable#{index}({account})", account, channels)
        if self.args.inject == "cross-account" and index == 0:
            sub.account = "acc_somebody_else"  # self-test: the checker believes this connection is another account
        try:
            ws = await self.ws_open(account, f"stable-{index}")
        except Exception as e:  # noqa: BLE001
            self.violate(f"{sub.label}: could not connect: {e!r}")
            return
        self.subs.append(sub)
        self.stable_ready.release()
        code = await self.ws_session(sub, ws, lambda: self.publishers_done.is_set(), "barrier", stable=True)
        self.note_close("stable", code)

    async def churn_worker(self, index):
        rng = random.Random(self.rng.random())
        n = 0
        while not self.stop_load.is_set():
            n += 1
            account = rng.choice(self.accounts + self.slow_accounts[:1])
            channels = rng.sample(CHANNELS, rng.choice([1, 2]))
            leave = rng.choices(["graceful", "close", "abort"], [5, 3, 2])[0]
            sub = Sub(f"churn#{index}.{n}({account})", account, channels)
            try:
                ws = await self.ws_open(account, f"churn-{index}")
            except Exception as e:  # noqa: BLE001
                self.violate(f"{sub.label}: could not connect: {e!r}")
                return
            self.count("churn connections")
            lifetime = rng.uniform(0.2, 3.0)
            end = now() + lifetime
            code = await self.ws_session(sub, ws, lambda: now() >= end or self.stop_load.is_set(), leave)
            if leave == "graceful":
                self.subs.append(sub)
            self.note_close(f"churn-{leave}", "aborted" if leave == "abort" else code)
            await asyncio.sleep(rng.uniform(0.0, 0.2))

    # -------------------------------------------------------------------------------------------------------------
    # Publishers (Unix socket)

    async def publisher(self, index, rate):
        rng = random.Random(self.rng.random())
        sc = SocketClient(self.hub.socket_path)
        await sc.open()
        window = asyncio.Semaphore(64)
        pending = set()
        n = 0
        t_start = now()
        bulk_due = 0.0
        targets = self.accounts + self.slow_accounts + ["acc_nobody"]

        async def settle(fut, stream, t_send, size):
            try:
                reply, t_reply = await asyncio.wait_for(fut, 30)
            except Exception as e:  # noqa: BLE001
                self.violate(f"publisher {index}: no reply to a publish: {e!r}")
                return
            finally:
                window.release()
            if reply.get("ok") is not True or not isinstance(reply.get("seq"), int) \
                    or not isinstance(reply.get("delivered"), int):
                self.violate(f"publisher {index}: valid publish answered {reply}")
                return
            self.acks[stream].append((t_send, reply["seq"], t_reply, reply["delivered"]))
            self.count("publishes acknowledged")
            self.count("publish bytes", size)
            self.count("delivered (sum of replies)", reply["delivered"])

        async def send(channel, target, pad):
            nonlocal n
            n += 1
            await window.acquire()
            t_send = now()
            data = {"target": target, "t": t_send, "n": n, "pad": "x" * pad}
            req = {"op": "publish", "channel": channel, "type": EVENT_TYPE, "data": data}
            if target == "*":
                req["broadcast"] = True
                stream = (channel, "*")
            else:
                req["account"] = target
                stream = (channel, target)
            line = (json.dumps(req, separators=(",", ":")) + "\n").encode()
            try:
                fut = await sc.send_raw(line)
            except Exception as e:  # noqa: BLE001
                window.release()
                self.violate(f"publisher {index}: Unix socket write failed: {e!r}")
                return False
            task = asyncio.create_task(settle(fut, stream, t_send, len(line)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            return True

        sent = 0
        while not self.stop_load.is_set():
            await asyncio.sleep(0.01)
            elapsed = now() - t_start
            due = int(elapsed * rate) - sent
            for _ in range(max(0, min(due, 50))):
                sent += 1
                channel = rng.choice(CHANNELS)
                if rng.random() < self.args.broadcast_share:
                    target = "*"
                    self.count("broadcast publishes")
                else:
                    target = rng.choice(targets)
                    self.count("account publishes")
                if not await send(channel, target, rng.randint(20, 400)):
                    break
            # Bulk events for stalled slow consumers' accounts: --bulk-rate per account per second (all publishers).
            if self.stalled:
                bulk_due += 0.01 * self.args.bulk_rate / self.args.publishers
                while bulk_due >= 1:
                    bulk_due -= 1
                    for account in list(self.stalled):
                        self.count("bulk publishes")
                        self.stall_bytes[account] = self.stall_bytes.get(account, 0) + self.args.bulk_bytes
                        await send("wallet_updates", account, self.args.bulk_bytes)
        if pending:
            await asyncio.wait(pending, timeout=30)
        await sc.close()

    # -------------------------------------------------------------------------------------------------------------
    # Slow consumers (raw sockets in threads)

    async def slow_worker(self, index):
        rng = random.Random(self.rng.random())
        account = self.slow_accounts[index % len(self.slow_accounts)]
        admin = SocketClient(self.hub.socket_path)
        await admin.open()
        n = 0
        try:
            while not self.stop_load.is_set():
                n += 1
                await self.slow_session(f"slow#{index}.{n}({account})", account, f"slow-{index}-{n}", admin, rng)
                await asyncio.sleep(rng.uniform(0.2, 1.0))
        finally:
            await admin.close()

    async def slow_session(self, label, account, platform, admin, rng):
        sub = Sub(label, account, ["wallet_updates", "profile_updates"])
        state = {}

        def open_and_read():
            w = RawWS(self.host, self.port, mint_token(self.secret, account), rcvbuf=4096,
                      headers={"X-Platform": platform})
            w.handshake()
            w.send_text({"type": "subscribe", "channels": sub.channels, "id": "s"})
            state["w"] = w
            end = now() + 1.0
            while now() < end:
                try:
                    fin, op, payload = w.recv_frame(timeout=max(0.01, end - now()))
                except socket.timeout:
                    break
                self.slow_frame(sub, w, op, payload, state)

        try:
            await asyncio.to_thread(open_and_read)
        except Exception as e:  # noqa: BLE001
            self.violate(f"{label}: could not connect and subscribe: {e!r}")
            if "w" in state:
                state["w"].close()
            return
        w = state["w"]
        self.count("slow consumers")
        # Stop reading; the publishers send bulk events to this account until the hub stops treating the
        # connection as open (it started the 4008 close) or the stall limit passes.
        self.stall_bytes[account] = 0
        self.stalled.add(account)
        t_stall = now()
        closed_at = None
        interrupted = False
        try:
            while now() - t_stall < self.args.stall_limit:
                if self.stop_load.is_set():
                    interrupted = True
                    break
                await asyncio.sleep(0.2)
                reply = await admin.request({"op": "connections", "account": account, "limit": 1000})
                mine = [c for c in reply.get("connections", []) if c.get("platform") == platform]
                if not mine:
                    closed_at = now()
                    break
        finally:
            self.stalled.discard(account)
        published = self.stall_bytes.get(account, 0)
        if interrupted:
            # The load stopped (its end, or a violation elsewhere) while this one was not reading: no bulk events
            # any more, so the hub has no reason to close it. Hang up; nothing to check.
            w.close()
            self.count("slow consumers interrupted by the stop")
            return
        if closed_at is None:
            if published > self.args.max_queued_bytes + self.args.kernel_allowance:
                self.violate(f"{label}: not reading for {self.args.stall_limit:.0f}s while {published} bytes were "
                             f"published to it, and the hub still treats it as open")
            else:
                self.count("slow consumers not closed (too little published)")
            w.close()
            return
        with self.lock:
            self.slow_detect.append(closed_at - t_stall)
        # Mode: resume reading now (expect the kernel-held events, then 4008) or keep not reading past the hub's
        # 2 s close wait (expect a reset, possibly after the events and the close frame that did get through).
        resume = rng.random() < 0.5
        if not resume:
            await asyncio.sleep(3.0)

        def drain():
            outcome = None
            deadline = now() + 12.0
            try:
                while True:
                    left = deadline - now()
                    if left <= 0:
                        raise socket.timeout()
                    fin, op, payload = w.recv_frame(timeout=left)
                    got = self.slow_frame(sub, w, op, payload, state)
                    if got is not None:
                        outcome = got
            except EOFError:
                if outcome is None:
                    outcome = "eof without close frame"
            except ConnectionResetError:
                if outcome is None:
                    outcome = "reset"
            except socket.timeout:
                outcome = "still open 12s later" if outcome is None else outcome + " then still open 12s later"
            finally:
                w.close()
            return outcome

        outcome = await asyncio.to_thread(drain)
        key = "resumed" if resume else "never resumed"
        self.note_close(f"slow-{key}", outcome)
        if outcome not in ("close 4008", "reset"):
            self.violate(f"{label} ({key}): ended with {outcome}; a slow consumer must end with close 4008 or a "
                         f"reset, and the hub closes TCP at most 2s after the 4008")

    def slow_frame(self, sub, w, op, payload, state):
        """Handles one frame on a raw slow-consumer connection; returns "close CODE" for a close frame."""
        if op == 0x9:
            try:
                w.send(encode_frame(0xA, payload))
            except OSError:
                pass
            return None
        if op == 0x8:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
            if code != 4008:
                self.violate(f"{sub.label}: closed with {code}, expected 4008")
            return f"close {code}"
        if op != 0x1:
            self.violate(f"{sub.label}: unexpected opcode {op}")
            return None
        obj = json.loads(payload)
        if "seq" in obj:
            self.check_event(sub, obj, now())
        elif obj.get("type") == "subscribed":
            sub.t_ack = now()
        return None

    # -------------------------------------------------------------------------------------------------------------
    # Bad frames and bad HTTP (raw sockets in threads)

    def frame_cases(self):
        after = encode_frame(0x1, b'{"type":"ping","id":"after"}')
        big = self.args.max_message_bytes + 4096
        return [
            # name, bytes, expected close codes, small enough to send one octet per segment
            ("rsv1", encode_frame(0x1, b"hello", rsv=4), {1002}, True),
            ("rsv2", encode_frame(0x1, b"hello", rsv=2), {1002}, True),
            ("rsv3", encode_frame(0x1, b"hello", rsv=1), {1002}, True),
            ("opcode-3", encode_frame(0x3, b"hello"), {1002}, True),
            ("opcode-7", encode_frame(0x7, b"hello"), {1002}, True),
            ("opcode-B", encode_frame(0xB, b"hello"), {1002}, True),
            ("opcode-F", encode_frame(0xF, b"hello"), {1002}, True),
            ("unmasked", encode_frame(0x1, b'{"type":"ping"}', mask=False), {1002}, True),
            ("fragmented-ping", encode_frame(0x9, b"x", fin=False), {1002}, True),
            ("ping-126", encode_frame(0x9, b"p" * 126), {1002}, False),
            ("orphan-continuation", encode_frame(0x0, b"x"), {1002}, True),
            ("text-inside-fragments", encode_frame(0x1, b'{"ty', fin=False) + encode_frame(0x1, b"x"), {1002}, True),
            ("invalid-utf8", encode_frame(0x1, b'{"type":"\xc3\x28"}'), {1007}, True),
            ("utf8-surrogate-fragmented", encode_frame(0x1, b'"\xed\xa0', fin=False) + encode_frame(0x0, b'\x80"'),
             {1007}, True),
            ("binary", encode_frame(0x2, b"\x00\x01\x02"), {1003}, True),
            ("too-big-header", encode_frame(0x1, b"x" * 64, length_override=big)[:14 + 64], {1009}, True),
            ("too-big-fragments", encode_frame(0x1, b"x" * (big // 2), fin=False)
             + encode_frame(0x0, b"x" * (big // 2)), {1009}, False),
            ("length-msb", bytes([0x81, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 5]) + b"\x00" * 4 + b"hello", {1002, 1009}, True),
            ("close-1-byte", encode_frame(0x8, b"\x03"), {1002}, True),
            ("close-1005", encode_frame(0x8, close_payload(1005)), {1002}, True),
            ("close-999", encode_frame(0x8, close_payload(999)), {1002}, True),
            ("close-2999", encode_frame(0x8, close_payload(2999)), {1002}, True),
            ("close-bad-utf8", encode_frame(0x8, close_payload(1000, b"\xff\xfe")), {1007}, True),
            ("close-fragmented", encode_frame(0x8, close_payload(1000), fin=False), {1002}, True),
        ], after

    def bad_frame_case(self, case, octets):
        name, data, codes, _ = case
        _, after = self.frame_cases()
        w = RawWS(self.host, self.port, mint_token(self.secret, self.rng.choice(self.accounts)), timeout=10)
        try:
            w.handshake()
            if octets:
                w.send_octets(data, gap=0.002)
                w.send_octets(after, gap=0.001)
            else:
                try:
                    w.send(data)
                    w.send(after)
                except OSError:
                    pass
            code = None
            end = "timeout"
            t = now()
            try:
                while now() - t < 8:
                    fin, op, payload = w.recv_frame(timeout=8)
                    if op == 0x8:
                        if code is not None:
                            self.violate(f"bad frame {name}: two close frames")
                        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                    elif op == 0x9:
                        continue
                    else:
                        self.violate(f"bad frame {name} ({'octets' if octets else 'whole'}): the hub sent "
                                     f"{payload[:100]!r} after the violation (processed input after failing)")
            except EOFError:
                end = "eof"
            except ConnectionResetError:
                end = "reset"
            except socket.timeout:
                end = "timeout"
            took = now() - t
            mode = "octets" if octets else "whole"
            self.bad_frames[f"{name}/{mode} -> {code}"] += 1
            self.note_close("bad-frame", code)
            if code not in codes:
                self.violate(f"bad frame {name} ({mode}): close code {code}, expected {sorted(codes)}")
            if end == "timeout":
                self.violate(f"bad frame {name} ({mode}): TCP still open 8s after the close frame "
                             f"(the hub must close TCP at once after failing)")
            elif took > 3.0 + (len(data) + len(after)) * 0.004 * octets:
                self.violate(f"bad frame {name} ({mode}): TCP closed only after {took:.1f}s")
        finally:
            w.close()

    def bad_http_case(self, name):
        def upgrade(extra=""):
            return (f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode()

        cases = {
            "garbage": (b"GARBAGE\r\n\r\n", {400}),
            # An empty bearer token (no token at all is first-message auth, which the soak's auth cases do not cover).
            "no-token": (upgrade("Authorization: Bearer \r\n"), {401}),
            "bad-signature": (upgrade("Authorization: Bearer "
                                      + mint_token(b"another-secret-another-secret-xx", "acc_0") + "\r\n"), {401}),
            "expired": (upgrade("Authorization: Bearer " + mint_token(self.secret, "acc_0", ttl=-120) + "\r\n"), {401}),
            "header-too-long": (upgrade("X-Filler: " + "a" * 9000 + "\r\n"), {431}),
        }
        request, statuses = cases[name]
        w = RawWS(self.host, self.port, None, timeout=10)
        try:
            w.send(request)
            status, _ = w.read_http_head()
            self.bad_frames[f"http {name} -> {status}"] += 1
            if status not in statuses:
                self.violate(f"bad HTTP {name}: status {status}, expected {sorted(statuses)}")
        except (EOFError, ConnectionResetError, socket.timeout) as e:
            self.violate(f"bad HTTP {name}: no response ({e!r})")
        finally:
            w.close()

    async def bad_frame_worker(self, index):
        rng = random.Random(self.rng.random())
        cases, _ = self.frame_cases()
        http_cases = ["garbage", "no-token", "bad-signature", "expired", "header-too-long"]
        while not self.stop_load.is_set():
            if rng.random() < 0.15:
                name = rng.choice(http_cases)
                await asyncio.to_thread(self.bad_http_case, name)
                self.count("bad HTTP requests")
            else:
                case = rng.choice(cases)
                octets = case[3] and rng.random() < 0.5
                try:
                    await asyncio.to_thread(self.bad_frame_case, case, octets)
                except (OSError, RawError, EOFError) as e:
                    self.violate(f"bad frame {case[0]}: {e!r}")
                self.count("bad-frame connections")
            await asyncio.sleep(rng.uniform(0.05, 0.3))

    # -------------------------------------------------------------------------------------------------------------
    # Bad socket lines

    def line_cases(self):
        max_line = self.args.max_line_bytes
        bad = {"target": "acc_0", "bad": True}

        def pub(**kw):
            req = {"op": "publish", "channel": "wallet_updates", "type": EVENT_TYPE, "data": bad}
            req.update(kw)
            return (json.dumps({k: v for k, v in req.items() if v is not None}) + "\n").encode()

        return [
            ("garbage", b"garbage\n", {"INVALID_JSON"}),
            ("binary junk", b"\x00\xff\xfe\x01\x80\n", {"INVALID_JSON"}),
            ("open brace", b"{\n", {"INVALID_JSON"}),
            ("array", b"[1,2]\n", {"INVALID_JSON"}),
            ("number", b"42\n", {"INVALID_JSON"}),
            ("trailing garbage", b'{"op":"stats"} x\n', {"INVALID_JSON"}),
            ("NaN data", b'{"op":"publish","channel":"wallet_updates","account":"acc_0","type":"t","data":NaN}\n',
             {"INVALID_JSON"}),
            ("invalid utf-8", b'{"op":"publish","channel":"wallet_updates","account":"acc_\xff","type":"t","data":1}\n',
             {"INVALID_JSON"}),
            ("deep nesting", b'{"op":"publish","data":' + b"[" * 20000 + b"]" * 20000 + b"}\n", None),
            ("no op", b"{}\n", {"UNKNOWN_OP"}),
            ("unknown op", b'{"op":"explode"}\n', {"UNKNOWN_OP"}),
            ("op not a string", b'{"op":7}\n', {"UNKNOWN_OP", "INVALID_REQUEST"}),
            ("unknown channel", pub(account="acc_0", channel="nope"), {"UNKNOWN_CHANNEL"}),
            ("account and broadcast", pub(account="acc_0", broadcast=True), {"INVALID_REQUEST"}),
            ("neither account nor broadcast", pub(), {"INVALID_REQUEST"}),
            ("empty account", pub(account=""), {"INVALID_REQUEST"}),
            ("account not a string", pub(account=5), {"INVALID_REQUEST"}),
            ("broadcast false", pub(broadcast=False), {"INVALID_REQUEST"}),
            ("no type", pub(account="acc_0", type=None), {"INVALID_REQUEST"}),
            ("empty type", pub(account="acc_0", type=""), {"INVALID_REQUEST"}),
            ("type too long", pub(account="acc_0", type="t" * 129), {"INVALID_REQUEST"}),
            ("reserved type", pub(account="acc_0", type="pong"), {"RESERVED_TYPE"}),
            ("event too large", pub(account="acc_0", data={"target": "acc_0", "bad": True,
                                                          "pad": "x" * (self.args.max_event_bytes + 10)}),
             {"EVENT_TOO_LARGE"}),
            ("line too long", b"x" * (max_line + 4096) + b"\n", {"LINE_TOO_LONG"}),
            ("line too long json", b'{"op":"stats","pad":"' + b"y" * (max_line + 10) + b'"}\n', {"LINE_TOO_LONG"}),
            ("disconnect bad code", b'{"op":"disconnect","conn":"0-1","code":1006}\n', {"INVALID_REQUEST"}),
            ("disconnect unknown conn", b'{"op":"disconnect","conn":"9-999999999"}\n', {"NOT_FOUND"}),
        ]

    async def bad_line_worker(self):
        rng = random.Random(self.rng.random())
        cases = self.line_cases()
        sc = SocketClient(self.hub.socket_path)
        await sc.open()
        try:
            while not self.stop_load.is_set():
                roll = rng.random()
                if roll < 0.08:
                    # A line in tiny pieces, then a valid request on the same connection.
                    await self.pieces(sc, b'{"op":"stats","id":"pieces"}\n')
                    continue
                if roll < 0.12:
                    # Half a line, then hang up.
                    r, w = await asyncio.open_unix_connection(self.hub.socket_path)
                    w.write(b'{"op":"publish","channel":"wallet_updates","account":"acc_0","type":"x","da')
                    await w.drain()
                    w.close()
                    self.bad_lines["half line then hang-up"] += 1
                    continue
                name, line, codes = rng.choice(cases)
                if name.startswith("line too long") and rng.random() < 0.7:
                    continue  # a MiB each: keep them rare
                fut = await sc.send_raw(line)
                try:
                    reply, _ = await asyncio.wait_for(fut, 15)
                except Exception as e:  # noqa: BLE001
                    self.violate(f"bad socket line {name!r}: no reply ({e!r})")
                    return
                code = (reply.get("error") or {}).get("code")
                self.bad_lines[f"{name} -> {code}"] += 1
                if reply.get("ok") is not False or (codes is not None and code not in codes):
                    self.violate(f"bad socket line {name!r}: answered {json.dumps(reply)[:300]}, expected {codes}")
                ok = await sc.request({"op": "stats", "id": 1})
                if ok.get("ok") is not True or ok.get("id") != 1:
                    self.violate(f"after bad socket line {name!r}: stats answered {json.dumps(ok)[:300]}")
                await asyncio.sleep(rng.uniform(0.02, 0.15))
        finally:
            await sc.close()

    async def pieces(self, sc, line):
        # The request goes out in 1-3 byte writes with tiny pauses; its reply must still come back whole.
        fut = asyncio.get_running_loop().create_future()
        async with sc.lock:
            await sc.pending.put(fut)
            i = 0
            while i < len(line):
                k = random.randint(1, 3)
                sc.writer.write(line[i:i + k])
                await sc.writer.drain()
                i += k
                await asyncio.sleep(0.001)
        reply, _ = await asyncio.wait_for(fut, 15)
        self.bad_lines["request in 1-3 byte pieces -> ok"] += 1
        if reply.get("ok") is not True or reply.get("id") != "pieces":
            self.violate(f"request sent in pieces answered {json.dumps(reply)[:200]}")

    # -------------------------------------------------------------------------------------------------------------
    # The hub's resources

    def sample(self):
        rss, fds = proc_rss_kib(self.hub.pid), proc_fd_count(self.hub.pid)
        self.samples.append((now() - self.t0, rss, fds))
        return rss, fds

    async def monitor(self):
        admin = SocketClient(self.hub.socket_path)
        await admin.open()
        tick = 0
        try:
            while not self.monitor_stop.is_set():
                tick += 1
                if not self.hub.alive():
                    self.violate(f"the hub exited with {self.hub.proc.returncode} during the run:\n{self.hub.log_tail()}")
                    return
                try:
                    rss, fds = self.sample()
                except OSError:
                    continue
                if rss > self.baseline_rss + self.args.rss_margin_mib * 1024:
                    self.violate(f"hub RSS {rss // 1024} MiB exceeds baseline {self.baseline_rss // 1024} MiB + "
                                 f"{self.args.rss_margin_mib} MiB")
                if fds > self.baseline_fds + self.fd_margin:
                    self.violate(f"hub has {fds} descriptors open, above baseline {self.baseline_fds} + {self.fd_margin}")
                reply = await admin.request({"op": "connections", "limit": 100000}, timeout=15)
                for c in reply.get("connections", []):
                    q = c.get("queuedBytes", 0)
                    self.max_queued_seen = max(self.max_queued_seen, q)
                    if q > self.args.max_queued_bytes:
                        self.violate(f"connection {c.get('id')} ({c.get('account')}) has {q} bytes queued, above "
                                     f"--max-queued-bytes {self.args.max_queued_bytes}")
                if tick % 10 == 0:
                    stats = (await admin.request({"op": "stats"}, timeout=15)).get("stats", {})
                    self.log(f"rss {rss // 1024} MiB, fds {fds}, open {stats.get('connections', {}).get('open')}, "
                             f"published {stats.get('publishes', {}).get('total')}, acks "
                             f"{self.counts['publishes acknowledged']}, churned {self.counts['churn connections']}, "
                             f"slow {self.counts['slow consumers']}, bad frames {self.counts['bad-frame connections']}")
                try:
                    await asyncio.wait_for(self.monitor_stop.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
        finally:
            await admin.close()

    # -------------------------------------------------------------------------------------------------------------
    # End-of-run checks

    def check_publisher_numbering(self):
        for stream, acks in self.acks.items():
            seqs = sorted(a[1] for a in acks)
            if seqs != list(range(1, len(seqs) + 1)):
                dup = len(seqs) - len(set(seqs))
                self.violate(f"acknowledged seqs on {stream} are not 1..{len(seqs)} "
                             f"(first {seqs[:5]}, last {seqs[-3:]}, {dup} duplicates)")

    def check_delivery(self):
        by_send = {}
        for stream, acks in self.acks.items():
            acks.sort()
            by_send[stream] = ([a[0] for a in acks], acks)
        expected_recipients = collections.Counter()
        checked = 0
        expected_total = 0
        for sub in self.subs:
            if sub.t_ack is None or sub.t_leave is None:
                continue
            checked += 1
            for channel in sub.channels:
                for stream in ((channel, sub.account), (channel, "*")):
                    if stream not in by_send:
                        continue
                    times, acks = by_send[stream]
                    i = bisect.bisect_right(times, sub.t_ack)
                    missing = []
                    for t_send, seq, t_reply, delivered in acks[i:]:
                        if t_reply >= sub.t_leave:
                            continue
                        expected_total += 1
                        expected_recipients[(stream, seq)] += 1
                        if seq not in sub.received[stream]:
                            missing.append(seq)
                    if missing:
                        self.violate(f"{sub.label}: {len(missing)} acknowledged event(s) on {stream} published while it "
                                     f"was subscribed never arrived (seq {missing[:10]})")
        short = 0
        for stream, acks in self.acks.items():
            for t_send, seq, t_reply, delivered in acks:
                want = expected_recipients.get((stream, seq), 0)
                if delivered < want:
                    short += 1
                    if short <= 5:
                        self.violate(f"publish {stream} seq {seq} replied delivered {delivered}, but {want} checked "
                                     f"subscribers received it")
        return checked, expected_total

    # -------------------------------------------------------------------------------------------------------------
    async def run(self):
        args = self.args
        self.loop = asyncio.get_running_loop()
        self.loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=32))
        self.stop_load = asyncio.Event()
        self.publishers_done = asyncio.Event()
        self.monitor_stop = asyncio.Event()
        self.stall_bytes = {}
        self.slow_detect = []
        self.t0 = now()

        # Baseline: the hub idle after start (and after one admin round trip, which warms its socket path).
        admin = SocketClient(self.hub.socket_path)
        await admin.open()
        await admin.request({"op": "stats"})
        await admin.close()
        await asyncio.sleep(1.0)
        self.baseline_rss, self.baseline_fds = self.sample()
        concurrent_conns = (len(self.accounts) + len(self.slow_accounts) + 1 + args.churn + args.slow
                            + args.bad_frames + 3 * args.publishers + 6)
        # Each client connection is one descriptor in the hub; a connection the hub closes lingers at most ~2 s
        # (close-handshake wait / graceful linger) while the worker that owned it may already have opened the next.
        self.fd_margin = 2 * concurrent_conns + 16
        self.log(f"hub pid {self.hub.pid} on 127.0.0.1:{self.port}; baseline rss {self.baseline_rss} KiB, "
                 f"fds {self.baseline_fds}; fd bound baseline + {self.fd_margin}, rss bound baseline + "
                 f"{args.rss_margin_mib} MiB")
        monitor = asyncio.create_task(self.monitor())

        # Stable subscribers first, so they see the whole run.
        self.stable_ready = asyncio.Semaphore(0)
        stable = []
        plan = [(a, CHANNELS) for a in self.accounts] + [(a, CHANNELS) for a in self.slow_accounts]
        plan.append((self.accounts[0], ["wallet_updates"]))  # a second connection of acc_0, one channel
        for i, (account, channels) in enumerate(plan):
            stable.append(asyncio.create_task(self.stable_client(i, account, channels)))
        for _ in plan:
            try:
                await asyncio.wait_for(self.stable_ready.acquire(), 15)
            except asyncio.TimeoutError:
                self.violate("stable subscribers did not all connect within 15s")
                break
        await asyncio.sleep(0.5)  # their "subscribed" replies

        load_start = now()
        pubs = [asyncio.create_task(self.publisher(i, args.rate / args.publishers)) for i in range(args.publishers)]
        workers = [asyncio.create_task(self.churn_worker(i)) for i in range(args.churn)]
        workers += [asyncio.create_task(self.slow_worker(i)) for i in range(args.slow)]
        workers += [asyncio.create_task(self.bad_frame_worker(i)) for i in range(args.bad_frames)]
        if args.bad_lines:
            workers.append(asyncio.create_task(self.bad_line_worker()))
        self.log(f"load started for {args.duration:.0f}s: {args.rate}/s publishes over {args.publishers} "
                 f"publishers, {len(plan)} stable subscribers, {args.churn} churn workers, {args.slow} slow "
                 f"consumers, {args.bad_frames} bad-frame workers, {1 if args.bad_lines else 0} bad-line worker")
        if args.inject == "kill-hub":
            try:
                await asyncio.wait_for(self.stop_load.wait(), args.duration / 2)
            except asyncio.TimeoutError:
                self.log("self-test: SIGKILL to the hub")
                os.kill(self.hub.pid, 9)
        try:
            await asyncio.wait_for(self.stop_load.wait(), args.duration)
        except asyncio.TimeoutError:
            pass
        self.stop_load.set()
        load_time = now() - load_start
        self.log("load stopping: waiting for the workers to finish their current step")
        done, not_done = await asyncio.wait(workers, timeout=60)
        for t in not_done:
            self.violate("a load worker did not finish within 60s after the stop")
            t.cancel()
        for t in done:
            if t.exception() is not None:
                self.violate(f"a load worker failed: {t.exception()!r}")
        await asyncio.wait(pubs, timeout=60)
        for t in pubs:
            if t.done() and t.exception() is not None:
                self.violate(f"a publisher failed: {t.exception()!r}")
        self.publishers_done.set()
        done, not_done = await asyncio.wait(stable, timeout=60)
        for t in not_done:
            self.violate("a stable subscriber did not finish its barrier within 60s")
            t.cancel()
        for t in done:
            if t.exception() is not None:
                self.violate(f"a stable subscriber failed: {t.exception()!r}")
        self.monitor_stop.set()
        await monitor

        self.check_publisher_numbering()
        checked, expected_total = self.check_delivery()
        result = {"load_time": load_time, "checked_subs": checked, "expected_deliveries": expected_total}
        if not self.hub.alive():
            return result

        leaked = []
        if args.inject == "fd-leak":
            for _ in range(10):  # self-test: connections the driver "forgets" to close
                leaked.append(await asyncio.open_unix_connection(self.hub.socket_path))
        # Recovery: with every client gone, descriptors must return to the baseline and RSS near it.
        self.log("load stopped: waiting for descriptors to return to the baseline")
        peak_rss = max(s[1] for s in self.samples)
        peak_fds = max(s[2] for s in self.samples)
        deadline = now() + args.recovery_timeout
        rss, fds = self.sample()
        while now() < deadline:
            rss, fds = self.sample()
            if fds <= self.baseline_fds + args.fd_end_slack:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)
        rss, fds = self.sample()
        if fds > self.baseline_fds + args.fd_end_slack:
            self.violate(f"descriptors did not return to the baseline: {fds} open {args.recovery_timeout:.0f}s "
                         f"after the load, baseline {self.baseline_fds} (+{args.fd_end_slack} allowed): a leak")
        end_margin = max(args.rss_end_mib * 1024, 0)
        if rss > self.baseline_rss + end_margin:
            self.violate(f"RSS did not come back near the baseline: {rss // 1024} MiB after the load, baseline "
                         f"{self.baseline_rss // 1024} MiB (+{args.rss_end_mib} MiB allowed)")
        try:
            self.hub_cpu = proc_cpu_seconds(self.hub.pid)
        except OSError:
            self.hub_cpu = None
        import resource
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.driver_cpu = usage.ru_utime + usage.ru_stime
        stats_client = SocketClient(self.hub.socket_path)
        await stats_client.open()
        self.hub_stats = (await stats_client.request({"op": "stats"})).get("stats", {})
        await stats_client.close()
        if self.hub_stats.get("connections", {}).get("open") not in (0, None):
            self.violate(f"the hub still counts {self.hub_stats['connections']['open']} open connections after every "
                         f"client left")

        result.update({"peak_rss": peak_rss, "peak_fds": peak_fds, "end_rss": rss, "end_fds": fds})
        return result

    def summary(self, result, exit_status):
        c = self.counts
        print("\n==== soak summary ====")
        if result:
            print(f"load time             {result['load_time']:.1f} s")
        print(f"publishes             {c['account publishes']} per-account, {c['broadcast publishes']} broadcast, "
              f"{c['bulk publishes']} bulk (slow consumers); {c['publishes acknowledged']} acknowledged, "
              f"{c['publish bytes'] / 1e6:.1f} MB of lines")
        print(f"delivered             {c['delivered (sum of replies)']} (sum of the replies' delivered)")
        total_events = sum(s.events for s in self.subs)
        print(f"received (checked)    {total_events} events by {len(self.subs)} recorded subscriptions")
        if result:
            print(f"delivery check        {result['checked_subs']} subscriptions checked, "
                  f"{result['expected_deliveries']} (subscriber, event) pairs expected and found")
        if self.latencies:
            print(f"latency (stable)      p50 {percentile(self.latencies, 50) * 1000:.1f} ms, "
                  f"p99 {percentile(self.latencies, 99) * 1000:.1f} ms, max {max(self.latencies) * 1000:.1f} ms "
                  f"({len(self.latencies)} events, publish write -> client read)")
        print(f"connections churned   {c['churn connections']}")
        print(f"slow consumers        {c['slow consumers']}; hub began the close after "
              + (f"{percentile(self.slow_detect, 50):.1f} s median, {max(self.slow_detect):.1f} s max of not reading"
                 if self.slow_detect else "-"))
        print(f"bad-frame conns       {c['bad-frame connections']}, bad HTTP requests {c['bad HTTP requests']}")
        print(f"bad socket lines      {sum(self.bad_lines.values())}")
        print("closes by code (as the client saw them):")
        for key in sorted(self.closes):
            print(f"    {key:40s} {self.closes[key]}")
        print("bad frames (case/mode -> close code):")
        for key in sorted(self.bad_frames):
            print(f"    {key:50s} {self.bad_frames[key]}")
        print("bad socket lines (case -> error code):")
        for key in sorted(self.bad_lines):
            print(f"    {key:50s} {self.bad_lines[key]}")
        if self.samples:
            rss = [s[1] for s in self.samples]
            fds = [s[2] for s in self.samples]
            print(f"hub RSS               baseline {self.baseline_rss / 1024:.1f} MiB, min {min(rss) / 1024:.1f}, "
                  f"max {max(rss) / 1024:.1f}, end {rss[-1] / 1024:.1f} MiB")
            print(f"hub descriptors       baseline {self.baseline_fds}, min {min(fds)}, max {max(fds)}, end {fds[-1]}")
            print(f"max queued bytes      {self.max_queued_seen} seen on one connection (limit {self.args.max_queued_bytes})")
        if self.hub_stats:
            s = self.hub_stats
            print(f"hub stats             publishes {s.get('publishes', {}).get('total')}, delivered "
                  f"{s.get('publishes', {}).get('delivered')}, drops {json.dumps(s.get('drops'))}, "
                  f"auth failures {json.dumps(s.get('authFailures'))}")
        if getattr(self, "hub_cpu", None) is not None and result:
            print(f"CPU                   hub {self.hub_cpu:.1f} s, driver {self.driver_cpu:.1f} s over "
                  f"{result['load_time']:.0f} s of load ({100 * self.hub_cpu / result['load_time']:.0f}% and "
                  f"{100 * self.driver_cpu / result['load_time']:.0f}% of one core)")
        print(f"hub exit on SIGTERM   {exit_status}")
        if self.violations:
            print(f"FAILED: {len(self.violations)} violation(s); first: {self.violations[0]}")
        else:
            print("OK: no violation")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("duration", help="how long the load runs: 60, 60s, 10m")
    ap.add_argument("--hub", required=True, help="the release hub binary")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (hub log) even on success")
    ap.add_argument("--accounts", type=int, default=10)
    ap.add_argument("--rate", type=float, default=150.0, help="regular publishes per second, all publishers")
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--broadcast-share", type=float, default=0.1)
    ap.add_argument("--churn", type=int, default=6, help="churn workers")
    ap.add_argument("--slow", type=int, default=2, help="slow-consumer workers (each with its own account)")
    ap.add_argument("--bad-frames", type=int, default=2, help="bad-frame workers")
    ap.add_argument("--bad-lines", type=int, choices=[0, 1], default=1, help="run the bad-socket-line worker")
    ap.add_argument("--bulk-rate", type=float, default=60.0, help="bulk events/s to a stalled slow consumer's account")
    ap.add_argument("--bulk-bytes", type=int, default=16000)
    ap.add_argument("--stall-limit", type=float, default=9.0,
                    help="longest a slow consumer waits (not reading) for the hub to start closing it")
    ap.add_argument("--kernel-allowance", type=int, default=6 << 20,
                    help="bytes the kernel's socket buffers may absorb before the hub's own queue grows")
    ap.add_argument("--max-queued-bytes", type=int, default=262144)
    ap.add_argument("--max-message-bytes", type=int, default=65536)
    ap.add_argument("--max-line-bytes", type=int, default=1048576)
    ap.add_argument("--max-event-bytes", type=int, default=262144)
    ap.add_argument("--rss-margin-mib", type=int, default=96,
                    help="RSS may exceed the idle baseline by this much during the load")
    ap.add_argument("--rss-end-mib", type=int, default=48,
                    help="RSS after the load may exceed the idle baseline by this much (it includes the history ring)")
    ap.add_argument("--history-memory-mib", type=int, default=16,
                    help="the hub's --history-memory: its history ring, resident after the load until the TTL")
    ap.add_argument("--fd-end-slack", type=int, default=2)
    ap.add_argument("--recovery-timeout", type=float, default=15.0)
    ap.add_argument("--inject", choices=["cross-account", "lose-event", "fd-leak", "kill-hub"],
                    help="self-test of the checks: make the run fail in this way (it must exit 1)")
    args = ap.parse_args()
    args.duration = parse_duration(args.duration)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    workdir = tempfile.mkdtemp(prefix="hub-soak-")
    secret = make_secret(os.path.join(workdir, "jwt-secret"))
    hub = HubProcess(args.hub, workdir, [
        "--listen", "127.0.0.1:0", "--state-dir", os.path.join(workdir, "state"),
        "--jwt-secret-file", os.path.join(workdir, "jwt-secret"), "--threads", "2",
        "--max-queued-bytes", str(args.max_queued_bytes), "--max-message-bytes", str(args.max_message_bytes),
        "--max-line-bytes", str(args.max_line_bytes), "--max-event-bytes", str(args.max_event_bytes),
        "--ping-interval", "10s", "--pong-timeout", "10s", "--max-connections-per-account", "64",
        # The history is a ring of --history-memory bytes that stays resident after a load until its events expire
        # (--history-ttl); the soak publishes large events to few accounts, which fill it. 16 MiB keeps that inside
        # --rss-end-mib, so the end check still finds a leak rather than a full ring.
        "--history-memory", str(args.history_memory_mib) + "m"])
    print(f"soak: seed {args.seed}, work dir {workdir}", flush=True)
    hub.start()
    soak = Soak(args)
    soak.secret, soak.hub, soak.host, soak.port = secret, hub, "127.0.0.1", hub.port
    soak.url = f"ws://127.0.0.1:{hub.port}/ws"
    result = None
    exit_status = None
    try:
        result = asyncio.run(asyncio.wait_for(soak.run(), args.duration + 300))
    except asyncio.TimeoutError:
        soak.violate("the soak did not finish within DURATION + 300s")
    except KeyboardInterrupt as e:
        soak.violate(f"interrupted ({e})")
    except Exception as e:  # noqa: BLE001
        soak.violate(f"the soak driver failed: {e!r}")
        import traceback
        traceback.print_exc()
    finally:
        if hub.alive():
            exit_status = hub.terminate(timeout=15)
            if exit_status != 0:
                soak.violate(f"the hub exited with {exit_status} on SIGTERM (expected 0)")
        else:
            exit_status = hub.proc.returncode
            soak.violate(f"the hub was not running at the end (exit status {exit_status})")
    soak.summary(result, exit_status)
    if soak.violations:
        print(f"\nhub log: {hub.log_path}\n--- last lines ---\n{hub.log_tail()}")
        return 1
    if args.keep:
        print(f"work dir kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
