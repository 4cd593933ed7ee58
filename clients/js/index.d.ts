// Types for duplex-client.js (docs/clients.md in the repository says it whole).

/** Close codes after which no resume can help: the client never retries them. */
export declare const FATAL_CLOSE_CODES: Readonly<Record<number, string>>;

/** The server ended the session for good. */
export declare class FatalCloseError extends Error {
  readonly code: number;
  readonly reason: string;
  constructor(code: number, reason: string, message?: string);
}

/** No resume succeeded before `giveUpAfterMs`. */
export declare class ReconnectGaveUpError extends Error {
  constructor(message: string);
}

/** Where the session's id, token and last sequence are kept (sessionStorage's shape). */
export interface SessionStorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface DuplexClientOptions {
  /** The gateway's shared secret, sent in session.open (never in the URL). */
  secret?: string | null;
  /** Backoff: attempt n waits (1 - jitter * random) * min(maxDelayMs, initialDelayMs * multiplier ** n). */
  initialDelayMs?: number;
  maxDelayMs?: number;
  multiplier?: number;
  jitter?: number;
  /** Give up (a `fatal` ReconnectGaveUpError) this long after a connection was lost. */
  giveUpAfterMs?: number;
  /** Ack every this many events, or ackIntervalMs after the first unacked one. */
  ackEvery?: number;
  ackIntervalMs?: number;
  /** Drop (and resume) a connection silent this long; 0: never. */
  idleTimeoutMs?: number;
  /** input() waits while this many inputs are unanswered. */
  maxInputsInFlight?: number;
  /** Default: globalThis.sessionStorage (a page reload resumes); null: keep nothing. */
  storage?: SessionStorageLike | null;
  /** Default: "duplex-supervisor:" + url. */
  storageKey?: string | null;
  /** Default: globalThis.WebSocket. */
  WebSocket?: typeof WebSocket;
  /** The jitter's random source (tests). */
  random?: () => number;
}

export interface DuplexStatistics {
  events: number;
  resumes: number;
  replayed: number;
  duplicates_dropped: number;
  gaps: number;
  reconnect_attempts: number;
  disconnects: number;
  client_events_sent: number;
  client_events_acked: number;
  client_events_resent: number;
  inputs_sent: number;
  inputs_answered: number;
  errors: number;
}

/** A server event: `type`, `server_event_seq` and the engine's fields. */
export interface ServerEvent {
  type: string;
  server_event_seq: number;
  [field: string]: unknown;
}

export interface OpenDetail {
  sessionId: string;
  resumed: boolean;
  replayed: number;
}

export interface DuplexClientEventMap {
  event: CustomEvent<ServerEvent>;
  open: CustomEvent<OpenDetail>;
  disconnect: CustomEvent<{ code: number; reason: string }>;
  closed: CustomEvent<undefined>;
  fatal: CustomEvent<FatalCloseError | ReconnectGaveUpError | Error>;
}

export type DuplexClientState =
  | "idle"
  | "connecting"
  | "open"
  | "reconnecting"
  | "closed"
  | "failed"
  | "disposed";

export declare function backoffDelay(
  options: Required<Pick<DuplexClientOptions, "initialDelayMs" | "maxDelayMs" | "multiplier" | "jitter">>,
  attempt: number,
  random?: () => number,
): number;

export declare class DuplexClient extends EventTarget {
  constructor(url: string, options?: DuplexClientOptions);
  readonly url: string;
  /** The session's id ("" until the first open). */
  readonly sessionId: string;
  /** The last server_event_seq delivered. */
  readonly lastSeq: number;
  readonly state: DuplexClientState;
  /** Open, or resume a stored session; resolves once attached, rejects on a fatal answer. */
  connect(): Promise<void>;
  /** Send an input; resolves to its client_event_id. Its answer ends with response.done naming it. */
  input(text: string, options?: { clientEventId?: string }): Promise<string>;
  /**
   * Send a client event (an object with type) or bytes with {type, ...fields}; returns its
   * client_seq (before the first open, a provisional one: the first attachment numbers what
   * was queued after the server's last_client_seq).
   */
  send(event: { type: string; [field: string]: unknown }): number;
  send(data: ArrayBuffer | ArrayBufferView, header: { type: string; [field: string]: unknown }): number;
  statistics(): DuplexStatistics;
  /** Drop the connection (the client resumes by itself). */
  cut(): void;
  /** Stop this client, leaving the session resumable from storage (a page unload). */
  dispose(): void;
  /** End the session for good. */
  close(): void;
  addEventListener<K extends keyof DuplexClientEventMap>(
    type: K,
    listener: (event: DuplexClientEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
}
