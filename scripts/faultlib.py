"""Shared pieces of scripts/soak and scripts/netem: HS256 tokens, the real hub as a child process, its Unix-socket
protocol, /proc readings, and a small blocking WebSocket client that can send what a conforming library never
would (bad frames, one octet per TCP segment) and can stop reading (a slow consumer).

Standard library only; the well-behaved clients of both scripts use Python's `websockets` instead, an independent
implementation of RFC 6455.
"""
import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import time

# ---------------------------------------------------------------------------------------------------------------
# Tokens


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint_token(secret: bytes, account: str, ttl: int = 3600) -> str:
    """An HS256 JWT for `account`, as the REST backend would mint it (docs/PROTOCOL.md 1.1)."""
    now = int(time.time())
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = b64url(json.dumps({"sub": account, "iat": now, "exp": now + ttl}, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode()
    signature = b64url(hmac.new(secret, signing_input, hashlib.sha256).digest())
    return f"{header}.{payload}.{signature}"


def make_secret(path: str) -> bytes:
    """Writes a fresh 256-bit secret (64 hex characters) to `path`, mode 0600, and returns its bytes."""
    text = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return text.encode()


# ---------------------------------------------------------------------------------------------------------------
# The hub process

def die_with_parent():
    """In the child before exec: SIGKILL it if the driver dies without stopping it (PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


LISTEN_RE = re.compile(r"listening on ws://([0-9.]+):(\d+)/ws")


class HubProcess:
    """The release hub as a child process: its startup line gives the port; stderr goes to a log file."""

    def __init__(self, binary, workdir, args, prefix=None):
        self.binary = os.path.abspath(binary)
        self.workdir = workdir
        self.log_path = os.path.join(workdir, "hub.log")
        self.socket_path = os.path.join(workdir, "hub.sock")
        self.args = args
        self.prefix = prefix or []
        self.proc = None
        self.port = None
        self.host = None
        self.pid = None

    def start(self, timeout=15.0):
        log = open(self.log_path, "wb")
        cmd = self.prefix + [self.binary, "--socket", self.socket_path] + self.args
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            with open(self.log_path, "r", errors="replace") as f:
                m = LISTEN_RE.search(f.read())
            if m and os.path.exists(self.socket_path):
                self.host, self.port = m.group(1), int(m.group(2))
                self.pid = self.find_pid()
                return
            time.sleep(0.05)
        raise RuntimeError(f"hub did not print its listening line within {timeout}s:\n{self.log_tail()}")

    def find_pid(self):
        """The hub's own pid (with a prefix such as `ip netns exec`, the child execs the hub, so it is the same)."""
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout=15.0):
        """SIGTERM, then the exit status (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n=30):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def proc_cpu_seconds(pid):
    """User + system CPU seconds the process has used (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------------------------------------------------------
# The Unix socket (docs/PROTOCOL.md section 2)


class SocketClient:
    """One asyncio connection to the hub's Unix socket: pipelined requests, replies in order."""

    def __init__(self, path):
        self.path = path
        self.reader = None
        self.writer = None
        self.pending = asyncio.Queue()
        self.reader_task = None
        self.lock = asyncio.Lock()

    async def open(self):
        self.reader, self.writer = await asyncio.open_unix_connection(self.path, limit=16 << 20)
        self.reader_task = asyncio.create_task(self._read_replies())

    async def _read_replies(self):
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                fut = await self.pending.get()
                if not fut.done():
                    fut.set_result((json.loads(line), time.monotonic()))
        except Exception as e:  # noqa: BLE001 - handed to every waiter
            err = e
        else:
            err = ConnectionError("hub closed the Unix socket")
        while not self.pending.empty():
            fut = self.pending.get_nowait()
            if not fut.done():
                fut.set_exception(err)

    async def send_raw(self, data: bytes):
        """Sends bytes that end one request line; returns a future for its reply (reply, monotonic time)."""
        fut = asyncio.get_running_loop().create_future()
        async with self.lock:
            await self.pending.put(fut)
            self.writer.write(data)
            await self.writer.drain()
        return fut

    async def request(self, obj, timeout=10.0):
        fut = await self.send_raw((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        reply, _ = await asyncio.wait_for(fut, timeout)
        return reply

    async def close(self):
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        if self.reader_task is not None:
            self.reader_task.cancel()
            try:
                await self.reader_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass


# ---------------------------------------------------------------------------------------------------------------
# A raw, blocking WebSocket client (RFC 6455), run in threads


class RawError(Exception):
    pass


def encode_frame(opcode, payload=b"", fin=True, rsv=0, mask=True, length_override=None):
    first = (0x80 if fin else 0) | (rsv << 4) | opcode
    n = len(payload) if length_override is None else length_override
    if n < 126:
        head = bytes([first, (0x80 if mask else 0) | n])
    elif n < 65536:
        head = bytes([first, (0x80 if mask else 0) | 126]) + struct.pack("!H", n)
    else:
        head = bytes([first, (0x80 if mask else 0) | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    masked = bytes(b ^ key[i & 3] for i, b in enumerate(payload))
    return head + key + masked


def close_payload(code, reason=b""):
    return struct.pack("!H", code) + reason


class RawWS:
    """Blocking socket; `recv_frame` returns (fin, opcode, payload) or raises EOFError / ConnectionResetError."""

    def __init__(self, host, port, token=None, path="/ws", rcvbuf=None, timeout=10.0, headers=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buf = b""
        self.host, self.port, self.token, self.path = host, port, token, path
        self.extra_headers = headers or {}

    def handshake(self):
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        if self.token:
            lines.append(f"Authorization: Bearer {self.token}")
        for k, v in self.extra_headers.items():
            lines.append(f"{k}: {v}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status, headers = self.read_http_head()
        if status != 101:
            raise RawError(f"handshake answered {status}")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        if headers.get("sec-websocket-accept") != accept:
            raise RawError("bad Sec-WebSocket-Accept")

    def read_http_head(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed by the hub")
        self.buf += data

    def parse_frame(self):
        """The next complete frame in the buffer as (fin, opcode, payload), consumed; None if incomplete."""
        b = self.buf
        if len(b) < 2:
            return None
        fin, opcode, n, pos = bool(b[0] & 0x80), b[0] & 0x0F, b[1] & 0x7F, 2
        if b[1] & 0x80:
            raise RawError("the hub sent a masked frame")
        if n == 126:
            if len(b) < 4:
                return None
            n, pos = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, pos = struct.unpack("!Q", b[2:10])[0], 10
        if len(b) < pos + n:
            return None
        payload, self.buf = b[pos:pos + n], b[pos + n:]
        return fin, opcode, payload

    def recv_frame(self, timeout=None):
        """The next frame; socket.timeout if none completes within `timeout` (the partial frame stays buffered).
        EOFError on a clean end of stream, ConnectionResetError on a reset."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frame = self.parse_frame()
            if frame is not None:
                return frame
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("no complete frame in time")
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(self.timeout)
            self._fill()

    def send(self, data: bytes):
        self.sock.sendall(data)

    def send_text(self, obj):
        self.sock.sendall(encode_frame(0x1, json.dumps(obj, separators=(",", ":")).encode()))

    def send_octets(self, data: bytes, gap=0.002):
        """One octet per TCP segment (TCP_NODELAY, a pause between writes); stops quietly if the hub hung up."""
        for i in range(len(data)):
            try:
                self.sock.send(data[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return i
            time.sleep(gap)
        return len(data)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (use 60, 60s, 10m, 1h)")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
