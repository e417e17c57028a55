"""What the Python-based benchmark peers (python/peer.py, socketify/peer.py) share: the hub's publish request
validation, event framing, per-stream numbering, the NDJSON batch rule and the HS256 JWT check (Peers/README.md).
Each peer imports it from its parent directory; the fan-out (websockets' broadcast, uWS's topics) is the peer's own.
"""

import json
import os
import sys

import jwt


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def error_reply(code: str, message: str) -> str:
    return dumps({"ok": False, "error": {"code": code, "message": message}})


class Streams:
    """Sequence numbers per (channel, account) and per (channel, broadcast), from 1."""

    def __init__(self):
        self.account_seq = {}
        self.broadcast_seq = {}

    def frame(self, line):
        """One publish request (str or bytes holding a JSON object) ->
        (None, error reply line) or (stream key, (seq, event frame)); the key is (channel, account) or
        (channel, None) for a broadcast, and the event is numbered."""
        try:
            req = json.loads(line)
        except ValueError as e:
            return None, error_reply("INVALID_JSON", str(e))
        if not isinstance(req, dict):
            return None, error_reply("INVALID_JSON", "not a JSON object")
        channel = req.get("channel")
        etype = req.get("type")
        account = req.get("account")
        is_broadcast = req.get("broadcast") is True
        if not isinstance(channel, str) or not channel:
            return None, error_reply("INVALID_REQUEST", "channel must be a non-empty string")
        if not isinstance(etype, str) or not etype or len(etype.encode()) > 128:
            return None, error_reply("INVALID_REQUEST", "type must be a non-empty string of at most 128 bytes")
        if account is not None and (not isinstance(account, str) or not account):
            return None, error_reply("INVALID_REQUEST", "account must be a non-empty string")
        if (account is None) == (not is_broadcast):
            return None, error_reply("INVALID_REQUEST", 'exactly one of account or "broadcast":true is required')
        data = dumps(req.get("data"))
        head = '{"type":%s,"channel":%s,"seq":' % (dumps(etype), dumps(channel))
        if is_broadcast:
            seq = self.broadcast_seq.get(channel, 0) + 1
            self.broadcast_seq[channel] = seq
            return (channel, None), (seq, '%s%d,"broadcast":true,"data":%s}' % (head, seq, data))
        key = (channel, account)
        seq = self.account_seq.get(key, 0) + 1
        self.account_seq[key] = seq
        return key, (seq, '%s%d,"data":%s}' % (head, seq, data))


def ok_reply(seq: int, delivered: int) -> str:
    return '{"ok":true,"seq":%d,"delivered":%d}' % (seq, delivered)


def publish_body(body: bytes, publish):
    """A POST /publish body -> (ok, content type, reply text). `publish(line)` -> (reply line, ok).
    NDJSON when there are several lines and the first is a whole object by itself; otherwise the body is one
    (possibly pretty-printed) object."""
    lines = [l for l in body.split(b"\n") if l.strip()]
    if len(lines) > 1 and lines[0].rstrip().endswith(b"}"):
        return True, "application/x-ndjson", "\n".join(publish(l)[0] for l in lines) + "\n"
    reply, ok = publish(body)
    return ok, "application/json", reply + "\n"


def verify(token: str, secret: str):
    """The account (`sub`) of a valid HS256 token, else None (exp and sub required, 30 s leeway)."""
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], leeway=30, options={"require": ["exp", "sub"]})
    except jwt.PyJWTError:
        return None
    sub = claims.get("sub")
    return sub if isinstance(sub, str) and sub else None


def secret_from_environment() -> str:
    """The HS256 secret from PEER_JWT_SECRET; exits with status 2 when it is not set."""
    secret = os.environ.get("PEER_JWT_SECRET")
    if not secret:
        print("PEER_JWT_SECRET is not set", file=sys.stderr)
        sys.exit(2)
    return secret
