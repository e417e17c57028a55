#!/usr/bin/env python3
"""The JavaScript client (clients/js/hub-client.js) in a real browser against the real hub.

    python3 Tests/browser/browser_test.py HUB_BINARY [--chromium PATH] [--timeout SECONDS]

Starts the hub (its own port, state dir and secret), an HTTP server for the test page, the client module and a
token endpoint (HS256 tokens minted with the hub's secret), and headless Chromium (Debian's package), driven over
the DevTools protocol with `websockets` (the test venv's). Checks, each against what the page's clients recorded:
  - delivery: two accounts, interleaved events; each gets exactly its own, in order, and nothing of the other's;
  - refresh: a token close to expiry gets `token_expiring`, the client refreshes in-band and stays connected;
  - expired: an expired token at start is closed with 4001 `ErrAccessTokenExpired`, which the page sees; the client
    asks for a new token ("expired") and connects;
  - forbidden: an in-band refresh with another account's token is refused with `FORBIDDEN`; the session goes on;
  - expired_loop: a token endpoint that only ever gives expired tokens: each connect is closed 4001, and the client
    retries with backoff (a 4001 at connect waits like any failure), not in a tight loop;
  - unknown_channel: a channel the hub does not serve, subscribed with a valid one: it alone is refused (onRefused),
    the valid one gets its events, before and after the hub drops the connection;
  - restart: the hub is stopped with SIGTERM and started again; the client sees 1001, reconnects, resumes with `since`
    and gets the events published while it was away: every seq once, in order.
Prints `ok NAME` or `FAIL NAME: why` per check, then `N passed, N failed`; exits 1 if any failed. Everything it
starts (hub, browser, servers) it stops, by PID; nothing outlives it. Bounded: --timeout (default 120 s) in all.
"""
import argparse, base64, hashlib, hmac, http.server, json, os, shutil, signal, socket, subprocess, sys, tempfile
import threading, time, urllib.request

