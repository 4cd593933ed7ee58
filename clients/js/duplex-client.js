// duplex-client: a browser (and Node >= 22, or 20 with --experimental-websocket)
// client for the duplex-supervisor gateway that resumes by itself.
// One dependency-free ES module; docs/clients.md in the repository says it whole.
//
//   const client = new DuplexClient("ws://127.0.0.1:8765/v1");
//   client.addEventListener("event", (e) => console.log(e.detail));
//   await client.connect();
//   await client.input("hello");
//
// Exactly once both ways: every server event (server_event_seq) is dispatched
// once, in order, across reconnects; every client event carries client_seq and
// is kept until the server's client_ack covers it, then resent after a resume
// from the server's last_client_seq. The session's id, token and sequences are
// kept in sessionStorage (when there is one), so a page reload resumes.

const FATAL_CLOSE_CODES = Object.freeze({
  4000: "replaced",
  4400: "bad_request",
  4401: "unauthorized",
  4403: "invalid_resume_token",
  4404: "unknown_session",
  4410: "journal_gap",
  4413: "overflow",
  4500: "session_failed",
});

// How many acked client events the client keeps besides the unacked ones.
const ACKED_WINDOW = 1024;

const FATAL_ERRORS = Object.fromEntries(
  Object.entries(FATAL_CLOSE_CODES).map(([code, name]) => [name, Number(code)]),
);

/** The server ended the session for good: `code` (e.g. 4404) and `reason`. */
export class FatalCloseError extends Error {
  constructor(code, reason, message = "") {
    super(`the server ended the session: ${code} ${reason}${message ? ` (${message})` : ""}`);
    this.name = "FatalCloseError";
    this.code = code;
    this.reason = reason;
  }
}

/** No resume succeeded before the give-up deadline. */
export class ReconnectGaveUpError extends Error {
  constructor(message) {
    super(message);
    this.name = "ReconnectGaveUpError";
  }
}

const DEFAULTS = Object.freeze({
  secret: null,
  initialDelayMs: 50,
  maxDelayMs: 5000,
  multiplier: 2,
  jitter: 0.5,
  giveUpAfterMs: 60000,
  ackEvery: 10,
  ackIntervalMs: 200,
  idleTimeoutMs: 0,
  maxInputsInFlight: 8,
  storageKey: null,
  random: Math.random,
});

/** The delay before reconnect attempt `attempt` (from 0), in ms. */
export function backoffDelay(options, attempt, random = Math.random) {
  const ceiling = Math.min(
    options.maxDelayMs,
    options.initialDelayMs * options.multiplier ** attempt,
  );
  return ceiling * (1 - options.jitter * random());
}

function defaultStorage() {
  try {
    return globalThis.sessionStorage ?? null;
  } catch {
    return null; // a sandboxed frame may refuse it
  }
}

function binaryEvent(header, bytes) {
  const head = new TextEncoder().encode(JSON.stringify(header));
  if (head.length > 0xffff) throw new RangeError("binary event header over 65535 bytes");
  const out = new Uint8Array(2 + head.length + bytes.byteLength);
  out[0] = head.length >> 8;
  out[1] = head.length & 0xff;
  out.set(head, 2);
  out.set(bytes, 2 + head.length);
  return out;
}

function asBytes(data) {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return null;
}

function newId() {
  const c = globalThis.crypto;
  if (c?.randomUUID) return `in_${c.randomUUID().replaceAll("-", "")}`;
  return `in_${Date.now().toString(36)}${Math.random().toString(36).slice(2)}`;
}

/**
 * A session kept alive across connections. Dispatches:
 * - `event` (detail: the server event; each once, in order),
 * - `open` (detail: {sessionId, resumed, replayed}) after each created/resumed,
 * - `disconnect` (detail: {code, reason}) when a connection ends and a resume follows,
 * - `closed` when the session ended normally (1000),
 * - `fatal` (detail: the FatalCloseError or ReconnectGaveUpError): no retry follows.
 */
