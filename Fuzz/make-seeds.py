#!/usr/bin/env python3
"""Writes the hand-made seeds of the connection fuzz targets (python3 standard library only).

    Fuzz/make-seeds.py            # (re)writes Tests/HubTests/Corpus/{client,socket}/seed_*

Input format (docs/TESTING.md, "Fuzzing"): byte 0 chooses the scenario, then the stream the peer sends, cut into
reads: a length byte L and the next L bytes (L == 0: all the rest). The token below is the one ConnectionHarness mints
(HS256 over its fixed secret, sub acc_fuzz, exp 2100-01-01), so raw requests can carry it. Files the fuzzer found
(named by their SHA-1) sit next to these seeds and are not touched.
"""
import base64, hashlib, hmac, json, os, struct, zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "HubTests", "Corpus")
SECRET = b"hub-fuzz-harness-secret-0123456789abcdef"
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(sub):
    header = b64url(b'{"alg":"HS256","typ":"JWT"}')
    payload = b64url(('{"sub":"%s","exp":4102444800}' % sub).encode())
    signing_input = (header + "." + payload).encode()
    return header + "." + payload + "." + b64url(hmac.new(SECRET, signing_input, hashlib.sha256).digest())


TOKEN, OTHER = token("acc_fuzz"), token("acc_other")

# Client scenarios (byte 0, bits 0-2) and options.
RAW, WS_HEADER, WS_QUERY, WS_BAD, WS_NONE, ECHO, ECHO_DEFLATE, ECHO_DEFLATE_NOCTX = range(8)
SMALL, PUBLISH, OPEN_HEAD = 0x08, 0x10, 0x20
# Socket options.
S_SMALL, S_CLIENT, S_PUBLISH, S_ABRUPT = 0x01, 0x02, 0x04, 0x08


