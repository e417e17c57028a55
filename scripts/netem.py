#!/usr/bin/env python3
"""The scenarios behind scripts/netem (which makes the namespaces and removes them). Runs in the root namespace.

Topology (made by scripts/netem):
    [hub ns]  hub on 0.0.0.0:PORT, lo 127.0.0.1, h0 10.201.0.1/30
       |  veth
    [mid ns]  h1 ==netem_forwarder.py== c1        (no address; delay / loss / reordering / partition)
       |  veth
    [cli ns]  c0 10.201.0.2/30

"Lossy" clients run in the client namespace and reach the hub through the forwarder; "clean" clients run in the
hub's namespace and connect to 127.0.0.1 (never impaired). The publisher and the admin requests use the hub's
Unix socket (a file path, reachable from any namespace).

Scenarios, each checked (a failure prints `VIOLATION: ...`; exit status 1):
  a. lossy: delay 50ms +-20ms, loss 5%, reorder 10%: each lossy client gets every event of its streams in order
     (seq contiguous, nothing acknowledged missing), or is closed with a documented code;
  b. partition: loss 100% both ways: the hub must stop listing each lossy connection (it started the 4002 close)
     within --ping-interval + --pong-timeout (+0.1 s timer tick, +1 s slack for polling and a loaded machine);
  c. throughout a and b (and after the heal), the clean clients get every event, with p99 latency under a bound;
  d. healed: a new client over the healed link connects and gets every event.
"""
import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faultlib import (HubProcess, SocketClient, die_with_parent, make_secret, mint_token, parse_duration,  # noqa: E402
                      percentile)

CHANNELS = ["profile_updates", "wallet_updates"]
EVENT_TYPE = "netem_event"
DOCUMENTED_CLOSES = {1000, 1001, 4002, 4008}


def now():
    return time.monotonic()


class Client:
    def __init__(self, orch, label, account, channels, ns, url, lossy):
        self.orch, self.label, self.account, self.channels = orch, label, account, list(channels)
        self.ns, self.url, self.lossy = ns, url, lossy
        self.proc = None
        self.t_sub = None
        self.subscribed = asyncio.Event()
        self.closed = None           # (code, reason, t)
        self.closed_event = asyncio.Event()
        self.last = {}
        self.received = collections.defaultdict(set)
        self.events = []             # (t_recv, latency)
        self.replies = {}
        self.sent = {}
        self.reported_missing = set()
        self.reader = None

    async def start(self):
        token = mint_token(self.orch.secret, self.account)
        cmd = ["ip", "netns", "exec", self.ns, self.orch.args.python, self.orch.client_script, "--url", self.url,
               "--token", token, "--channels", ",".join(self.channels), "--platform", self.label]
        self.proc = await asyncio.create_subprocess_exec(*cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                         preexec_fn=die_with_parent)
        self.orch.clients.append(self)
        self.reader = asyncio.create_task(self.read())

    async def read(self):
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            obj = json.loads(line)
            k = obj["k"]
            if k == "event":
                self.on_event(obj)
            elif k == "subscribed":
                self.t_sub = obj["t"]
                self.subscribed.set()
            elif k == "reply":
                self.replies[obj.get("id")] = obj
            elif k == "sent":
                self.sent[obj["id"]] = obj["t"]
            elif k == "closed":
                self.closed = (obj["code"], obj["reason"], obj["t"])
                self.closed_event.set()
            elif k == "error":
                self.orch.violate(f"{self.label}: {obj['message']}")
        if self.closed is None:
            self.closed = (None, "client process ended", now())
        self.closed_event.set()

    def on_event(self, e):
        ch, seq, target, broadcast = e["ch"], e["seq"], e["target"], e["b"]
        self.count = getattr(self, "count", 0) + 1
        if self.orch.args.inject == "lose-event" and self.label == "lossy-0" and self.count == 50:
            self.last[(ch, "*" if broadcast else target)] = seq
            return  # self-test: pretend this event never arrived
        if e.get("type") != EVENT_TYPE:
            self.orch.violate(f"{self.label}: event type {e.get('type')!r}")
        if ch not in self.channels:
            self.orch.violate(f"{self.label}: event on {ch!r}, subscribed to {self.channels}")
        if broadcast is True:
            stream = (ch, "*")
            if target != "*":
                self.orch.violate(f"{self.label}: broadcast flag on an event for {target!r}")
        else:
            stream = (ch, target)
            if target != self.account:
                self.orch.violate(f"{self.label}: CROSS-ACCOUNT: {self.account!r} got an event for {target!r}")
        last = self.last.get(stream)
        if last is not None and seq != last + 1:
            self.orch.violate(f"{self.label}: seq not contiguous on {stream}: {last} then {seq} (events out of "
                              f"order or lost on the {'lossy' if self.lossy else 'clean'} path)")
        self.last[stream] = seq
        self.received[stream].add(seq)
        if isinstance(e.get("tp"), float):
            self.events.append((e["tr"], e["tr"] - e["tp"]))

    async def command(self, line):
        if self.proc.returncode is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write((line + "\n").encode())
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass

    async def barrier(self, rid, timeout):
        """App-level ping; returns the time it was sent once its pong is back (None if the connection is closed)."""
        await self.command(f"ping {rid}")
        deadline = now() + timeout
        while now() < deadline:
            if rid in self.replies and rid in self.sent:
                return self.sent[rid]
            if self.closed is not None:
                return None
            await asyncio.sleep(0.02)
        raise TimeoutError(f"{self.label}: no pong for barrier {rid} within {timeout}s")

    def missing(self, acks, t_until):
        """Acknowledged events of this client's streams published after it subscribed and answered before
        t_until, that it never received."""
        out = []
        for ch in self.channels:
            for stream in ((ch, self.account), (ch, "*")):
                for t_send, seq, t_reply, _ in acks.get(stream, []):
                    if t_send > self.t_sub and t_reply < t_until and seq not in self.received[stream]:
                        out.append((stream, seq))
        return out

    def latencies(self, t_from, t_to):
        return [lat for t, lat in self.events if t_from <= t <= t_to]

    async def stop(self, how="close"):
        if self.proc is None:
            return
        await self.command(how)
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self.reader is not None:
            await asyncio.wait({self.reader}, timeout=5)