export class DuplexClient extends EventTarget {
  constructor(url, options = {}) {
    super();
    this.url = url;
    this.options = { ...DEFAULTS, ...options };
    this.storage = "storage" in options ? options.storage : defaultStorage();
    this.storageKey = this.options.storageKey ?? `duplex-supervisor:${url}`;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof this.WebSocket !== "function") throw new Error("no WebSocket here: pass options.WebSocket");
    this.sessionId = "";
    this.token = "";
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.nextClientSeq = 1;
    this.writtenUpto = 0;
    this.pending = []; // [{clientSeq, frame, bytes, inputId}]
    this.attachedBefore = false;
    // The last acked ones too (a bounded window): with a session store, client_ack
    // says accepted, and a process that dies before handling an accepted event
    // leaves a lower last_client_seq to the next one.
    this.acked = [];
    this.unanswered = new Map();
    this.ws = null;
    this.state = "idle"; // idle | connecting | open | reconnecting | closed | failed
    this.failure = null;
    this.closing = false;
    this.ackTimer = null;
    this.idleTimer = null;
    this.waiters = [];
    this.stats = {
      events: 0,
      resumes: 0,
      replayed: 0,
      duplicates_dropped: 0,
      gaps: 0,
      reconnect_attempts: 0,
      disconnects: 0,
      client_events_sent: 0,
      client_events_acked: 0,
      client_events_resent: 0,
      inputs_sent: 0,
      inputs_answered: 0,
      errors: 0,
    };
    this._restore();
  }

  /** Counters (a copy): see docs/clients.md. */
  statistics() {
    return { ...this.stats };
  }

  /** Open (or, with a stored session, resume) the session; resolves once it is attached. */
  connect() {
    if (this.state !== "idle") return this._opened ?? Promise.resolve();
    this._opened = new Promise((resolve, reject) => {
      this._resolveOpen = resolve;
      this._rejectOpen = reject;
    });
    this.state = "connecting";
    this._lostAt = Date.now();
    this._attempt = 0;
    this._dial();
    return this._opened;
  }

  /** Send an input; resolves to its id once queued (waits while too many are unanswered). */
  async input(text, { clientEventId } = {}) {
    const id = clientEventId ?? newId();
    while (this.unanswered.size >= this.options.maxInputsInFlight) {
      this._raiseIfOver();
      await new Promise((resolve) => this.waiters.push(resolve));
    }
    this._raiseIfOver();
    this.unanswered.set(id, text);
    this.stats.inputs_sent += 1;
    this._queue({ type: "input", client_event_id: id, text }, id, null);
    return id;
  }

  /**
   * Send a client event: an object with `type`, or bytes (ArrayBuffer / typed array)
   * with `{type, ...fields}` as the second argument (a binary event). Returns its client_seq.
   */
  send(event, header = {}) {
    this._raiseIfOver();
    const bytes = asBytes(event);
    if (bytes) {
      if (!header.type) throw new TypeError("a binary event needs {type}");
      return this._queue({ ...header }, null, bytes.slice());
    }
    if (typeof event?.type !== "string") throw new TypeError("a client event needs a string type");
    return this._queue({ ...event }, null, null);
  }

  /** Drop the connection without a close frame's meaning to the session: it resumes. */
  cut() {
    if (this.ws) this.ws.close(4100, "cut by the client");
  }

  /**
   * Stop this client but leave the session resumable (what a page unload does):
   * a new client with the same storage resumes it.
   */
  dispose() {
    clearTimeout(this._retry);
    clearTimeout(this.ackTimer);
    clearTimeout(this.idleTimer);
    const ws = this.ws;
    this.ws = null;
    this.state = "disposed";
    this._wake();
    if (ws) ws.close(4001, "going away"); // 1001 is the browser's own, refused here
  }

  /** End the session for good. */
  close() {
    this.closing = true;
    if (this.ws?.readyState === 1) this.ws.send(JSON.stringify({ type: "session.close" }));
    else this._finish("closed");
  }

  // -- sending --------------------------------------------------------------------

  _raiseIfOver() {
    if (this.failure) throw this.failure;
    if (this.closing || this.state === "closed") throw new Error("the session is closed");
  }

  _queue(frame, inputId, bytes) {
    const clientSeq = this.nextClientSeq++;
    this.pending.push({ clientSeq, frame, bytes, inputId });
    this._flush();
    return clientSeq;
  }

  _message(item) {
    const frame = { ...item.frame, client_seq: item.clientSeq };
    return item.bytes ? binaryEvent(frame, item.bytes) : JSON.stringify(frame);
  }

  _flush() {
    if (this.state !== "open" || this.ws?.readyState !== 1) return;
    for (const item of this.pending) {
      if (item.clientSeq <= this.writtenUpto) continue;
      this.ws.send(this._message(item));
      this.writtenUpto = item.clientSeq;
      this.stats.client_events_sent += 1;
    }
  }

  _ack() {
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
    if (this.ws?.readyState !== 1 || this.lastSeq === this.ackedSeq) return;
    this.ws.send(JSON.stringify({ type: "ack", server_event_seq: this.lastSeq }));
    this.ackedSeq = this.lastSeq;
  }

  // -- storage ----------------------------------------------------------------------

  _restore() {
    if (!this.storage) return;
    try {
      const saved = JSON.parse(this.storage.getItem(this.storageKey) ?? "null");
      if (saved?.sessionId && saved.token) {
        this.sessionId = saved.sessionId;
        this.token = saved.token;
        this.lastSeq = saved.lastSeq | 0;
      }
    } catch {
      /* nothing usable stored */
    }
  }

  _save() {
    if (!this.storage) return;
    if (!this.sessionId || this.state === "closed" || this.state === "failed") {
      this.storage.removeItem(this.storageKey);
      return;
    }
    this.storage.setItem(
      this.storageKey,
      JSON.stringify({ sessionId: this.sessionId, token: this.token, lastSeq: this.lastSeq }),
    );
  }

  // -- the connection's life -------------------------------------------------------------

  _dial() {
    const ws = new this.WebSocket(this.url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    let attached = false;
    ws.onopen = () => {
      if (this.sessionId) {
        ws.send(
          JSON.stringify({
            type: "session.resume",
            session_id: this.sessionId,
            resume_token: this.token,
            last_received_server_event_seq: this.lastSeq,
          }),
        );
      } else {
        ws.send(JSON.stringify({ type: "session.open", secret: this.options.secret ?? undefined }));
      }
    };
    ws.onmessage = (message) => {
      if (this.ws !== ws) return;
      this._heard();
      if (typeof message.data !== "string") return;
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      try {
        if (!attached) {
          attached = this._attach(ws, frame);
        } else {
          this._onFrame(ws, frame);
        }
      } catch (error) {
        this._onFailure(ws, error);
      }
    };
    ws.onclose = (event) => {
      if (this.ws !== ws) return;
      this._dropped(event.code, event.reason);
    };
    ws.onerror = () => {};
  }

  _heard() {
    if (!this.options.idleTimeoutMs) return;
    clearTimeout(this.idleTimer);
    const ws = this.ws;
    this.idleTimer = setTimeout(() => {
      if (this.ws === ws) ws.close(4100, "idle");
    }, this.options.idleTimeoutMs);
  }

  _attach(ws, frame) {
    if (frame.type === "error") {
      this._onError(ws, frame);
      return false;
    }
    if (frame.type !== "session.created" && frame.type !== "session.resumed") return false;
    const resumed = frame.type === "session.resumed";
    this.sessionId = frame.session_id;
    this.token = frame.resume_token;
    const lastClientSeq = Number.isInteger(frame.last_client_seq) ? frame.last_client_seq : 0;
    if (!this.attachedBefore) {
      // This client's first attachment (a new session, or one a reload left in
      // storage): number what was queued before it after the server's last.
      this.attachedBefore = true;
      this.pending.forEach((item, i) => (item.clientSeq = lastClientSeq + 1 + i));
      this.nextClientSeq = lastClientSeq + 1 + this.pending.length;
    }
    this._dropPendingThrough(lastClientSeq);
    while (this.acked.length && this.acked[this.acked.length - 1].clientSeq > lastClientSeq) {
      this.pending.unshift(this.acked.pop()); // acked, then lost with its process
    }
    const first = this.pending.length ? this.pending[0].clientSeq : this.nextClientSeq;
    if (first > lastClientSeq + 1) {
      throw new Error(`the server has client events through ${lastClientSeq}; this client keeps them from ${first} on`);
    }
    const replayed = Number.isInteger(frame.replayed) ? Math.max(0, frame.replayed) : 0;
    if (resumed) {
      this.stats.resumes += 1;
      this.stats.replayed += replayed;
      this.stats.client_events_resent += this.pending.length;
    }
    this.writtenUpto = lastClientSeq;
    this.state = "open";
    this._attempt = 0;
    this._save();
    // Speaking at once confirms a resume to the server.
    ws.send(JSON.stringify({ type: "ack", server_event_seq: this.lastSeq }));
    this.ackedSeq = this.lastSeq;
    this._flush();
    this.dispatchEvent(
      new CustomEvent("open", { detail: { sessionId: this.sessionId, resumed, replayed } }),
    );
    if (this._resolveOpen) {
      this._resolveOpen();
      this._resolveOpen = this._rejectOpen = null;
    }
    return true;
  }

  _onFrame(ws, frame) {
    const seq = frame.server_event_seq;
    if (Number.isInteger(seq)) {
      if (seq <= this.lastSeq) {
        this.stats.duplicates_dropped += 1;
        return;
      }
      if (seq !== this.lastSeq + 1) {
        this.stats.gaps += 1;
        throw new Error(`server_event_seq jumped from ${this.lastSeq} to ${seq}`);
      }
      this.lastSeq = seq;
      this.stats.events += 1;
      if (frame.type === "response.done") this._answered(frame.client_event_id);
      this._save();
      this.dispatchEvent(new CustomEvent("event", { detail: frame }));
      if (this.lastSeq - this.ackedSeq >= this.options.ackEvery) this._ack();
      else if (!this.ackTimer) this.ackTimer = setTimeout(() => this._ack(), this.options.ackIntervalMs);
    } else if (frame.type === "client_ack") {
      if (Number.isInteger(frame.client_seq)) this._dropPendingThrough(frame.client_seq);
    } else if (frame.type === "error") {
      this._onError(ws, frame);
    } else if (frame.type === "session.closed") {
      this.closing = true;
    }
  }

  _answered(id) {
    if (typeof id === "string" && this.unanswered.delete(id)) {
      this.stats.inputs_answered += 1;
      this._wake();
    }
  }

  _wake() {
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }

  _dropPendingThrough(clientSeq) {
    while (this.pending.length && this.pending[0].clientSeq <= clientSeq) {
      this.acked.push(this.pending.shift());
      this.stats.client_events_acked += 1;
    }
    if (this.acked.length > ACKED_WINDOW) this.acked.splice(0, this.acked.length - ACKED_WINDOW);
  }

  _onError(ws, frame) {
    const code = String(frame.code);
    if (code in FATAL_ERRORS) throw new FatalCloseError(FATAL_ERRORS[code], code, frame.message);
    this.stats.errors += 1;
    const inputId = frame.client_event_id;
    if (code === "input_limit" && this.unanswered.delete(inputId)) this._wake();
    if (code === "busy" && this.unanswered.has(inputId)) {
      // Sequenced, then refused: the same input again under a new client_seq.
      this._queue({ type: "input", client_event_id: inputId, text: this.unanswered.get(inputId) }, inputId, null);
      return;
    }
    if (code === "bad_request" && Number.isInteger(frame.client_seq) && !("last_client_seq" in frame)) {
      throw new FatalCloseError(4400, code, `client event ${frame.client_seq} refused: ${frame.message}`);
    }
    if (Number.isInteger(frame.client_seq)) {
      // Refused before sequencing (rate), or ahead of one that was: resume, resend.
      ws.close(4100, "resync");
    }
  }

  _onFailure(ws, error) {
    this._finish("failed", error);
    try {
      ws.close(1000);
    } catch {
      /* already closing */
    }
  }

  _dropped(code, reason) {
    clearTimeout(this.ackTimer);
    clearTimeout(this.idleTimer);
    this.ackTimer = null;
    this.ws = null;
    if (this.state === "closed" || this.state === "failed") return;
    if (code in FATAL_CLOSE_CODES) {
      this._finish("failed", new FatalCloseError(code, FATAL_CLOSE_CODES[code], reason));
      return;
    }
    if (code === 1000 || this.closing) {
      this._finish("closed");
      return;
    }
    if (this.state === "open") {
      this.stats.disconnects += 1;
      this._lostAt = Date.now();
      this._attempt = 0;
      this.dispatchEvent(new CustomEvent("disconnect", { detail: { code, reason } }));
    }
    this.state = "reconnecting";
    const delay = backoffDelay(this.options, this._attempt, this.options.random);
    if (Date.now() + delay - this._lostAt > this.options.giveUpAfterMs) {
      this._finish(
        "failed",
        new ReconnectGaveUpError(`no resume within ${this.options.giveUpAfterMs} ms (${this._attempt} attempts)`),
      );
      return;
    }
    this._attempt += 1;
    this._retry = setTimeout(() => {
      this.stats.reconnect_attempts += 1;
      this._dial();
    }, delay);
  }

  _finish(state, error = null) {
    clearTimeout(this._retry);
    clearTimeout(this.ackTimer);
    clearTimeout(this.idleTimer);
    this.state = state;
    this.failure = error;
    this._save();
    this._wake();
    if (error) {
      this.dispatchEvent(new CustomEvent("fatal", { detail: error }));
      if (this._rejectOpen) this._rejectOpen(error);
    } else {
      this.dispatchEvent(new CustomEvent("closed"));
      if (this._resolveOpen) this._resolveOpen();
    }
    this._resolveOpen = this._rejectOpen = null;
  }
}

export { FATAL_CLOSE_CODES };
