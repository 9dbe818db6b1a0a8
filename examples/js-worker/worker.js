#!/usr/bin/env node
// An hrwcron worker in JavaScript, on the official NATS client: pulls triggers from a durable
// JetStream consumer and runs each tick once per tick key, by the same processed records as
// the Python worker SDK (hrwcron.worker), so workers of both languages can share a durable.
// docs/triggers.md specifies the trigger; README.md here says what "once" guarantees.

import { connect } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, JetStreamApiError, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { createHash, randomUUID } from "node:crypto";
import { appendFileSync } from "node:fs";
import { hostname } from "node:os";
import { parseArgs } from "node:util";

const HEADER_MSG_ID = "Nats-Msg-Id";
const EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence";
const KV_OPERATION = "KV-Operation";
const MARKER_REASON = "Nats-Marker-Reason";
// The server's answers to a compare-and-set whose expected revision no longer holds.
const WRONG_LAST_SEQUENCE = new Set([10071, 10164]);
const RUNNING = "running";
const DONE = "done";
const RELEASED = "released";
const FETCH_WAIT_MS = 1000;
const TOKEN = /^[A-Za-z0-9_-]{1,64}$/;

const { values: opts } = parseArgs({
  options: {
    server: { type: "string", default: process.env.HRWCRON_NATS_URL || "nats://127.0.0.1:4222" },
    durable: { type: "string", default: "js-worker" },
    subject: { type: "string", multiple: true, default: ["hrwcron.trigger.>"] },
    stream: { type: "string", default: "HRWCRON_TRIGGERS" },
    "processed-bucket": { type: "string", default: "hrwcron_processed" },
    "api-prefix": { type: "string" },
    concurrency: { type: "string", default: "4" },
    "ack-wait": { type: "string", default: "30" },
    "max-deliver": { type: "string", default: "5" },
    heartbeat: { type: "string", default: "10" },
    out: { type: "string" },
    "fail-every": { type: "string", default: "0" },
    "drop-ack-every": { type: "string", default: "0" },
  },
});

const durable = opts.durable;
const bucket = opts["processed-bucket"];
const concurrency = positive("concurrency", opts.concurrency);
const heartbeatMs = positive("heartbeat", opts.heartbeat) * 1000;
const failEvery = Number(opts["fail-every"]);
const dropAckEvery = Number(opts["drop-ack-every"]);
const backoffMs = [1000, 5000, 30000];
const name = `${hostname()}-${process.pid}-${randomUUID().slice(0, 6)}`;
const stats = { handled: 0, failed: 0, duplicates: 0, busy: 0, takeovers: 0, poison: 0, errors: 0 };
const encoder = new TextEncoder();
let ackWaitMs = positive("ack-wait", opts["ack-wait"]) * 1000;
let maxDeliver = Number(opts["max-deliver"]);
let ttl = "86400s";
let stopping = false;
let runs = 0;
let successes = 0;