def frame(opcode, payload=b"", fin=True, mask=b"\0\0\0\0", rsv1=False):
    """A masked client frame (mask 0 by default, so the payload stays readable)."""
    b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        head = bytes([b0, 0x80 | n])
    elif n < 65536:
        head = bytes([b0, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([b0, 0x80 | 127]) + struct.pack(">Q", n)
    masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
    return head + mask + masked


def text(obj_or_text, **kw):
    data = obj_or_text if isinstance(obj_or_text, (bytes, str)) else json.dumps(obj_or_text, separators=(",", ":"))
    return frame(0x1, data.encode() if isinstance(data, str) else data, **kw)


def close(code=1000, reason=b""):
    return frame(0x8, struct.pack(">H", code) + reason)


def deflate(data):
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\0\0\xff\xff")
    return out[:-4]


def encode(flags, stream, read_size=0):
    """byte 0, then the stream in reads of read_size octets (0: one read)."""
    out = bytes([flags])
    if not stream:
        return out
    if read_size <= 0:
        return out + b"\0" + stream
    for i in range(0, len(stream), read_size):
        piece = stream[i:i + read_size]
        out += bytes([len(piece)]) + piece
    return out


def reads(flags, pieces):
    """byte 0, then each piece as one read (each under 256 bytes)."""
    out = bytes([flags])
    for p in pieces:
        assert 0 < len(p) < 256
        out += bytes([len(p)]) + p
    return out


def request(path="/ws", headers=(), version="HTTP/1.1", method="GET", end=True):
    head = "%s %s %s\r\nHost: hub.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" % (method, path, version)
    head += "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n" % KEY
    for h in headers:
        head += h + "\r\n"
    return (head + ("\r\n" if end else "")).encode()


HELLO_MASK = b"\x37\xfa\x21\x3d"
SUB_BOTH = text({"type": "subscribe", "channels": ["profile_updates", "wallet_updates"], "id": "s1"})
SUB_WALLET = text({"type": "subscribe", "channels": ["wallet_updates"], "id": 2})
PING_MSG = text({"type": "ping", "id": 7})
UNSUB = text({"type": "unsubscribe", "channels": ["wallet_updates"], "id": "u1"})


def client_seeds():
    s = {}
    # The crash inputs (issue 8): a frame that must fail the connection, one octet per read.
    hello = frame(0x1, b"Hello", mask=HELLO_MASK)
    for name, first in (("rsv1", 0xC1), ("op7", 0x87), ("opf", 0x8F)):
        bad = bytes([first]) + hello[1:]
        for scen, label in ((ECHO, "echo"), (WS_HEADER, "ws")):
            s["crash_%s_%s_bytewise" % (label, name)] = encode(scen, bad + close(1000), 1)
    s["crash_echo_rsv1_whole"] = encode(ECHO, bytes([0xC1]) + hello[1:])
    # /ws: subscribe, ping, unsubscribe, close; whole, byte by byte, and in small reads.
    session = SUB_BOTH + PING_MSG + UNSUB + close(1000)
    s["ws_header_session"] = encode(WS_HEADER, session)
    s["ws_query_session_bytewise"] = encode(WS_QUERY, session, 1)
    s["ws_header_session_reads7"] = encode(WS_HEADER, session, 7)
    s["ws_bad_token"] = encode(WS_BAD, b"")
    s["ws_no_token"] = encode(WS_NONE, b"")
    # First-message auth (no token in the upgrade): auth first, then the session; or something else first (4003).
    s["ws_first_auth_session"] = encode(WS_NONE, text({"type": "auth", "token": TOKEN, "platform": "web", "appVersion": "2.0", "id": "a0"})
                                        + session)
    s["ws_first_auth_publish"] = reads(WS_NONE | PUBLISH, [text({"type": "auth", "token": TOKEN}), SUB_BOTH, PING_MSG, close(1000)])
    s["ws_first_not_auth"] = encode(WS_NONE, SUB_WALLET + PING_MSG)
    s["ws_first_bad_auth"] = encode(WS_NONE, text({"type": "auth", "token": "x.y.z", "id": 1}) + SUB_WALLET)
    s["ws_publish_subscribed"] = reads(WS_HEADER | PUBLISH, [SUB_BOTH, PING_MSG, UNSUB, frame(0x9, b"hb"), close(4000, b"bye")])
    s["ws_publish_small"] = reads(WS_HEADER | PUBLISH | SMALL, [SUB_WALLET, SUB_BOTH, PING_MSG])
    s["ws_auth"] = encode(WS_HEADER, text({"type": "auth", "token": TOKEN, "id": "a1"}) + text({"type": "auth", "token": OTHER, "id": "a2"})
                          + text({"type": "auth", "token": "x.y.z", "id": "a3"}) + close(1000))
    s["ws_errors"] = encode(WS_HEADER, text(b"not json") + text(b"[1,2]") + text({"type": "nope"}) + text({"type": "subscribe", "channels": ["nope"]})
                            + text({"type": "subscribe"}) + text({"id": 1}) + close(1001))
    s["ws_binary"] = encode(WS_HEADER, frame(0x2, b"\x00\x01") + PING_MSG)
    s["ws_small_rate_limit"] = encode(WS_HEADER | SMALL, PING_MSG * 12)
    s["ws_small_too_big"] = encode(WS_HEADER | SMALL, text(b'{"type":"ping","id":"' + b"x" * 130 + b'"}'))
    s["ws_small_subscriptions"] = encode(WS_HEADER | SMALL, SUB_WALLET + SUB_BOTH + UNSUB)
    s["ws_fragmented"] = encode(WS_HEADER, frame(0x1, b'{"type":"pi', fin=False) + frame(0x9, b"p") + frame(0x0, b'ng","id":1}') + close())
    s["ws_close_empty"] = encode(WS_HEADER, frame(0x8, b""))
    s["ws_close_bad_code"] = encode(WS_HEADER, close(999))
    s["ws_close_bad_reason"] = encode(WS_HEADER, close(1000, b"\xff\xfe"))
    s["ws_open_head_headers"] = encode(WS_HEADER | OPEN_HEAD, b"Origin: https://app.example\r\nX-Platform: iOS\r\nX-App-Version: 1.0\r\n\r\n" + SUB_BOTH)
    s["ws_open_head_two_auth"] = encode(WS_HEADER | OPEN_HEAD, ("Authorization: Bearer %s\r\n\r\n" % TOKEN).encode())
    # /echo
    s["echo_session"] = encode(ECHO, hello + frame(0x2, bytes(range(40))) + frame(0x9, b"ping") + frame(0xA, b"pong") + close(1000, b"done"))
    s["echo_fragmented_bytewise"] = encode(ECHO, frame(0x1, b"Hel", fin=False) + frame(0x0, b"lo", fin=False) + frame(0x0, b"!") + close(), 1)
    s["echo_invalid_utf8"] = encode(ECHO, frame(0x1, b"ok\xc3") + close())
    s["echo_invalid_utf8_fragment"] = encode(ECHO, frame(0x1, b"ok\xc3", fin=False) + frame(0x0, b"\x28"))
    s["echo_control_fragmented"] = encode(ECHO, frame(0x9, b"x", fin=False))
    s["echo_continuation_first"] = encode(ECHO, frame(0x0, b"x"))
    s["echo_unmasked"] = encode(ECHO, b"\x81\x05Hello")
    s["echo_length64"] = encode(ECHO, b"\x82\xff" + struct.pack(">Q", 1 << 63) + b"\0\0\0\0")
    s["echo_big_spill"] = encode(ECHO, frame(0x2, bytes(i & 0xFF for i in range(6000))) + close(), 200)
    s["echo_small_slow_consumer"] = encode(ECHO | SMALL, frame(0x2, b"z" * 250) * 20)
    s["echo_small_too_big"] = encode(ECHO | SMALL, frame(0x2, b"z" * 301))
    # Found by the Client target: 16 echoes fill the 4 KiB queue, then a frame with RSV bits: the 1002 close frame was
    # refused by the queue cap and TCP closed without it.
    s["regress_fail_close_at_queue_cap"] = encode(ECHO | SMALL, frame(0x2, b"z" * 250) * 16 + b"\x7a\x80\0\0\0\0")
    # Found by the Client target (2.46 M executions on fbd9fcd): with the queue that full, pings' pongs did not fit and
    # were dropped without a word, so pings went unanswered on a connection left open. A pong is now written like any
    # frame: one that does not fit closes the connection as a slow consumer (4008).
    s["regress_ping_at_queue_cap"] = encode(ECHO | SMALL, frame(0x2, b"z" * 250) * 16 + b"".join(frame(0x9, b"ping-%04d" % i) for i in range(5)))
    long_text = b"hello hello hello hello hello hello hello hello hello hello hello hello hello!"
    s["echo_deflate"] = encode(ECHO_DEFLATE, frame(0x1, deflate(long_text), rsv1=True) + frame(0x1, b"plain") + close())
    s["echo_deflate_bytewise"] = encode(ECHO_DEFLATE, frame(0x1, deflate(long_text), rsv1=True) + close(), 1)
    s["echo_deflate_fragmented"] = encode(ECHO_DEFLATE, frame(0x1, deflate(long_text)[:5], rsv1=True, fin=False) + frame(0x0, deflate(long_text)[5:]) + close())
    s["echo_deflate_rsv1_continuation"] = encode(ECHO_DEFLATE, frame(0x1, b"a", fin=False) + frame(0x0, b"b", rsv1=True))
    s["echo_deflate_garbage"] = encode(ECHO_DEFLATE, frame(0x2, b"\xff\xff\xff\xff", rsv1=True))
    s["echo_deflate_bomb_small"] = encode(ECHO_DEFLATE | SMALL, frame(0x2, deflate(b"\0" * 100000), rsv1=True))
    s["echo_deflate_noctx"] = encode(ECHO_DEFLATE_NOCTX, frame(0x1, deflate(long_text), rsv1=True) * 2 + close())
    s["echo_open_head_deflate"] = encode(ECHO | OPEN_HEAD, b"Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=8; client_max_window_bits=9\r\n\r\n"
                                         + frame(0x1, deflate(long_text), rsv1=True) + close())
    # Raw: the whole stream, request head included.
    s["raw_healthz"] = encode(RAW, b"GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n")
    s["raw_head_healthz"] = encode(RAW, b"HEAD /healthz HTTP/1.1\r\nHost: hub\r\n\r\n")
    s["raw_metrics"] = encode(RAW, b"GET /metrics HTTP/1.1\r\nHost: hub\r\n\r\n")
    s["raw_not_found"] = encode(RAW, b"GET /nope HTTP/1.1\r\nHost: hub\r\n\r\n")
    s["raw_post_healthz"] = encode(RAW, b"POST /healthz HTTP/1.1\r\nHost: hub\r\nContent-Length: 0\r\n\r\n")
    s["raw_no_host"] = encode(RAW, b"GET /healthz HTTP/1.1\r\n\r\n")
    s["raw_http10"] = encode(RAW, b"GET /healthz HTTP/1.0\r\n\r\n")
    s["raw_garbage"] = encode(RAW, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    s["raw_pipelined"] = encode(RAW, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    s["raw_ws_session"] = encode(RAW, request("/ws", ["Authorization: Bearer " + TOKEN]) + session, 9)
    s["raw_ws_query"] = encode(RAW, request("/ws?access_token=" + TOKEN) + SUB_WALLET + close())
    s["raw_ws_absolute"] = encode(RAW, request("http://hub.test/ws", ["Authorization: Bearer " + TOKEN]) + PING_MSG)
    s["raw_ws_expired"] = encode(RAW, request("/ws", ["Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhIiwiZXhwIjoxfQ.AAAA"]))
    s["raw_ws_two_auth"] = encode(RAW, request("/ws", ["Authorization: Bearer " + TOKEN, "Authorization: Bearer " + TOKEN]))
    s["raw_ws_bad_version"] = encode(RAW, request("/ws").replace(b"Version: 13", b"Version: 8"))
    s["raw_ws_post"] = encode(RAW, request("/ws", method="POST"))
    s["raw_echo_deflate_offers"] = encode(RAW, request("/echo", ["Sec-WebSocket-Extensions: x-foo, permessage-deflate; client_max_window_bits=20, permessage-deflate; server_no_context_takeover"])
                                          + frame(0x1, deflate(long_text), rsv1=True) + close(), 13)
    s["raw_echo_origin"] = encode(RAW, request("/echo", ["Origin: null", "Origin: https://x"]))
    s["raw_head_bytewise"] = encode(RAW, request("/echo") + hello, 1)
    return s


def line(obj):
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def socket_seeds():
    s = {}
    pub = line({"op": "publish", "channel": "wallet_updates", "account": "acc_fuzz", "type": "balance", "data": {"b": "1.5"}, "id": 1})
    bcast = line({"op": "publish", "channel": "profile_updates", "broadcast": True, "type": "maintenance", "data": {}, "id": "b"})
    s["publish_account"] = encode(0, pub)
    s["publish_broadcast_with_client"] = encode(S_CLIENT, bcast + pub)
    s["publish_bytewise"] = encode(S_CLIENT, pub + bcast, 1)
    s["publish_reads5"] = encode(0, pub * 3, 5)
    s["admin_stats"] = encode(S_CLIENT, line({"op": "stats", "id": 1}))
    s["admin_channels"] = encode(S_CLIENT, line({"op": "channels"}))
    s["admin_channel"] = encode(S_CLIENT, pub + line({"op": "channel", "channel": "wallet_updates"}) + line({"op": "channel", "channel": "wallet_updates", "account": "acc_fuzz", "id": 3}))
    s["admin_connections"] = encode(S_CLIENT, line({"op": "connections"}) + line({"op": "connections", "account": "acc_fuzz", "channel": "wallet_updates", "limit": 1}))
    s["admin_disconnect_conn"] = encode(S_CLIENT, line({"op": "disconnect", "conn": "0-1", "code": 4000, "reason": "bye"}) + line({"op": "disconnect", "conn": "0-9"}))
    s["admin_disconnect_account"] = encode(S_CLIENT, line({"op": "disconnect", "account": "acc_fuzz"}) + pub)
    s["admin_tail"] = encode(S_CLIENT | S_PUBLISH, pub + line({"op": "tail", "channel": "wallet_updates", "id": "t"}) + pub)
    s["admin_tail_account"] = encode(S_PUBLISH, line({"op": "tail", "channel": "profile_updates", "account": "acc_fuzz"}))
    s["admin_tail_unknown"] = encode(S_PUBLISH, line({"op": "tail", "channel": "nope"}) + line({"op": "stats"}))
    s["errors"] = encode(0, b"not json\n[1]\n{}\n" + line({"op": "nope"}) + line({"op": "publish", "channel": "nope", "broadcast": True, "type": "t"})
                         + line({"op": "publish", "channel": "wallet_updates", "type": "t"}) + line({"op": "publish", "channel": "wallet_updates", "broadcast": True, "account": "a", "type": "t"})
                         + line({"op": "publish", "channel": "wallet_updates", "broadcast": True, "type": "pong"})
                         + line({"op": "disconnect", "account": "a", "code": 999}) + line({"op": "connections", "limit": -1}))
    s["blank_and_crlf"] = encode(0, b"\n \t\n\r\n" + pub.replace(b"\n", b"\r\n") + b"   \n")
    s["unterminated"] = encode(0, pub + pub[:-1])
    s["small_line_too_long"] = encode(S_SMALL, b'{"op":"stats","pad":"' + b"x" * 1100 + b'"}\n' + line({"op": "channels"}), 100)
    s["small_unterminated_long"] = encode(S_SMALL, b"y" * 1500, 200)
    s["small_event_too_large"] = encode(S_SMALL, line({"op": "publish", "channel": "wallet_updates", "broadcast": True, "type": "t", "data": "x" * 300}))
    s["abrupt_close"] = encode(S_ABRUPT | S_CLIENT, pub + line({"op": "stats"}))
    return s


def main():
    for target, seeds in (("client", client_seeds()), ("socket", socket_seeds())):
        d = os.path.join(ROOT, target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, "seed_" + name), "wb") as f:
                f.write(data)
        print("%s: %d seeds in %s" % (target, len(seeds), os.path.normpath(d)))


if __name__ == "__main__":
    main()
