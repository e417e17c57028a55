// Typings for hub-client.js (the hub's JavaScript client). docs/CLIENT-JS.md has the guide.

/** The subprotocol the client offers (`Sec-WebSocket-Protocol`). */
export declare const PROTOCOL: "hub.v1";

/** Why the client asks for a token: a new connection, `token_expiring`, after close 4001, or `refreshToken()`. */
export type TokenReason = "connect" | "expiring" | "expired" | "manual";

export type HubState = "idle" | "connecting" | "connected" | "disconnected";

export interface StateChange {
  state: HubState;
  /** The WebSocket close code, for "disconnected" (4001 expired, 4003 refused, 1001 the hub restarts, 1006 lost). */
  code?: number;
  /** The close reason: for the hub's 4xxx codes exactly its error code (`ErrAccessTokenExpired`, `UNAUTHORIZED`, …). */
  reason?: string;
  /** False when the client has stopped for good (token refused, `getToken` threw, or `close()`). */
  willRetry?: boolean;
  /** Milliseconds until the next attempt. */
  retryIn?: number;
  /** Why, for "disconnected" (the Swift client's names). */
  cause?: DisconnectCause;
}

export type DisconnectCause = "stopped" | "suspended" | "loggedOut" | "tokenExpired" | "tokenRefused" | "noPong"
  | "serverRestart" | "slowConsumer" | "rateLimited" | "network" | "closed";

/** A channel's position as `exportPositions()` gives it and `seed()` takes it. */
export interface ChannelPosition extends Position {
  channel: string;
}

/** An event as the hub sends it. */
export interface HubEvent<Data = unknown> {
  type: string;
  channel: string;
  seq: number;
  /** True for a broadcast (numbered in the channel's broadcast stream). */
  broadcast?: boolean;
  data: Data;
}

export interface Position {
  epoch: string;
  seq: number;
  broadcastSeq: number;
}

/** An error the hub sent (`code` as in docs/PROTOCOL.md: FORBIDDEN, UNAUTHORIZED, RATE_LIMITED, …), or a thrown one. */
export interface HubError extends Error {
  code?: string;
  id?: string | number;
  details?: unknown;
}

export interface HubClientOptions {
  /** `wss://host/ws` (no token in it). */
  url: string;
  /** Returns a current access token (your REST refresh). Throwing stops the client: the user must log in again. */
  getToken(context: { reason: TokenReason }): Promise<string> | string;
  /** Shown in `hubctl connections`; default "web". */
  platform?: string;
  appVersion?: string;
  onState?(change: StateChange): void;
  onError?(error: HubError): void;
  /** Backoff: attempt n waits a random time in [0, min(maxDelay, baseDelay * 2^n)] ms. Defaults 500 and 30000. */
  baseDelay?: number;
  maxDelay?: number;
  /** App-level ping period in ms (default 25000); no message for two periods means the connection is dead. */
  pingInterval?: number;
  /** Ms from opening a connection to `authenticated` before the attempt is given up and retried (default 10000). */
  connectTimeout?: number;
  /** After `networkChanged()`, ms the open connection has to answer a ping before it is replaced (default 3000). */
  networkProbeTimeout?: number;
  /** Call `networkChanged()` on the global `online` event (default true where there is one). */
  watchNetwork?: boolean;
  /** A WebSocket constructor (default: globalThis.WebSocket). */
  WebSocket?: new (url: string, protocols?: string | string[]) => WebSocket;
}

export interface SubscribeOptions {
  /** The hub could not replay what was missed ("epoch_changed", "too_old", "too_many"): refetch over REST. */
  onRecoveryFailed?(reason: string): void;
  /** The hub refused this channel (`error.code`: `VALIDATION_ERROR` for a channel it does not serve): the
   *  subscription is dropped; the other channels are not affected. */
  onRefused?(error: Error & { code?: string; details?: unknown }): void;
}

export declare class HubClient {
  constructor(options: HubClientOptions);
  readonly state: HubState;
  connect(): void;
  close(): void;
  suspend(): void;
  resume(): void;
  networkChanged(): void;
  exportPositions(): ChannelPosition[];
  seed(positions: ChannelPosition[]): void;
  subscribe<Data = unknown>(channel: string, onEvent: (event: HubEvent<Data>) => void, options?: SubscribeOptions): { unsubscribe(): void };
  position(channel: string): Position | null;
  refreshToken(): Promise<void>;
}
