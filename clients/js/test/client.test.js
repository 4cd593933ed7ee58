// DuplexClient against a real `duplex-supervisor serve` process, through a TCP
// proxy of the test's own that cuts connections at random (loopback only).
// Run: node --experimental-websocket --test clients/js/test/   (Node 20; 22+ needs no flag)
// DUPLEX_PYTHON names the Python that has duplex-supervisor installed.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import net from "node:net";
import { after, before, test } from "node:test";

import { DuplexClient, FatalCloseError, backoffDelay } from "../duplex-client.js";

const PYTHON = process.env.DUPLEX_PYTHON ?? "python3";

function serve(env = {}, ...flags) {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, ["-m", "supervisor", "serve", "--port", "0", ...flags], {
      stdio: ["ignore", "ignore", "pipe"],
      env: { ...process.env, ...env },
    });
    let log = "";
    const timer = setTimeout(() => reject(new Error(`serve did not start: ${log}`)), 30000);
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      log += chunk;
      const match = /listening on ws:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (match && timer) {
        clearTimeout(timer);
        resolve({ child, port: Number(match[1]) });
      }
    });
    child.on("exit", (code) => reject(new Error(`serve exited ${code}: ${log}`)));
  });
}

// A loopback proxy: every connection piped to `upstream`; cutAll() destroys them all.
function cuttingProxy(upstream) {
  const sockets = new Set();
  const proxy = { cuts: 0, upstream };
  const server = net.createServer((client) => {
    const server = net.connect(proxy.upstream, "127.0.0.1");
    for (const [a, b] of [
      [client, server],
      [server, client],
    ]) {
      sockets.add(a);
      a.on("error", () => b.destroy());
      a.on("close", () => {
        sockets.delete(a);
        b.destroy();
      });
      a.pipe(b);
    }
  });
  proxy.cutAll = () => {
    if (sockets.size) proxy.cuts += 1;
    for (const socket of sockets) socket.destroy();
  };
  proxy.listen = () =>
    new Promise((resolve) =>
      server.listen(0, "127.0.0.1", () => {
        proxy.port = server.address().port;
        resolve(proxy);
      }),
    );
  proxy.close = () => {
    proxy.cutAll();
    return new Promise((resolve) => server.close(resolve));
  };
  return proxy;
}

// A seeded generator (mulberry32): the cuts are the same run after run.
function seeded(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const FAST = { initialDelayMs: 10, maxDelayMs: 100, giveUpAfterMs: 10000, storage: null };

let gateway;
before(async () => {
  gateway = await serve({}, "--event-rate", "40");
});
after(() => gateway?.child.kill());

test("both directions exactly once through random cuts", { timeout: 60000 }, async () => {
  const proxy = await cuttingProxy(gateway.port).listen();
  const random = seeded(7);
  const client = new DuplexClient(`ws://127.0.0.1:${proxy.port}/v1`, { ...FAST, ackEvery: 5, random });
  const seqs = [];
  const answers = new Map();
  const received = [];
  client.addEventListener("event", ({ detail }) => {
    seqs.push(detail.server_event_seq);
    if (detail.type === "response.done") {
      answers.set(detail.client_event_id, (answers.get(detail.client_event_id) ?? 0) + 1);
    } else if (detail.type === "input_audio.received") {
      received.push([detail.client_seq, detail.bytes]);
    }
  });
  await client.connect();
  let cutting = true;
  const cutter = (async () => {
    while (cutting) {
      await sleep(50 + random() * 250);
      proxy.cutAll();
    }
  })();
  const ids = [];
  const chunks = [];
  for (let n = 0; n < 30; n += 1) {
    if (n < 12) ids.push(await client.input(`question ${n}`));
    chunks.push([client.send(new Uint8Array(n + 1), { type: "input_audio.append" }), n + 1]);
    await sleep(20);
  }
  while (answers.size < ids.length || received.length < chunks.length) await sleep(20);
  cutting = false;
  await cutter;
  await sleep(200); // a late duplicate would show here
  assert.ok(proxy.cuts > 0);
  assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1));
  assert.deepEqual([...answers.keys()].sort(), [...ids].sort());
  assert.ok([...answers.values()].every((n) => n === 1));
  assert.deepEqual(received, chunks);
  const stats = client.statistics();
  assert.ok(stats.resumes > 0, JSON.stringify(stats));
  assert.equal(stats.gaps, 0);
  client.close();
  await proxy.close();
});