from websockets.sync.client import connect as ws_connect

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    def __init__(self, binary, work):
        self.binary, self.work = binary, work
        self.port = free_port()
        self.secret = os.urandom(24).hex()
        with open(os.path.join(work, "secret"), "w") as f:
            f.write(self.secret + "\n")
        os.chmod(os.path.join(work, "secret"), 0o600)
        self.socket_path = os.path.join(work, "hub.sock")
        self.process = None
        self.log = open(os.path.join(work, "hub.log"), "ab")

    def start(self):
        self.process = subprocess.Popen(
            [self.binary, "--listen", "127.0.0.1:%d" % self.port, "--socket", self.socket_path,
             "--state-dir", os.path.join(self.work, "state"), "--jwt-secret-file", os.path.join(self.work, "secret"),
             "--token-warning", "50", "--threads", "2"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                if os.path.exists(self.socket_path):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the hub did not start")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def token(self, account, ttl):
        now = int(time.time())
        header = b64url(b'{"alg":"HS256","typ":"JWT"}')
        payload = b64url(json.dumps({"sub": account, "exp": now + ttl, "iat": now}).encode())
        signing_input = (header + "." + payload).encode()
        signature = hmac.new(self.secret.encode(), signing_input, hashlib.sha256).digest()
        return header + "." + payload + "." + b64url(signature)

    def publish(self, account, type_, data):
        return self.request({"op": "publish", "channel": "wallet_updates", "account": account, "type": type_, "data": data})

    def request(self, obj):
        line = json.dumps(obj)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.socket_path)
            s.sendall(line.encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        answer = json.loads(reply)
        if not answer.get("ok"):
            raise RuntimeError("%s failed: %s" % (obj.get("op"), answer))
        return answer


def serve(hub):
    """The page, the client module and the token endpoint, on a free port; returns (server, port)."""
    files = {"/page.html": os.path.join(ROOT, "Tests", "browser", "page.html"),
             "/clients/js/hub-client.js": os.path.join(ROOT, "clients", "js", "hub-client.js")}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            path, _, query = self.path.partition("?")
            if path == "/token":
                q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
                account, mode, n = urllib.request.unquote(q["account"]), q["mode"], int(q["n"])
                if mode == "expired" and n == 1 or mode == "always_expired":
                    token = hub.token(account, -120)  # beyond the hub's 30 s leeway
                elif mode == "short":
                    token = hub.token(account, 52 if n == 1 else 900)  # 52 s: token_expiring (--token-warning 50) 2 s in
                elif mode == "other" and n == 2:  # the manual refresh only
                    token = hub.token(account + "_intruder", 900)
                else:
                    token = hub.token(account, 900)
                body, kind = token.encode(), "text/plain"
            elif path in files:
                with open(files[path], "rb") as f:
                    body = f.read()
                kind = "text/javascript" if path.endswith(".js") else "text/html"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class Browser:
    """Headless Chromium with one page, driven through the DevTools protocol."""

    def __init__(self, chromium, url, work):
        self.profile = os.path.join(work, "profile")
        os.makedirs(self.profile)
        self.process = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--user-data-dir=" + self.profile,
             "--remote-debugging-port=0", "--remote-allow-origins=*", url],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "chromium.log"), "ab"), stdin=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.time() > deadline or self.process.poll() is not None:
                raise RuntimeError("Chromium did not start (see chromium.log)")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        page = None
        while page is None and time.time() < deadline:
            targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=5))
            page = next((t for t in targets if t.get("type") == "page" and "page.html" in t.get("url", "")), None)
            if page is None:
                time.sleep(0.1)
        if page is None:
            raise RuntimeError("no page target")
        self.cdp = ws_connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self.next_id = 0
        self.wait_for("window.ready === true", 20)

    def evaluate(self, expression):
        self.next_id += 1
        self.cdp.send(json.dumps({"id": self.next_id, "method": "Runtime.evaluate",
                                  "params": {"expression": expression, "awaitPromise": True, "returnByValue": True}}))
        while True:
            message = json.loads(self.cdp.recv(timeout=30))
            if message.get("id") != self.next_id:
                continue
            result = message.get("result", {})
            if "exceptionDetails" in result:
                raise RuntimeError("page exception: %s" % json.dumps(result["exceptionDetails"])[:500])
            return result.get("result", {}).get("value")

    def wait_for(self, expression, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.evaluate(expression):
                    return True
            except (RuntimeError, KeyError):
                pass
            time.sleep(0.05)
        return False

    def summary(self, name):
        return self.evaluate("window.summary(%s)" % json.dumps(name))

    def close(self):
        try:
            self.cdp.close()
        except Exception:
            pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def run(self, name, check):
        started = time.time()
        try:
            problem = check()
        except Exception as e:  # a check that raised failed
            problem = "%s: %s" % (type(e).__name__, e)
        if problem:
            self.failed += 1
            print("FAIL %s: %s" % (name, problem), flush=True)
        else:
            self.passed += 1
            print("ok %s (%.1f s)" % (name, time.time() - started), flush=True)


def connected(browser, name, timeout=10):
    return browser.wait_for("window.clients[%s].state === 'connected' && window.clients[%s].position('wallet_updates') !== null"
                            % (json.dumps(name), json.dumps(name)), timeout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("hub")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("the browser test ran out of time")))
    signal.alarm(int(args.timeout))

    work = tempfile.mkdtemp(prefix="hub-browser-")
    hub = Hub(os.path.abspath(args.hub), work)
    checks = Checks()
    browser = server = None
    try:
        hub.start()
        server, http_port = serve(hub)
        browser = Browser(args.chromium, "http://127.0.0.1:%d/page.html?hub=%d" % (http_port, hub.port), work)
        js = lambda s: json.dumps(s)

        def delivery():
            browser.evaluate("startClient('a', 'acc_a', 'wallet_updates', 'fresh') && startClient('b', 'acc_b', 'wallet_updates', 'fresh')")
            if not connected(browser, "a") or not connected(browser, "b"):
                return "not connected: %s / %s" % (browser.summary("a")["states"], browser.summary("b")["states"])
            for i in range(20):
                hub.publish("acc_a" if i % 2 == 0 else "acc_b", "wallet_balance_changed", {"i": i})
            if not browser.wait_for("record.a.events.length >= 10 && record.b.events.length >= 10", 10):
                return "events: a %d, b %d" % (len(browser.summary("a")["events"]), len(browser.summary("b")["events"]))
            time.sleep(0.3)
            a, b = browser.summary("a")["events"], browser.summary("b")["events"]
            if [e["data"]["i"] for e in a] != list(range(0, 20, 2)) or [e["seq"] for e in a] != list(range(1, 11)):
                return "acc_a got %s" % [(e["seq"], e["data"]) for e in a]
            if [e["data"]["i"] for e in b] != list(range(1, 20, 2)) or [e["seq"] for e in b] != list(range(1, 11)):
                return "acc_b got %s" % [(e["seq"], e["data"]) for e in b]
            return None

        def refresh():
            browser.evaluate("startClient('r', 'acc_r', 'wallet_updates', 'short')")
            if not connected(browser, "r"):
                return "not connected: %s" % browser.summary("r")["states"]
            if not browser.wait_for("record.r.tokens.includes('expiring')", 10):
                return "no refresh on token_expiring: tokens %s" % browser.summary("r")["tokens"]
            hub.publish("acc_r", "profile_updated", {"after": "refresh"})
            if not browser.wait_for("record.r.events.length === 1", 5):
                return "no event after the refresh"
            s = browser.summary("r")
            if [x["state"] for x in s["states"]] != ["connecting", "connected"] or s["errors"]:
                return "states %s, errors %s" % (s["states"], s["errors"])
            return None

        def expired():
            browser.evaluate("startClient('e', 'acc_e', 'wallet_updates', 'expired')")
            if not connected(browser, "e"):
                return "not connected: %s" % browser.summary("e")["states"]
            s = browser.summary("e")
            closes = [x for x in s["states"] if x["state"] == "disconnected"]
            if not closes or closes[0].get("code") != 4001 or closes[0].get("reason") != "ErrAccessTokenExpired":
                return "the page saw %s" % s["states"]
            if s["tokens"][:2] != ["connect", "expired"]:
                return "tokens asked for: %s" % s["tokens"]
            return None

        def forbidden():
            browser.evaluate("startClient('x', 'acc_x', 'wallet_updates', 'other')")
            if not connected(browser, "x"):
                return "not connected: %s" % browser.summary("x")["states"]
            browser.evaluate("clients.x.refreshToken()")
            if not browser.wait_for("record.x.errors.some(e => e.code === 'FORBIDDEN')", 5):
                return "errors: %s" % browser.summary("x")["errors"]
            hub.publish("acc_x", "wallet_balance_changed", {"still": "mine"})
            hub.publish("acc_x_intruder", "wallet_balance_changed", {"not": "mine"})
            if not browser.wait_for("record.x.events.length === 1", 5):
                return "events: %s" % browser.summary("x")["events"]
            time.sleep(0.3)
            s = browser.summary("x")
            if s["events"][0]["data"] != {"still": "mine"} or len(s["events"]) != 1 or s["state"] != "connected":
                return "after FORBIDDEN: %s, state %s" % (s["events"], s["state"])
            return None

        def restart():
            before = len(browser.summary("a")["events"])
            for i in range(3):
                hub.publish("acc_a", "wallet_balance_changed", {"phase": "before", "i": i})
            if not browser.wait_for("record.a.events.length === %d" % (before + 3), 5):
                return "events before the restart did not arrive"
            hub.stop()
            hub.start()
            for i in range(5):
                hub.publish("acc_a", "wallet_balance_changed", {"phase": "after", "i": i})
            if not browser.wait_for("record.a.events.length >= %d" % (before + 8), 15):
                s = browser.summary("a")
                return "after the restart: %d events, states %s" % (len(s["events"]) - before, s["states"][-4:])
            time.sleep(0.3)
            s = browser.summary("a")
            seqs = [e["seq"] for e in s["events"]]
            if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != before + 8:
                return "seqs %s" % seqs
            if [e["data"].get("phase") for e in s["events"][before:]] != ["before"] * 3 + ["after"] * 5:
                return "events %s" % [e["data"] for e in s["events"][before:]]
            codes = [x.get("code") for x in s["states"] if x["state"] == "disconnected"]
            if 1001 not in codes or s["state"] != "connected" or s["recoveryFailed"]:
                return "closes %s, state %s, recovery failed %s" % (codes, s["state"], s["recoveryFailed"])
            # The clients resumed with `since` on the restarted hub (which kept its epoch): recovered, not refetched.
            recoveries = hub.request({"op": "stats"})["stats"]["history"]["recoveries"]
            if recoveries.get("recovered", 0) < 1 or recoveries.get("epoch_changed", 0) != 0:
                failed = {n: browser.summary(n)["recoveryFailed"] for n in ("a", "b", "r", "e", "x")}
                return "recoveries on the restarted hub: %s; per client: %s" % (recoveries, failed)
            return None

        def expired_loop():
            browser.evaluate("startClient('l', 'acc_l', 'wallet_updates', 'always_expired')")
            time.sleep(2)
            browser.evaluate("clients.l.close()")
            s = browser.summary("l")
            closes = [x.get("code") for x in s["states"] if x["state"] == "disconnected" and x.get("willRetry")]
            # Backoff of 100 ms doubling to 800 ms (full jitter) allows ~10 attempts in 2 s; zero delay hundreds.
            if not 2 <= len(s["tokens"]) <= 40 or set(closes) != {4001}:
                return "%d token requests in 2 s, closes %s" % (len(s["tokens"]), closes[:10])
            return None

        def unknown_channel():
            browser.evaluate("startClient('u', 'acc_u', 'wallet_updates', 'fresh', 'renamed_updates')")
            if not connected(browser, "u"):
                return "not connected: %s" % browser.summary("u")["states"]
            if not browser.wait_for("record.u.refused.length === 1", 5):
                return "no refusal: %s" % browser.summary("u")
            hub.publish("acc_u", "wallet_balance_changed", {"n": 1})
            if not browser.wait_for("record.u.events.length === 1", 5):
                return "the valid channel got nothing: %s" % browser.summary("u")["errors"]
            hub.request({"op": "disconnect", "account": "acc_u"})
            if not browser.wait_for("record.u.states.filter(s => s.state === 'connected').length === 2", 10):
                return "did not reconnect: %s" % browser.summary("u")["states"]
            time.sleep(0.3)
            hub.publish("acc_u", "wallet_balance_changed", {"n": 2})
            if not browser.wait_for("record.u.events.length === 2", 5):
                return "after the reconnect: %s" % browser.summary("u")["events"]
            s = browser.summary("u")
            if s["refused"] != [{"channel": "renamed_updates", "code": "VALIDATION_ERROR"}]:
                return "refused %s" % s["refused"]
            return None

        def lifecycle():
            # Background and back: nothing held at the hub while suspended, the missed events replayed on resume;
            # then a new page seeded with the exported positions gets only what it missed.
            browser.evaluate("startClient('s', 'acc_s', 'wallet_updates', 'fresh')")
            if not connected(browser, "s"):
                return "not connected: %s" % browser.summary("s")["states"]
            hub.publish("acc_s", "wallet_balance_changed", {"i": 1})
            if not browser.wait_for("record.s.events.length === 1", 5):
                return "no first event"
            browser.evaluate("clients.s.networkChanged()")
            time.sleep(0.5)
            if browser.summary("s")["state"] != "connected":
                return "a live connection was replaced after networkChanged: %s" % browser.summary("s")["states"][-3:]
            browser.evaluate("clients.s.suspend()")
            last = browser.summary("s")["states"][-1]
            if last.get("cause") != "suspended" or last.get("willRetry") is not False:
                return "suspend reported %s" % last
            # The browser's close handshake reaches the hub a moment after suspend() returns: wait for the hub to
            # let go (bounded), then nothing may be delivered while suspended.
            deadline = time.time() + 5
            while hub.request({"op": "connections", "account": "acc_s"})["total"] != 0:
                if time.time() > deadline:
                    return "a connection was still held 5 s after suspend()"
                time.sleep(0.05)
            for i in (2, 3):
                if hub.publish("acc_s", "wallet_balance_changed", {"i": i}).get("delivered") != 0:
                    return "an event was delivered while suspended"
            browser.evaluate("clients.s.resume()")
            if not browser.wait_for("record.s.events.length === 3", 10):
                return "after resume: %s" % browser.summary("s")["events"]
            s = browser.summary("s")
            if [e["seq"] for e in s["events"]] != [1, 2, 3] or s["recoveryFailed"]:
                return "after resume: seqs %s, recovery failed %s" % ([e["seq"] for e in s["events"]], s["recoveryFailed"])
            positions = browser.evaluate("JSON.stringify(clients.s.exportPositions())")
            browser.evaluate("clients.s.close()")
            if browser.summary("s")["states"][-1].get("cause") != "stopped":
                return "close reported %s" % browser.summary("s")["states"][-1]
            for i in (4, 5):
                hub.publish("acc_s", "wallet_balance_changed", {"i": i})
            browser.evaluate("startClient('s2', 'acc_s', 'wallet_updates', 'fresh', undefined, %s)" % positions)
            if not browser.wait_for("record.s2.events.length === 2", 10):
                return "the seeded client got %s" % browser.summary("s2")["events"]
            s2 = browser.summary("s2")
            if [e["data"]["i"] for e in s2["events"]] != [4, 5] or s2["recoveryFailed"]:
                return "the seeded client got %s, recovery failed %s" % ([e["data"] for e in s2["events"]], s2["recoveryFailed"])
            return None

        for name, check in [("delivery", delivery), ("refresh", refresh), ("expired", expired),
                            ("forbidden", forbidden), ("expired_loop", expired_loop), ("unknown_channel", unknown_channel),
                            ("lifecycle", lifecycle), ("restart", restart)]:
            checks.run(name, check)
    except Exception as e:
        checks.failed += 1
        print("FAIL setup: %s: %s" % (type(e).__name__, e), flush=True)
    finally:
        signal.alarm(0)
        if browser:
            browser.close()
        if server:
            server.shutdown()
        hub.stop()
        if checks.failed:
            for log in ("hub.log", "chromium.log"):
                path = os.path.join(work, log)
                if os.path.exists(path):
                    print("---- %s (last lines)" % log)
                    print(open(path, errors="replace").read()[-3000:])
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (checks.passed, checks.failed), flush=True)
    sys.exit(1 if checks.failed else 0)


if __name__ == "__main__":
    main()
