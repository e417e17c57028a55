#!/usr/bin/env python3
"""Conformance-style checks against the hub's /echo (hub started with --echo), from outside implementations:
Python's `websockets` (with permessage-deflate offered) and a raw socket for what a well-behaved library will
not send (invalid UTF-8, interleaved control frames, exact control-frame bytes).

Prints one JSON line per check on stdout:
    {"check": "echo-text-1048576", "ok": true, "detail": "..."}
and exits 0 when every check passed, 1 otherwise. Run by Tests/HubTests/InteropPythonTests.swift; by hand:
    python3 Tests/python/echo.py --url ws://127.0.0.1:8080/echo
"""
import argparse
import asyncio
import base64
import hashlib
import json
import os
import random
import socket
import struct
import sys
import urllib.parse

from websockets.asyncio.client import connect  # the asyncio implementation (websockets >= 13)

SIZES = [0, 1024, 1 << 20, 4 << 20]
results = []


def report(check, ok, detail=""):
    results.append(ok)
    print(json.dumps({"check": check, "ok": bool(ok), "detail": detail}), flush=True)


def text_of_size(n):
    """Exactly n UTF-8 bytes mixing 1-, 2-, 3- and 4-byte characters (so code points straddle frame and
    compression block boundaries)."""
    unit = "a\u00e9\u20ac\U0001F642"  # 1 + 2 + 3 + 4 = 10 bytes
    s = unit * (n // 10) + "x" * (n % 10)
    assert len(s.encode("utf-8")) == n
    return s


def describe(value):
    kind = "text" if isinstance(value, str) else "binary"
    size = len(value.encode("utf-8")) if isinstance(value, str) else len(value)
    return f"{kind} {size} B"


async def with_websockets(url, timeout):
    """Echo through `websockets` with permessage-deflate offered: the hub must negotiate it on /echo."""
    async with connect(url, compression="deflate", max_size=None, ping_interval=None,
                       open_timeout=timeout, close_timeout=timeout) as ws:
        names = [e.name for e in ws.protocol.extensions]
        header = ws.response.headers.get("Sec-WebSocket-Extensions")
        report("deflate-negotiated", "permessage-deflate" in names, f"extensions {names}, header {header!r}")

        rng = random.Random(7)
        for size in SIZES:
            for kind in ("text", "binary"):
                message = text_of_size(size) if kind == "text" else rng.randbytes(size)
                await ws.send(message)
                echoed = await asyncio.wait_for(ws.recv(), timeout)
                same = type(echoed) is type(message) and echoed == message
                report(f"echo-{kind}-{size}", same, f"sent {describe(message)}, got {describe(echoed)}")

        # A fragmented message: websockets sends an iterable as one message in several frames.
        await ws.send(["frag", "ment", "ed \u2713 ", "\U0001F642"])
        echoed = await asyncio.wait_for(ws.recv(), timeout)
        report("fragmented-text", echoed == "fragmented \u2713 \U0001F642", f"got {echoed!r}")
        chunks = [bytes([i]) * 3000 for i in range(5)]
        await ws.send(chunks)
        echoed = await asyncio.wait_for(ws.recv(), timeout)
        report("fragmented-binary", echoed == b"".join(chunks), f"got {describe(echoed)}")

        # Ping with a payload: websockets resolves the waiter only on a pong carrying the same payload.
        waiter = await ws.ping(b"hub-ping-\x00\xff")
        try:
            latency = await asyncio.wait_for(waiter, timeout)
            report("ping-pong-websockets", True, f"pong with the same payload after {latency:.4f}s")
        except asyncio.TimeoutError:
            report("ping-pong-websockets", False, "no pong with the ping's payload")

        await ws.close(1000, "done here")
        rcvd = ws.protocol.close_rcvd
        report("close-1000-websockets", rcvd is not None and rcvd.code == 1000,
               f"hub's close: {rcvd.code if rcvd else None} {rcvd.reason if rcvd else None!r}")


async def deflate_parameters(url, timeout):
    """Each permessage-deflate parameter of RFC 7692 offered by websockets: the hub's answer must be one
    websockets accepts, and messages must still round-trip (with repeats at distances up to the window size)."""
    from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory as Offer

    offers = {
        "no-params": Offer(),
        "server-no-context-takeover": Offer(server_no_context_takeover=True),
        "client-no-context-takeover": Offer(client_no_context_takeover=True),
        "server-max-window-bits-9": Offer(server_max_window_bits=9),
        "server-max-window-bits-12": Offer(server_max_window_bits=12),
        "client-max-window-bits-9": Offer(client_max_window_bits=9),
        "all": Offer(server_no_context_takeover=True, client_no_context_takeover=True,
                     server_max_window_bits=10, client_max_window_bits=10),
    }
    rng = random.Random(11)
    for name, offer in offers.items():
        check = f"deflate-offer-{name}"
        try:
            async with connect(url, extensions=[offer], compression=None, max_size=None, ping_interval=None,
                               open_timeout=timeout, close_timeout=timeout) as ws:
                header = ws.response.headers.get("Sec-WebSocket-Extensions")
                same = True
                for _ in range(2):  # twice: context takeover (or not) between messages
                    for message in [text_of_size(20000), rng.randbytes(300) * 40, bytes(50000), "x"]:
                        await ws.send(message)
                        same = same and await asyncio.wait_for(ws.recv(), timeout) == message
                report(check, same and header is not None, f"hub answered {header!r}")
        except Exception as e:
            report(check, False, f"{type(e).__name__}: {e}")


class Raw:
    """A minimal RFC 6455 client on a plain socket: sends exactly the frames it is told to."""

    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        request = (f"GET {target} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError("connection closed during the handshake")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 101"):
            raise RuntimeError(f"handshake refused: {lines[0]}")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        headers = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
        if headers.get("sec-websocket-accept") != accept.decode():
            raise RuntimeError("bad Sec-WebSocket-Accept")

    def send(self, opcode, payload, fin=True):
        mask = os.urandom(4)
        header = bytes([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def frame(self):
        """(fin, opcode, payload) of the next frame; the server must not mask."""
        b0, b1 = self._read(2)
        if b1 & 0x80:
            raise RuntimeError("server frame is masked")
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        return bool(b0 & 0x80), b0 & 0x0F, self._read(n)

    def close_code(self):
        """Reads frames until a close frame; returns (code, reason)."""
        while True:
            _, opcode, payload = self.frame()
            if opcode == 0x8:
                if len(payload) < 2:
                    return None, ""
                return struct.unpack("!H", payload[:2])[0], payload[2:].decode("utf-8", "replace")

    def eof(self):
        try:
            self._read(1)
            return False
        except EOFError:
            return True
        except OSError:
            return True

    def close(self):
        self.sock.close()


def raw_checks(url, timeout):
    TEXT, BINARY, CONT, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA

    def run(name, body):
        raw = None
        try:
            raw = Raw(url, timeout)
            ok, detail = body(raw)
            report(name, ok, detail)
        except Exception as e:  # a timeout or a broken connection is a failed check, with its reason
            report(name, False, f"{type(e).__name__}: {e}")
        finally:
            if raw:
                raw.close()

    def ping(raw):
        payload = b"hub-ping-\x00\xff\x7f"
        raw.send(PING, payload)
        fin, opcode, got = raw.frame()
        return opcode == PONG and got == payload and fin, f"opcode {opcode}, payload {got!r}"

    def ping_between_fragments(raw):
        raw.send(TEXT, "caf".encode(), fin=False)
        raw.send(PING, b"mid")
        raw.send(CONT, "\u00e9".encode())
        first = raw.frame()
        second = raw.frame()
        ok = first[1] == PONG and first[2] == b"mid" and second[1] == TEXT and second[2] == "caf\u00e9".encode()
        return ok, f"frames {first[1]} {first[2]!r}, {second[1]} {second[2]!r}"

    def close_with(code, reason):
        def body(raw):
            raw.send(CLOSE, struct.pack("!H", code) + reason.encode())
            got, why = raw.close_code()
            eof = raw.eof()
            return got == code and eof, f"hub's close code {got} reason {why!r}, TCP closed {eof}"
        return body

    def invalid_utf8(frames):
        def body(raw):
            for fin, opcode, payload in frames:
                raw.send(opcode, payload, fin=fin)
            got, why = raw.close_code()
            return got == 1007, f"hub's close code {got} reason {why!r}"
        return body

    run("ping-pong-raw", ping)
    run("ping-between-fragments-raw", ping_between_fragments)
    run("close-1000-raw", close_with(1000, "bye now"))
    run("close-4321-raw", close_with(4321, "custom"))
    run("invalid-utf8-raw", invalid_utf8([(True, TEXT, b"valid then \xff\xfe")]))
    run("invalid-utf8-surrogate-raw", invalid_utf8([(True, TEXT, b"\xed\xa0\x80")]))
    run("invalid-utf8-fragmented-raw", invalid_utf8([(False, TEXT, b"ok so far "), (True, CONT, b"\xc3\x28")]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="ws://127.0.0.1:PORT/echo")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--skip", default="", help="comma-separated groups to skip: websockets, deflate-offers, raw")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if "websockets" not in skip:
        try:
            asyncio.run(with_websockets(args.url, args.timeout))
        except Exception as e:
            report("websockets-session", False, f"{type(e).__name__}: {e}")
    if "deflate-offers" not in skip:
        asyncio.run(deflate_parameters(args.url, args.timeout))
    if "raw" not in skip:
        raw_checks(args.url, args.timeout)
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