class Orchestrator:
    def __init__(self, args):
        self.args = args
        self.violations = []
        self.acks = collections.defaultdict(list)
        self.client_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netem_client.py")
        self.report = collections.OrderedDict()
        self.publishing = None
        self.pub_count = collections.Counter()

    def violate(self, message):
        self.violations.append(message)
        if len(self.violations) <= 50:
            print(f"VIOLATION: {message}", flush=True)

    def log(self, message):
        print(f"[{now() - self.t0:6.1f}s] {message}", flush=True)

    # ---------------------------------------------------------------------------------------------------------
    async def forwarder(self, **config):
        r, w = await asyncio.open_unix_connection(self.fwd_control)
        w.write((json.dumps(config) + "\n").encode())
        await w.drain()
        reply = json.loads(await asyncio.wait_for(r.readline(), 5))
        w.close()
        if not reply.get("ok"):
            raise RuntimeError(f"forwarder refused {config}: {reply}")
        return reply

    async def publish_for(self, seconds, accounts):
        """Publishes at --rate for `seconds` (per-account events round the accounts, --broadcast-share broadcasts)
        and waits for every reply."""
        sc = SocketClient(self.socket_path)
        await sc.open()
        pending = []
        n = 0
        t_start = now()
        interval = 1.0 / self.args.rate
        while now() - t_start < seconds:
            n += 1
            ch = CHANNELS[n % 2]
            broadcast = (n % round(1 / self.args.broadcast_share)) == 0
            target = "*" if broadcast else accounts[n % len(accounts)]
            t_send = now()
            req = {"op": "publish", "channel": ch, "type": EVENT_TYPE, "data": {"target": target, "t": t_send, "n": n}}
            if broadcast:
                req["broadcast"] = True
            else:
                req["account"] = target
            fut = await sc.send_raw((json.dumps(req, separators=(",", ":")) + "\n").encode())
            pending.append(((ch, target), t_send, fut))
            self.pub_count["broadcast" if broadcast else "account"] += 1
            await asyncio.sleep(max(0.0, t_start + n * interval - now()))
        for stream, t_send, fut in pending:
            reply, t_reply = await asyncio.wait_for(fut, 30)
            if reply.get("ok") is not True:
                self.violate(f"publish answered {reply}")
                continue
            self.acks[stream].append((t_send, reply["seq"], t_reply, reply["delivered"]))
        await sc.close()

    async def barrier_and_check(self, phase, clients, t_phase, timeout):
        """Every client still open pings; then every acknowledged event must have reached it, in order."""
        results = {}
        for c in clients:
            if c.closed is not None:
                continue
            try:
                results[c] = await c.barrier(f"{phase}-{len(c.sent)}", timeout)
            except TimeoutError as e:
                self.violate(str(e))
        for c in clients:
            if c.closed is not None:
                code = c.closed[0]
                if c.lossy and code in DOCUMENTED_CLOSES:
                    self.log(f"{phase}: {c.label} was closed with {code} {c.closed[1]} (documented); "
                             f"its events up to then were in order")
                    self.report.setdefault("closed with a documented code", []).append(f"{c.label} {code} in {phase}")
                else:
                    self.violate(f"{phase}: {c.label} was closed: {c.closed[0]} {c.closed[1]}")
                continue
            t_until = results.get(c)
            if t_until is None:
                continue
            missing = [m for m in c.missing(self.acks, t_until) if m not in c.reported_missing]
            c.reported_missing.update(missing)
            if missing:
                self.violate(f"{phase}: {c.label} never got {len(missing)} acknowledged event(s): {missing[:8]}")

    def latency_line(self, clients, t_from, t_to):
        lat = [x for c in clients for x in c.latencies(t_from, t_to)]
        if not lat:
            return {"events": 0}
        return {"events": len(lat), "p50_ms": round(percentile(lat, 50) * 1000, 1),
                "p99_ms": round(percentile(lat, 99) * 1000, 1), "max_ms": round(max(lat) * 1000, 1)}

    def check_clean_latency(self, phase, stats):
        if stats.get("events") and stats["p99_ms"] > self.args.clean_p99_ms:
            self.violate(f"{phase}: clean clients' p99 latency {stats['p99_ms']} ms is above {self.args.clean_p99_ms} ms "
                         f"(the impaired link affected the others)")

    def tcp_counters(self, ns):
        """TCP counters of one namespace (/proc/net/snmp is per network namespace)."""
        text = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"], capture_output=True, text=True,
                              timeout=10).stdout
        rows = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
        if len(rows) < 2:
            return {}
        values = dict(zip(rows[0][1:], rows[1][1:]))
        return {k: int(values[k]) for k in ("OutSegs", "RetransSegs", "InSegs") if k in values}

    # ---------------------------------------------------------------------------------------------------------
    async def run(self):
        self.clients = []
        try:
            await self.scenarios()
        finally:
            for c in self.clients:  # whatever happened, no client process outlives the run
                if c.proc is not None and c.proc.returncode is None:
                    c.proc.kill()
                    await c.proc.wait()

    async def scenarios(self):
        a = self.args
        self.t0 = now()
        self.fwd_control = os.path.join(self.workdir, "forwarder.sock")
        self.fwd = subprocess.Popen(["ip", "netns", "exec", a.mid_ns, a.python,
                                     os.path.join(os.path.dirname(self.client_script), "netem_forwarder.py"),
                                     "--a", a.mid_a, "--b", a.mid_b, "--control", self.fwd_control, "--seed",
                                     str(a.seed)], stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        for _ in range(100):
            if os.path.exists(self.fwd_control):
                break
            await asyncio.sleep(0.05)
        await self.forwarder(delay=0, jitter=0, loss=0, reorder=0)
        port_url_clean = f"ws://127.0.0.1:{self.hub.port}/ws"
        port_url_lossy = f"ws://{a.hub_addr}:{self.hub.port}/ws"

        clean = [Client(self, "clean-0", "acc_c0", CHANNELS, a.hub_ns, port_url_clean, False),
                 Client(self, "clean-1", "acc_c1", CHANNELS, a.hub_ns, port_url_clean, False),
                 Client(self, "clean-2", "acc_c2", ["wallet_updates"], a.hub_ns, port_url_clean, False),
                 Client(self, "clean-twin-l0", "acc_l0", CHANNELS, a.hub_ns, port_url_clean, False)]
        lossy = [Client(self, f"lossy-{i}", f"acc_l{i}", CHANNELS, a.cli_ns, port_url_lossy, True)
                 for i in range(a.lossy_clients)]
        accounts = ["acc_c0", "acc_c1", "acc_c2"] + [f"acc_l{i}" for i in range(a.lossy_clients)]
        for c in clean:
            await c.start()
        for c in clean:
            await asyncio.wait_for(c.subscribed.wait(), 20)

        # ---- a. delay + loss + reordering -------------------------------------------------------------------
        impair = dict(delay=a.delay, jitter=a.jitter, loss=a.loss, reorder=a.reorder)
        await self.forwarder(**impair)
        self.log(f"a. lossy link: delay {a.delay * 1000:.0f}ms +-{a.jitter * 1000:.0f}ms, loss {a.loss:.0%}, "
                 f"reorder {a.reorder:.0%}; {len(lossy)} clients connect over it")
        t_a = now()
        tcp_hub_0, tcp_cli_0 = self.tcp_counters(a.hub_ns), self.tcp_counters(a.cli_ns)
        for c in lossy:
            await c.start()
        for c in lossy:
            try:
                await asyncio.wait_for(c.subscribed.wait(), 30)
            except asyncio.TimeoutError:
                self.violate(f"{c.label}: not subscribed within 30s over the lossy link (closed: {c.closed})")
        acks_before = sum(len(v) for v in self.acks.values())
        await self.publish_for(a.lossy_time, accounts)
        await self.barrier_and_check("a", lossy + clean, t_a, 60)
        t_a_end = now()
        fwd = (await self.forwarder())["stats"]
        tcp_hub_1, tcp_cli_1 = self.tcp_counters(a.hub_ns), self.tcp_counters(a.cli_ns)
        retrans = {"hub ns": {k: tcp_hub_1.get(k, 0) - tcp_hub_0.get(k, 0) for k in ("OutSegs", "RetransSegs")},
                   "client ns": {k: tcp_cli_1.get(k, 0) - tcp_cli_0.get(k, 0) for k in ("OutSegs", "RetransSegs")}}
        published_a = sum(len(v) for v in self.acks.values()) - acks_before
        self.report["a. lossy"] = {
            "published": published_a,
            "lossy clients": self.latency_line(lossy, t_a, t_a_end),
            "clean clients": self.latency_line(clean, t_a, t_a_end),
            "frames": fwd,
            "tcp segments": retrans}
        self.check_clean_latency("a", self.report["a. lossy"]["clean clients"])
        self.log(f"a. done: {json.dumps(self.report['a. lossy'])}")

        # ---- b. silent partition ------------------------------------------------------------------------------
        bound = a.ping_interval + a.pong_timeout + 0.1 + a.detect_slack
        admin = SocketClient(self.socket_path)
        await admin.open()
        open_lossy = [c for c in lossy if c.closed is None]
        t_b = now()
        pub = asyncio.create_task(self.publish_for(1.0 + bound + 2.0, accounts))
        await asyncio.sleep(1.0)
        await self.forwarder(loss=1.0)
        t_part = now()
        self.log(f"b. partition: loss 100% both ways on the lossy link; heartbeats {a.ping_interval:g}s + "
                 f"{a.pong_timeout:g}s must detect it within {bound:.1f}s")
        gone = {}
        while now() - t_part < bound + 5 and len(gone) < len(open_lossy):
            reply = await admin.request({"op": "connections", "limit": 10000})
            listed = {c.get("platform") for c in reply.get("connections", [])}
            for c in open_lossy:
                if c.label not in listed and c.label not in gone:
                    gone[c.label] = now() - t_part
            await asyncio.sleep(0.05)
        detections = []
        for c in open_lossy:
            t = gone.get(c.label)
            if t is None:
                self.violate(f"b. {c.label}: the hub still lists the connection {bound + 5:.1f}s into a silent "
                             f"partition (heartbeats should close it with 4002 within {bound:.1f}s)")
            elif t > bound:
                self.violate(f"b. {c.label}: the hub closed it {t:.2f}s into the partition; documented bound {bound:.1f}s")
            elif t < a.pong_timeout - 0.2:
                self.violate(f"b. {c.label}: closed {t:.2f}s into the partition, before a pong could be overdue: "
                             f"something other than the heartbeat closed it")
            if t is not None:
                detections.append(t)
        await pub
        # hubctl, as an operator would check it: no connection over the lossy link is left.
        hubctl = subprocess.run([a.hubctl, "--socket", self.socket_path, "connections", "--json", "--limit", "1000"],
                                capture_output=True, text=True, timeout=20)
        listing = json.loads(hubctl.stdout) if hubctl.returncode == 0 else {}
        still = [c.get("platform") for c in listing.get("connections", []) if str(c.get("platform")).startswith("lossy")]
        if hubctl.returncode != 0 or still:
            self.violate(f"b. hubctl connections: exit {hubctl.returncode}, lossy connections still listed: {still}")
        stats = (await admin.request({"op": "stats"})).get("stats", {})
        await self.barrier_and_check("b", clean, t_b, 30)
        t_b_end = now()
        self.report["b. partition"] = {
            "detection_s": [round(x, 2) for x in detections],
            "bound_s": round(bound, 1),
            "hubctl connections after": f"{listing.get('total')} open, none over the lossy link" if not still else still,
            "hub open connections": stats.get("connections", {}).get("open"),
            "clean clients": self.latency_line(clean, t_b, t_b_end)}
        self.check_clean_latency("b", self.report["b. partition"]["clean clients"])
        self.log(f"b. done: {json.dumps(self.report['b. partition'])}")

        # Heal; the partitioned clients learn that the hub is gone when their next segment reaches it.
        await self.forwarder(delay=0, jitter=0, loss=0, reorder=0)
        ends = {}
        for c in open_lossy:
            await c.command("ping after-heal")
        deadline = now() + 15
        while now() < deadline and any(c.closed is None for c in open_lossy):
            await asyncio.sleep(0.1)
        for c in open_lossy:
            ends[c.label] = c.closed[0] if c.closed else "still open"
            if c.closed is None or c.closed[0] not in (1006, 4002):
                self.violate(f"after the heal, {c.label} should find its connection gone (reset, or the 4002 "
                             f"close if it got through); it saw {c.closed}")
            await c.stop("exit")
        self.report["b. partitioned clients after the heal"] = ends

        # ---- d. healed link: a new client ----------------------------------------------------------------------
        fresh = Client(self, "lossy-after-heal", "acc_l0", CHANNELS, a.cli_ns, port_url_lossy, True)
        await fresh.start()
        await asyncio.wait_for(fresh.subscribed.wait(), 20)
        t_d = now()
        await self.publish_for(a.healed_time, accounts)
        await self.barrier_and_check("d", [fresh] + clean, t_d, 30)
        t_d_end = now()
        self.report["d. healed"] = {"new client over the link": self.latency_line([fresh], t_d, t_d_end),
                                    "clean clients": self.latency_line(clean, t_d, t_d_end)}
        self.check_clean_latency("d", self.report["d. healed"]["clean clients"])
        self.log(f"d. done: {json.dumps(self.report['d. healed'])}")

        # ---- c. the clean clients over the whole run -------------------------------------------------------------
        self.report["c. clean clients, whole run"] = self.latency_line(clean, self.t0, now())
        for c in clean + [fresh]:
            await c.stop("close")
        await admin.close()

    def summary(self, exit_status):
        print("\n==== netem summary ====")
        print(f"publishes: {self.pub_count['account']} per-account, {self.pub_count['broadcast']} broadcast, "
              f"{sum(len(v) for v in self.acks.values())} acknowledged")
        for key, value in self.report.items():
            print(f"{key}: {json.dumps(value)}")
        print(f"hub exit on SIGTERM: {exit_status}")
        if self.violations:
            print(f"FAILED: {len(self.violations)} violation(s); first: {self.violations[0]}")
        else:
            print("OK: no violation")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hub-ns", required=True)
    ap.add_argument("--mid-ns", required=True)
    ap.add_argument("--cli-ns", required=True)
    ap.add_argument("--mid-a", required=True, help="the middle namespace's interface toward the hub")
    ap.add_argument("--mid-b", required=True, help="the middle namespace's interface toward the clients")
    ap.add_argument("--hub-addr", default="10.201.0.1")
    ap.add_argument("--hub", required=True)
    ap.add_argument("--hubctl", required=True)
    ap.add_argument("--python", required=True, help="the venv's python (with websockets)")
    ap.add_argument("--seed", type=int, default=1, help="the forwarder's random seed (default 1)")
    ap.add_argument("--lossy-time", type=parse_duration, default=30.0, help="scenario a publishing time (default 30s)")
    ap.add_argument("--healed-time", type=parse_duration, default=5.0, help="scenario d publishing time (default 5s)")
    ap.add_argument("--lossy-clients", type=int, default=4, help="clients over the impaired link (default 4)")
    ap.add_argument("--rate", type=float, default=40.0, help="publishes per second (default 40)")
    ap.add_argument("--broadcast-share", type=float, default=0.1, help="share of broadcasts (default 0.1)")
    ap.add_argument("--delay", type=float, default=0.050, help="one-way delay, seconds (default 0.05)")
    ap.add_argument("--jitter", type=float, default=0.020, help="+- jitter, seconds (default 0.02)")
    ap.add_argument("--loss", type=float, default=0.05, help="frame loss probability in a (default 0.05)")
    ap.add_argument("--reorder", type=float, default=0.10, help="share of frames sent at once, overtaking (default 0.1)")
    ap.add_argument("--ping-interval", type=int, default=2, help="hub --ping-interval, whole seconds (default 2)")
    ap.add_argument("--pong-timeout", type=int, default=2, help="hub --pong-timeout, whole seconds (default 2)")
    ap.add_argument("--detect-slack", type=float, default=1.0, help="seconds allowed past ping + pong + 0.1 s in b (default 1)")
    ap.add_argument("--clean-p99-ms", type=float, default=100.0, help="clean clients' p99 bound per phase (default 100)")
    ap.add_argument("--inject", choices=["lose-event"],
                    help="self-test: lossy-0 ignores its 50th event, so the completeness check must fail")
    args = ap.parse_args()

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    workdir = tempfile.mkdtemp(prefix="hub-netem-")
    orch = Orchestrator(args)
    orch.workdir = workdir
    orch.secret = make_secret(os.path.join(workdir, "jwt-secret"))
    hub = HubProcess(args.hub, workdir, [
        "--listen", "0.0.0.0:0", "--state-dir", os.path.join(workdir, "state"),
        "--jwt-secret-file", os.path.join(workdir, "jwt-secret"), "--threads", "2",
        "--ping-interval", f"{args.ping_interval}s", "--pong-timeout", f"{args.pong_timeout}s"],
        prefix=["ip", "netns", "exec", args.hub_ns])
    orch.hub = hub
    orch.socket_path = hub.socket_path
    exit_status = None
    try:
        hub.start()
        print(f"netem: hub pid {hub.pid} in namespace {args.hub_ns}, port {hub.port}; work dir {workdir}", flush=True)
        asyncio.run(asyncio.wait_for(orch.run(), 600))
    except KeyboardInterrupt as e:
        orch.violate(f"interrupted ({e})")
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        orch.violate(f"the netem driver failed: {e!r}")
    finally:
        if hub.alive():
            exit_status = hub.terminate(timeout=15)
            if exit_status != 0:
                orch.violate(f"the hub exited with {exit_status} on SIGTERM (expected 0)")
        elif hub.proc is not None:
            exit_status = hub.proc.returncode
            orch.violate(f"the hub was not running at the end (exit status {exit_status})")
        fwd = getattr(orch, "fwd", None)
        if fwd is not None and fwd.poll() is None:
            fwd.terminate()
            try:
                fwd.wait(5)
            except subprocess.TimeoutExpired:
                fwd.kill()
    orch.summary(exit_status)
    if orch.violations:
        print(f"\nhub log: {hub.log_path}\n--- last lines ---\n{hub.log_tail()}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