test("a new client with the same storage resumes the session (a page reload)", { timeout: 30000 }, async () => {
  const store = new Map();
  const storage = {
    getItem: (k) => store.get(k) ?? null,
    setItem: (k, v) => store.set(k, v),
    removeItem: (k) => store.delete(k),
  };
  const url = `ws://127.0.0.1:${gateway.port}/v1`;
  const first = new DuplexClient(url, { ...FAST, storage });
  const seen = [];
  let firstAnswered = false;
  first.addEventListener("event", ({ detail }) => {
    seen.push(detail.server_event_seq);
    if (detail.type === "response.done") firstAnswered = true;
  });
  await first.connect();
  await first.input("before the reload"); // the server's last_client_seq is 1 now
  while (seen.length < 5 || !firstAnswered) await sleep(10);
  first.dispose();
  const stored = JSON.parse(store.get(`duplex-supervisor:${url}`));
  assert.equal(stored.sessionId, first.sessionId);

  const second = new DuplexClient(url, { ...FAST, storage });
  const after = [];
  let opened;
  second.addEventListener("open", ({ detail }) => (opened = detail));
  second.addEventListener("event", ({ detail }) => after.push(detail.server_event_seq));
  // Queued before the resume: numbered after what the server already took.
  const early = await second.input("queued before the resume");
  await second.connect();
  assert.equal(opened.resumed, true);
  assert.equal(second.sessionId, first.sessionId);
  const id = await second.input("after the reload");
  const answered = new Set();
  second.addEventListener("event", ({ detail }) => {
    if (detail.type === "response.done") answered.add(detail.client_event_id);
  });
  while (!(answered.has(id) && answered.has(early))) await sleep(10);
  assert.equal(second.statistics().errors, 0);
  assert.equal(after[0], stored.lastSeq + 1); // no gap, nothing twice
  assert.deepEqual(after, Array.from({ length: after.length }, (_, i) => after[0] + i));
  second.close();
  while (second.state !== "closed") await sleep(10);
  assert.equal(store.size, 0); // a closed session is forgotten
});

test("a wrong secret is fatal 4401, with no retry", { timeout: 30000 }, async () => {
  const guarded = await serve({ DUPLEX_SUPERVISOR_SECRET: "right" });
  try {
    const url = `ws://127.0.0.1:${guarded.port}/v1`;
    const client = new DuplexClient(url, { ...FAST, secret: "wrong" });
    await assert.rejects(client.connect(), (error) => {
      assert.ok(error instanceof FatalCloseError);
      assert.equal(error.code, 4401);
      return true;
    });
    assert.equal(client.statistics().reconnect_attempts, 0);
    const right = new DuplexClient(url, { ...FAST, secret: "right" });
    await right.connect();
    assert.match(right.sessionId, /^sess_/);
    right.close();
  } finally {
    guarded.child.kill();
  }
});

test("resuming a session the server does not know is fatal 4404", { timeout: 30000 }, async () => {
  const stored = JSON.stringify({ sessionId: "sess_nobody", token: "x", lastSeq: 0 });
  const client = new DuplexClient(`ws://127.0.0.1:${gateway.port}/v1`, {
    ...FAST,
    storage: { getItem: () => stored, setItem: () => {}, removeItem: () => {} },
  });
  await assert.rejects(client.connect(), (error) => error instanceof FatalCloseError && error.code === 4404);
  assert.equal(client.statistics().reconnect_attempts, 0);
});

test("the backoff grows to its ceiling within its jitter", () => {
  const options = { initialDelayMs: 100, maxDelayMs: 1000, multiplier: 2, jitter: 0.5 };
  for (const [attempt, ceiling] of [
    [0, 100],
    [1, 200],
    [3, 800],
    [4, 1000],
    [20, 1000],
  ]) {
    for (const r of [0, 0.5, 0.999]) {
      const delay = backoffDelay(options, attempt, () => r);
      assert.ok(delay <= ceiling && delay >= ceiling / 2, `${attempt} ${r} ${delay}`);
    }
  }
});