function positive(option, text) {
  const value = Number(text);
  if (!(value > 0)) {
    console.error(`--${option} must be a number above 0, got ${JSON.stringify(text)}`);
    process.exit(2);
  }
  return value;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function describe(err) {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

// ------------------------------------------------------------------ the processed records

function jobNameOk(job) {
  const tokens = job.split(".");
  return tokens.length >= 1 && tokens.length <= 8 && tokens.every((t) => TOKEN.test(t));
}

// The processed key of a tick key, as the claims bucket keys ticks and as the Python SDK's
// tick_record_key does: <job>.due.<ms> for <job>:<ms>, <job>.manual.<id> for
// <job>:manual:<id>, and a hash under "other" for a key of neither shape.
function recordKey(tick) {
  const parts = tick.split(":");
  const jobOk = parts.length > 0 && jobNameOk(parts[0]);
  if (jobOk && parts.length === 2 && /^[0-9]{1,19}$/.test(parts[1])) {
    return `${parts[0]}.due.${parts[1]}`;
  }
  if (jobOk && parts.length === 3 && parts[1] === "manual" && TOKEN.test(parts[2])) {
    return `${parts[0]}.manual.${parts[2]}`;
  }
  return `other.${createHash("sha256").update(tick).digest("hex").slice(0, 32)}`;
}

class Processed {
  constructor(js, jsm) {
    this.js = js;
    this.jsm = jsm;
  }

  subject(tick) {
    return `$KV.${bucket}.${durable}.${recordKey(tick)}`;
  }

  // Write the record only if the key's revision is `last` (0: only if it has none); its
  // revision, or null when the key moved on. Every write names the revision it replaces, so
  // one that timed out and lands later cannot undo a newer one.
  async write(tick, state, owner, last) {
    const record = JSON.stringify({ state, owner, at_ms: Date.now() });
    try {
      const ack = await this.js.publish(this.subject(tick), encoder.encode(record), {
        expect: { lastSubjectSequence: last },
        ttl,
      });
      return ack.seq;
    } catch (err) {
      if (err instanceof JetStreamApiError && WRONG_LAST_SEQUENCE.has(err.code)) return null;
      throw err;
    }
  }

  // [record or null, the key's last revision]: null for a key never written, deleted,
  // purged or expired (then the revision is the marker's, 0 when there is none).
  async read(tick) {
    const stored = await this.jsm.streams.getMessage(`KV_${bucket}`, { last_by_subj: this.subject(tick) });
    if (stored === null) return [null, 0];
    const op = stored.header.get(KV_OPERATION);
    if (op === "DEL" || op === "PURGE" || stored.header.get(MARKER_REASON)) return [null, stored.seq];
    try {
      return [JSON.parse(new TextDecoder().decode(stored.data)), stored.seq];
    } catch {
      return [{ state: RELEASED, owner: "", at_ms: 0 }, stored.seq]; // unreadable: anyone may claim it
    }
  }

  // ["run" | "done" | "busy", revision], as Processed.begin in the Python SDK.
  async begin(tick, owner) {
    for (let i = 0; i < 5; i++) {
      let revision = await this.write(tick, RUNNING, owner, 0);
      if (revision !== null) return ["run", revision];
      const [record, last] = await this.read(tick);
      if (record === null) {
        if (!last) continue; // expired between the write and the read
        revision = await this.write(tick, RUNNING, owner, last); // an operator deleted it
      } else if (record.state === DONE) {
        return ["done", last];
      } else if (record.state === RUNNING) {
        return [record.owner === owner ? "run" : "busy", last];
      } else {
        revision = await this.write(tick, RUNNING, owner, last); // released by a failed run
      }
      if (revision !== null) return ["run", revision];
    }
    throw new Error(`the processed record of ${tick} kept changing`);
  }

  // Move this run's record to `state`; the new revision, or null when another run holds it.
  async rewrite(tick, state, owner, revision) {
    const written = await this.write(tick, state, owner, revision);
    if (written !== null) return written;
    const [record, last] = await this.read(tick);
    if (record === null || record.owner !== owner) return null;
    if (record.state === state && state !== RUNNING) return last; // an earlier attempt landed
    if (record.state !== RUNNING) return null;
    return this.write(tick, state, owner, last);
  }
}

// ------------------------------------------------------------------------ the handler

// What this example does with a tick: print it, and with --out append what it received, one
// JSON line per completed run (the test reads it). --fail-every N makes every Nth run fail.
async function handler(trigger) {
  runs += 1;
  if (failEvery > 0 && runs % failEvery === 0) throw new Error(`failing run ${runs} on purpose`);
  console.log(`ran ${trigger.tick} job=${trigger.body.job} payload=${JSON.stringify(trigger.body.payload)}`);
  if (opts.out) {
    const line = {
      tick: trigger.tick,
      subject: trigger.subject,
      delivered: trigger.delivered,
      takeover: trigger.takeover,
      worker: name,
      headers: trigger.headers,
      body: trigger.raw,
    };
    appendFileSync(opts.out, `${JSON.stringify(line)}\n`);
  }
}

// ------------------------------------------------------------------------ one delivery

function headersOf(msg) {
  const out = {};
  if (msg.headers) for (const key of msg.headers.keys()) out[key] = msg.headers.get(key);
  return out;
}

async function handle(msg, processed) {
  const raw = new TextDecoder().decode(msg.data);
  let body;
  try {
    body = JSON.parse(raw);
    if (typeof body !== "object" || body === null || typeof body.tick !== "string" || typeof body.job !== "string") {
      throw new Error("no job or tick");
    }
  } catch (err) {
    stats.poison += 1;
    console.error(`${msg.subject}: not a trigger (${describe(err)}); terminated`);
    msg.term();
    return;
  }
  const tick = msg.headers?.get(HEADER_MSG_ID) || body.tick;
  const delivered = msg.info.deliveryCount;
  const owner = `${name}/${randomUUID().slice(0, 8)}`;
  const lease = Math.max(ackWaitMs, 3 * heartbeatMs);
  let revision = 0;
  let takeover = false;
  let watched = 0;
  let since = 0;
  let waiting = false;
  // Claim the tick. While another run holds it, or while the record cannot be read or
  // written, hold the delivery (in-progress acks spend no delivery) and try each heartbeat.
  for (;;) {
    try {
      const [state, rev] = await processed.begin(tick, owner);
      if (state === "run") {
        revision = rev;
        break;
      }
      if (state === "done") {
        stats.duplicates += 1;
        console.log(`duplicate ${tick}: done already, acked without running`);
        await msg.ackAck().catch(() => false);
        return;
      }
      if (!waiting) {
        waiting = true;
        stats.busy += 1;
        console.log(`busy ${tick}: another run holds it; waiting`);
      }
      const now = Date.now();
      if (rev !== watched) {
        [watched, since] = [rev, now];
      } else if (now - since >= lease) {
        const taken = await processed.write(tick, RUNNING, owner, rev);
        if (taken !== null) {
          revision = taken;
          takeover = true;
          stats.takeovers += 1;
          console.log(`takeover ${tick}: the run holding it renewed nothing for ${lease / 1000} s`);
          break;
        }
      }
    } catch (err) {
      stats.errors += 1;
      console.error(`${tick}: cannot read or write its processed record (${describe(err)}); retrying`);
    }
    if (stopping) {
      msg.nak();
      return;
    }
    msg.working();
    await sleep(heartbeatMs);
  }
  // The heartbeat: in-progress acks keep the delivery, renewals keep the record, so neither
  // JetStream nor another worker hands the tick to a second run while this one goes on.
  let lost = false;
  let beating = Promise.resolve();
  const beat = setInterval(() => {
    msg.working();
    beating = beating.then(async () => {
      if (lost) return;
      try {
        const renewed = await processed.rewrite(tick, RUNNING, owner, revision);
        if (renewed === null) lost = true;
        else revision = renewed;
      } catch (err) {
        stats.errors += 1;
        console.error(`${tick}: cannot renew its processed record (${describe(err)})`);
      }
    });
  }, heartbeatMs);
  try {
    await handler({ tick, subject: msg.subject, headers: headersOf(msg), body, raw, delivered, takeover });
  } catch (err) {
    clearInterval(beat);
    await beating;
    stats.failed += 1;
    await processed.rewrite(tick, RELEASED, owner, revision).catch((e) => {
      stats.errors += 1;
      console.error(`${tick}: cannot release its processed record (${describe(e)})`);
    });
    if (maxDeliver > 0 && delivered >= maxDeliver) {
      console.error(`${tick} failed on delivery ${delivered} of ${maxDeliver}, giving up: ${describe(err)}`);
      msg.term();
    } else {
      const delay = backoffMs[Math.min(delivered, backoffMs.length) - 1];
      console.log(`${tick} failed on delivery ${delivered} (${describe(err)}); retry in ${delay / 1000} s`);
      msg.nak(delay);
    }
    return;
  }
  clearInterval(beat);
  await beating;
  if (lost) {
    console.error(`${tick}: another run took its record over meanwhile; not marking it done`);
  } else {
    // The done record first: once it lands, no redelivery runs the tick again.
    const done = await processed.rewrite(tick, DONE, owner, revision).catch((err) => {
      stats.errors += 1;
      console.error(`${tick}: cannot write its done record (${describe(err)})`);
      return null;
    });
    if (done === null) console.error(`${tick}: its done record did not land`);
  }
  stats.handled += 1;
  successes += 1;
  if (dropAckEvery > 0 && successes % dropAckEvery === 0) {
    // As if the ack were lost: JetStream redelivers after ack_wait, and the done record
    // must keep that delivery from running the tick again.
    console.log(`dropping the ack of ${tick} on purpose`);
    return;
  }
  await msg.ackAck().catch((err) => {
    stats.errors += 1;
    console.error(`${tick}: ack failed (${describe(err)}); its redelivery finds the done record`);
  });
}

// ------------------------------------------------------------------------ set-up and loop

async function ensureConsumer(jsm) {
  let info;
  try {
    info = await jsm.consumers.info(opts.stream, durable);
  } catch (err) {
    if (!(err instanceof JetStreamApiError && err.code === 10014)) throw err;
    const config = {
      durable_name: durable,
      ack_policy: AckPolicy.Explicit,
      ack_wait: ackWaitMs * 1_000_000,
      max_deliver: maxDeliver,
      max_ack_pending: Math.max(1000, 4 * concurrency),
      // A new worker does not replay the stream's day of history.
      deliver_policy: DeliverPolicy.New,
      description: "hrwcron worker (JavaScript example)",
    };
    if (opts.subject.length === 1) config.filter_subject = opts.subject[0];
    else config.filter_subjects = opts.subject;
    info = await jsm.consumers.add(opts.stream, config);
  }
  const config = info.config;
  const problems = [];
  if (config.deliver_subject) problems.push("is a push consumer; this worker pulls");
  if (config.ack_policy && config.ack_policy !== AckPolicy.Explicit) problems.push(`acks ${config.ack_policy}; this worker needs explicit acks`);
  const ackWait = (config.ack_wait || 30_000_000_000) / 1_000_000;
  if (heartbeatMs > ackWait / 2) problems.push(`has ack_wait ${ackWait / 1000} s, too short for a ${heartbeatMs / 1000} s heartbeat`);
  if (problems.length) throw new Error(`consumer ${durable} on stream ${opts.stream} ${problems.join("; ")}`);
  // The server applies the consumer's own settings, so those are the ones to reckon with.
  ackWaitMs = ackWait;
  maxDeliver = config.max_deliver > 0 ? config.max_deliver : -1;
}

async function main() {
  const nc = await connect({
    servers: opts.server.split(","),
    name: `hrwcron-js-worker ${durable}`,
    user: process.env.HRWCRON_NATS_USER,
    pass: process.env.HRWCRON_NATS_PASSWORD,
    token: process.env.HRWCRON_NATS_TOKEN,
  });
  const jsOpts = opts["api-prefix"] ? { apiPrefix: opts["api-prefix"] } : {};
  const jsm = await jetstreamManager(nc, jsOpts);
  const js = jetstream(nc, jsOpts);
  const stream = await jsm.streams.info(opts.stream).catch(() => null);
  if (stream === null) throw new Error(`stream ${opts.stream} does not exist: start an hrwcron replica or run hrwcron provision`);
  // A record must outlast every redelivery of its trigger: as long as the stream keeps it.
  ttl = `${Math.max(1, Math.round((stream.config.max_age || 86_400_000_000_000) / 1e9))}s`;
  const kv = await jsm.streams.info(`KV_${bucket}`).catch(() => null);
  if (kv === null || !kv.config.allow_msg_ttl) {
    throw new Error(`bucket ${bucket} is missing or allows no per-key TTL: start an hrwcron replica or run hrwcron provision`);
  }
  await ensureConsumer(jsm);
  const processed = new Processed(js, jsm);
  const consumer = await js.consumers.get(opts.stream, durable);
  const inflight = new Set();
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => (stopping = true));
  console.log(`worker ${name} consuming ${opts.subject.join(" ")} as ${durable}`);
  while (!stopping) {
    const free = concurrency - inflight.size;
    if (free <= 0) {
      await Promise.race(inflight);
      continue;
    }
    try {
      const messages = await consumer.fetch({ max_messages: free, expires: FETCH_WAIT_MS });
      for await (const msg of messages) {
        const task = handle(msg, processed).catch((err) => {
          stats.errors += 1;
          console.error(`delivery on ${msg.subject} failed unexpectedly: ${describe(err)}`);
        });
        inflight.add(task);
        task.finally(() => inflight.delete(task));
      }
    } catch (err) {
      stats.errors += 1;
      console.error(`fetch from ${durable} failed: ${describe(err)}`);
      await sleep(1000);
    }
  }
  await Promise.all(inflight);
  await nc.drain();
  const counts = Object.entries(stats).map(([k, v]) => `${k} ${v}`).join(", ");
  console.log(`stopped: ${counts}`);
  process.exit(0);
}

main().catch((err) => {
  console.error(`worker: ${describe(err)}`);
  process.exit(1);
});
