// HubClient: the hub's JavaScript client, one dependency-free ES module for browsers (and Node >= 22, which has a
// global WebSocket). docs/CLIENT-JS.md explains it; docs/PROTOCOL.md is the protocol it speaks.
//
// What it does for an app:
// - connects with first-message auth (no token in the URL), offering the `hub.v1` subprotocol;
// - asks the app's `getToken` for a token on every connect, on `token_expiring` (sent in-band, the connection
//   stays), and after close 4001 (then reconnects);
// - reconnects with exponential backoff and full jitter (0 to min(maxDelay, baseDelay * 2^attempt)), the attempt
//   count reset once a connection has lived a minute; after a 4001 on a connection that worked, at once (a 4001 at
//   connect waits like any failure);
// - reports a channel the hub refuses (`onRefused`) and keeps the others subscribed;
// - resubscribes every channel after a reconnect, resuming with `since` (the last epoch and seqs it handled), drops
//   duplicates by seq, resubscribes to fill a gap, and tells the app when the hub could not recover a channel
//   (`onRecoveryFailed`: refetch that state over REST);
// - sends an app-level ping every `pingInterval` and reconnects when nothing at all arrived for two intervals;
// - gives up an attempt that is not authenticated within `connectTimeout`, and retries;
// - `suspend()`/`resume()` for a page or app going to the background (subscriptions and positions kept);
//   `networkChanged()` (called on the browser's `online` event) checks the connection at once;
// - `exportPositions()`/`seed()` to resume after a reload instead of refetching.
//
// Every `disconnected` state says why in `cause` (the same names as the Swift client: stopped, suspended, loggedOut,
// tokenExpired, tokenRefused, noPong, serverRestart, slowConsumer, rateLimited, network, closed). It stops (willRetry
// false) when the hub refuses the token for good (close 4003 UNAUTHORIZED) or when `getToken` throws (the refresh
// token expired: the app logs the user out).

export const PROTOCOL = "hub.v1";

const CLOSE_EXPIRED = 4001;
const CLOSE_UNAUTHORIZED = 4003;

/** Why a connection closed, by its code, with the Swift client's names. */
function causeOf(code) {
  switch (code) {
    case 4001: return "tokenExpired";
    case 4003: return "tokenRefused";
    case 4002: return "noPong";
    case 1001: case 1012: return "serverRestart";
    case 4008: return "slowConsumer";
    case 4029: return "rateLimited";
    case 1006: return "network";
    default: return "closed";
  }
}

export class HubClient {
  #url; #getToken; #platform; #appVersion; #onState; #onError; #WebSocket;
  #baseDelay; #maxDelay; #pingInterval; #connectTimeout; #networkProbeTimeout;
  #connectTimer = null;
  #probeTimer = null;
  /** Positions given to `seed()` for channels not subscribed yet. */
  #seeded = new Map();
  #ws = null;
  #state = "idle";
  #stopped = true;
  #attempt = 0;
  #connectedAt = 0;
  /** When the current connection was opened: it worked if it was authenticated after that. */
  #openedAt = 0;
  #lastMessageAt = 0;
  #reconnectTimer = null;
  #pingTimer = null;
  #nextId = 1;
  /** channel -> { handlers: Set, onRecoveryFailed, position: {epoch, seq, broadcastSeq} | null, pending: bool } */
  #channels = new Map();

  /**
   * @param {object} options see hub-client.d.ts
   */
  constructor(options) {
    if (!options || typeof options.url !== "string") throw new TypeError("HubClient: options.url is required");
    if (typeof options.getToken !== "function") throw new TypeError("HubClient: options.getToken is required");
    this.#url = options.url;
    this.#getToken = options.getToken;
    this.#platform = options.platform ?? "web";
    this.#appVersion = options.appVersion;
    this.#onState = options.onState ?? (() => {});
    this.#onError = options.onError ?? (() => {});
    this.#WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.#baseDelay = options.baseDelay ?? 500;
    this.#maxDelay = options.maxDelay ?? 30000;
    this.#pingInterval = options.pingInterval ?? 25000;
    this.#connectTimeout = options.connectTimeout ?? 10000;
    this.#networkProbeTimeout = options.networkProbeTimeout ?? 3000;
    if (typeof this.#WebSocket !== "function") throw new TypeError("HubClient: no WebSocket implementation");
    if ((options.watchNetwork ?? true) && typeof globalThis.addEventListener === "function") {
      globalThis.addEventListener("online", () => this.networkChanged());
    }
  }

  /** "idle" | "connecting" | "connected" | "disconnected" */
  get state() { return this.#state; }

  /** Opens the connection (and keeps it open until `close()`). */
  connect() {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#attempt = 0;
    this.#open();
  }

  /** Closes for good (code 1000); no reconnect. */
  close() {
    this.#shut("client closed");
    this.#setState("disconnected", { code: 1000, reason: "client closed", willRetry: false, cause: "stopped" });
  }

  /**
   * The page or app goes to the background: closes the connection (1000) and keeps every subscription and its
   * position, so `resume()` resubscribes with `since` and the hub replays what was missed.
   */
  suspend() {
    this.#shut("client suspended");
    this.#setState("disconnected", { code: 1000, reason: "client suspended", willRetry: false, cause: "suspended" });
  }

  /** Back after `suspend()` (the same as `connect()`). */
  resume() { this.connect(); }

  /**
   * The network changed (the browser's `online` event calls this unless `watchNetwork: false`): an open connection
   * must answer a ping within `networkProbeTimeout` or is replaced; a client waiting to reconnect tries now.
   */
  networkChanged() {
    if (this.#stopped) return;
    if (this.#ws && this.#state === "connected") {
      const ws = this.#ws;
      const asked = Date.now();
      this.#send({ type: "ping" });
      clearTimeout(this.#probeTimer);
      this.#probeTimer = setTimeout(() => {
        if (ws !== this.#ws || this.#lastMessageAt >= asked) return;
        this.#closed(ws, 4002, "no pong");
        ws.close(1000, "no pong");
      }, this.#networkProbeTimeout);
    } else if (!this.#ws) {
      clearTimeout(this.#reconnectTimer);
      this.#attempt = 0;
      this.#open();
    }
  }

  /** Every channel's position, to store (e.g. in localStorage) and `seed()` into the next page's client. */
  exportPositions() {
    const out = [];
    for (const [channel, entry] of this.#channels) if (entry.position) out.push({ channel, ...entry.position });
    return out;
  }

  /** Positions exported by an earlier page: the next subscribe of these channels resumes from them (`since`). */
  seed(positions) {
    for (const p of positions ?? []) {
      if (typeof p?.channel !== "string" || typeof p.epoch !== "string") continue;
      const position = { epoch: p.epoch, seq: p.seq ?? 0, broadcastSeq: p.broadcastSeq ?? 0 };
      const entry = this.#channels.get(p.channel);
      if (entry) entry.position = position; else this.#seeded.set(p.channel, position);
    }
  }

  #shut(reason) {
    this.#stopped = true;
    clearTimeout(this.#reconnectTimer);
    clearTimeout(this.#connectTimer);
    clearTimeout(this.#probeTimer);
    this.#stopPing();
    for (const entry of this.#channels.values()) entry.pending = false;
    this.#subscribeRequests.clear();
    if (this.#ws) {
      const ws = this.#ws;
      this.#ws = null;
      ws.close(1000, reason);
    }
  }

  /**
   * Subscribes to `channel`; `onEvent(event)` gets each event once, in seq order per stream.
   * @returns {{unsubscribe(): void}}
   */
  subscribe(channel, onEvent, { onRecoveryFailed, onRefused } = {}) {
    let entry = this.#channels.get(channel);
    if (!entry) {
      entry = { handlers: new Set(), onRecoveryFailed: null, onRefused: null, position: this.#seeded.get(channel) ?? null, pending: false };
      this.#seeded.delete(channel);
      this.#channels.set(channel, entry);
      if (this.#state === "connected") this.#sendSubscribe([channel]);
    }
    entry.handlers.add(onEvent);
    if (onRecoveryFailed) entry.onRecoveryFailed = onRecoveryFailed;
    if (onRefused) entry.onRefused = onRefused;
    return {
      unsubscribe: () => {
        entry.handlers.delete(onEvent);
        if (entry.handlers.size > 0 || this.#channels.get(channel) !== entry) return;
        this.#channels.delete(channel);
        this.#send({ type: "unsubscribe", channels: [channel] });
      },
    };
  }

  /** The position kept for `channel` ({epoch, seq, broadcastSeq}), or null before its first `subscribed`. */
  position(channel) {
    const p = this.#channels.get(channel)?.position;
    return p ? { ...p } : null;
  }

  /** Asks `getToken` for a new token now and sends it in-band (the hub answers `authenticated` or an error). */
  async refreshToken() {
    await this.#refresh("manual");
  }

  // --- connection -------------------------------------------------------------------------------------------------

  #open() {
    if (this.#stopped) return;
    this.#openedAt = Date.now();
    this.#setState("connecting", {});
    let ws;
    try {
      ws = new this.#WebSocket(this.#url, [PROTOCOL]);
    } catch (error) {
      this.#onError(error);
      return this.#scheduleReconnect(1006, String(error?.message ?? error));
    }
    this.#ws = ws;
    this.#lastMessageAt = Date.now();
    clearTimeout(this.#connectTimer);
    this.#connectTimer = setTimeout(() => {
      if (ws !== this.#ws || this.#state === "connected") return;
      this.#closed(ws, 1006, "not connected within " + this.#connectTimeout + " ms");
      ws.close(1000, "connect timeout");
    }, this.#connectTimeout);
    ws.onopen = () => this.#authenticate(ws);
    ws.onmessage = (message) => this.#receive(ws, message.data);
    ws.onclose = (event) => this.#closed(ws, event.code, event.reason);
    ws.onerror = () => {}; // a close event follows, with the code
  }

  async #authenticate(ws) {
    let token;
    try {
      token = await this.#getToken({ reason: this.#lastCloseCode === CLOSE_EXPIRED ? "expired" : "connect" });
    } catch (error) {
      return this.#giveUp(ws, error);
    }
    if (ws !== this.#ws) return;
    const auth = { type: "auth", token, platform: this.#platform, id: "auth" };
    if (this.#appVersion !== undefined) auth.appVersion = this.#appVersion;
    ws.send(JSON.stringify(auth));
  }

  #lastCloseCode = 0;

  #closed(ws, code, reason) {
    if (ws !== this.#ws) return;
    this.#ws = null;
    this.#stopPing();
    clearTimeout(this.#connectTimer);
    clearTimeout(this.#probeTimer);
    this.#lastCloseCode = code;
    for (const entry of this.#channels.values()) entry.pending = false;
    this.#subscribeRequests.clear();
    const worked = this.#connectedAt > 0 && this.#connectedAt >= this.#openedAt;
    if (this.#stopped) return;
    if (code === CLOSE_UNAUTHORIZED) {
      // The token does not verify: a new connection with the same kind of token would fail again.
      this.#stopped = true;
      return this.#setState("disconnected", { code, reason, willRetry: false, cause: "tokenRefused" });
    }
    if (Date.now() - this.#connectedAt > 60000 && this.#connectedAt > 0) this.#attempt = 0;
    this.#scheduleReconnect(code, reason, worked);
  }

  #scheduleReconnect(code, reason, worked = false) {
    // 4001 after a connection that worked: the token expired on it; reconnect at once with a fresh one (getToken
    // is asked with reason "expired"). A 4001 at connect (a cached token, a clock behind the hub's) waits like any
    // failure: never a tight loop.
    const delay = code === CLOSE_EXPIRED && worked ? 0
      : Math.random() * Math.min(this.#maxDelay, this.#baseDelay * 2 ** this.#attempt);
    this.#attempt += 1;
    this.#setState("disconnected", { code, reason, willRetry: true, retryIn: Math.round(delay), cause: causeOf(code) });
    clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = setTimeout(() => this.#open(), delay);
  }

  #giveUp(ws, error) {
    this.#stopped = true;
    this.#onError(error);
    if (this.#ws === ws) {
      this.#ws = null;
      this.#stopPing();
      ws.close(1000, "no token");
    }
    this.#setState("disconnected", { code: 1000, reason: "no token: " + String(error?.message ?? error), willRetry: false, cause: "loggedOut" });
  }

  #setState(state, details) {
    this.#state = state;
    try { this.#onState({ state, ...details }); } catch (error) { this.#onError(error); }
  }

  #send(message) {
    if (this.#ws && this.#state === "connected") this.#ws.send(JSON.stringify(message));
  }

  // --- messages ---------------------------------------------------------------------------------------------------

  #receive(ws, data) {
    if (ws !== this.#ws) return;
    this.#lastMessageAt = Date.now();
    let m;
    try { m = JSON.parse(data); } catch { return; }
    if (m === null || typeof m !== "object") return;
    switch (m.type) {
      case "authenticated":
        if (m.id === "auth") this.#authenticated();
        return;
      case "subscribed":
        return this.#subscribed(m);
      case "unsubscribed":
      case "pong":
        return;
      case "token_expiring":
        this.#refresh("expiring");
        return;
      case "error": {
        const error = Object.assign(new Error(m.error?.message ?? "hub error"), { code: m.error?.code, id: m.id, details: m.error?.details });
        const channels = this.#subscribeRequests.get(m.id);
        if (channels) {
          this.#subscribeRequests.delete(m.id);
          return this.#subscribeRefused(channels, error);
        }
        this.#onError(error);
        return;
      }
      default:
        if (typeof m.channel === "string" && typeof m.seq === "number") this.#event(m);
    }
  }

  #authenticated() {
    clearTimeout(this.#connectTimer);
    this.#connectedAt = Date.now();
    this.#lastCloseCode = 0;
    this.#setState("connected", {});
    this.#startPing();
    const channels = [...this.#channels.keys()];
    if (channels.length > 0) this.#sendSubscribe(channels);
  }

  #sendSubscribe(channels) {
    const since = {};
    for (const channel of channels) {
      const entry = this.#channels.get(channel);
      entry.pending = true;
      if (entry.position) since[channel] = { ...entry.position };
    }
    const message = { type: "subscribe", channels, id: "s" + this.#nextId++ };
    if (Object.keys(since).length > 0) message.since = since;
    this.#subscribeRequests.set(message.id, channels);
    this.#send(message);
  }

  /** Channels of each subscribe in flight, by id: a refusal names the request. */
  #subscribeRequests = new Map();

  // The hub refused a subscribe. Channels it does not serve are dropped and reported (onRefused, and onError), the
  // others are asked again on their own: one bad name never takes the valid channels down with it. A rate limit is
  // waited out.
  #subscribeRefused(channels, error) {
    for (const channel of channels) {
      const entry = this.#channels.get(channel);
      if (entry) entry.pending = false;
    }
    if (error.code === "RATE_LIMITED") {
      const ws = this.#ws;
      setTimeout(() => {
        if (ws !== this.#ws || this.#state !== "connected") return;
        const rest = channels.filter((c) => this.#channels.has(c) && !this.#channels.get(c).pending);
        if (rest.length > 0) this.#sendSubscribe(rest);
      }, Math.max(100, 1000 * (error.details?.retryAfter ?? 1)));
      return;
    }
    const refused = new Set(error.details?.unknownChannels ?? channels);
    for (const channel of channels) {
      if (!refused.has(channel)) continue;
      const entry = this.#channels.get(channel);
      this.#channels.delete(channel);
      try { entry?.onRefused?.(error); } catch (e) { this.#onError(e); }
    }
    this.#onError(error);
    const rest = channels.filter((c) => !refused.has(c) && this.#channels.has(c));
    if (rest.length > 0) this.#sendSubscribe(rest);
  }

  #subscribed(m) {
    for (const [channel, p] of Object.entries(m.positions ?? {})) {
      const entry = this.#channels.get(channel);
      if (!entry) continue;
      entry.pending = false;
      entry.position = { epoch: p.epoch, seq: p.seq, broadcastSeq: p.broadcastSeq };
      if (p.recovered === false && entry.onRecoveryFailed) {
        try { entry.onRecoveryFailed(p.reason); } catch (error) { this.#onError(error); }
      }
    }
  }

  #event(e) {
    const entry = this.#channels.get(e.channel);
    if (!entry) return;
    const key = e.broadcast ? "broadcastSeq" : "seq";
    const p = entry.position;
    if (p) {
      if (e.seq <= p[key]) return; // a duplicate
      if (e.seq !== p[key] + 1) {
        // A gap (or a restarted stream): the hub replays what is missing, or says recovered:false.
        if (!entry.pending) this.#sendSubscribe([e.channel]);
        return;
      }
      p[key] = e.seq;
    }
    for (const handler of entry.handlers) {
      try { handler(e); } catch (error) { this.#onError(error); }
    }
  }

  async #refresh(reason) {
    let token;
    try {
      token = await this.#getToken({ reason });
    } catch (error) {
      return this.#giveUp(this.#ws, error);
    }
    this.#send({ type: "auth", token, id: "refresh" });
  }

  // --- liveness ---------------------------------------------------------------------------------------------------

  #startPing() {
    this.#stopPing();
    this.#pingTimer = setInterval(() => {
      if (!this.#ws) return;
      if (Date.now() - this.#lastMessageAt > 2 * this.#pingInterval) {
        // Nothing at all for two intervals (not even our pongs): the connection is dead without knowing it.
        const ws = this.#ws;
        this.#closed(ws, 4002, "no pong");
        ws.close(1000, "no pong");
        return;
      }
      this.#send({ type: "ping" });
    }, this.#pingInterval);
  }

  #stopPing() {
    clearInterval(this.#pingTimer);
    this.#pingTimer = null;
  }
}
