#!/usr/bin/env node
// An agent for the InTune control plane written the way a third party would: from
// docs/agent-protocol.md alone, in another language, with Node's standard library only (node:http
// with a keep-alive pool; no package). It runs simulated hosts (one pipeline each, its stages'
// figures made up) that ship metric batches, hold the allocation long-poll, check and apply or
// refuse each allocation, and handle every status the protocol lists.
//
// Usage:
//   node agent.mjs register CONFIG.json   registers a job and CONFIG.hosts hosts (operator token),
//                                         prints {"job_id", "hosts": [{"id", "agent_token"}]}
//   node agent.mjs run CONFIG.json        runs one agent per CONFIG.hosts entry until SIGTERM or
//                                         CONFIG.seconds; one JSON event a line on stdout
//
// What the tests read is the events: "batch" (each answer to a metrics POST), "poll" (each
// answer to a long-poll), "applied" / "refused" (each allocation checked), "retry" (a wait before
// a retry: its status and seconds), "dropped_invalid" (a sample the control plane refused),
// "fatal" (an answer after which this agent stops: 401, 403), "summary" (each agent, at the
// end), "figures" (the run's: batch latency percentiles, errors, this process's CPU a request).
// CONFIG.quiet keeps only the last three (benchmarks/node_agents.py runs hundreds of agents).

import http from "node:http";
import { readFileSync } from "node:fs";

const MAX_SAMPLES = 600; // "at most 600 samples per batch"
const MAX_BODY = 1024 * 1024; // "1 MiB per body"

let quiet = false; // only the summaries and the figures (a run of hundreds of agents)
const QUIET_KEPT = new Set(["summary", "figures", "fatal"]);

function emit(event) {
  if (quiet && !QUIET_KEPT.has(event.event)) return;
  process.stdout.write(JSON.stringify({ t: Date.now() / 1000, ...event }) + "\n");
}

// What a run measures, over all its agents: each stored batch's latency (from just before its
// request to its whole answer; the body serialised before), and the requests of every kind.
const measured = { batchMs: [], requests: 0, errors: 0 };

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// "Retry 5xx, 429 and network errors with exponential backoff and jitter."
function backoff(attempt, base = 0.25, cap = 10) {
  const ceiling = Math.min(cap, base * 2 ** attempt);
  return ceiling / 2 + (Math.random() * ceiling) / 2;
}

// Retry-After: seconds or an HTTP date (RFC 9110); null when absent or unreadable.
function retryAfter(headers) {
  const value = headers["retry-after"];
  if (value === undefined) return null;
  if (/^\s*\d+(\.\d+)?\s*$/.test(value)) return Number(value);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
}

class Client {
  constructor(base, authorization, pool) {
    const url = new URL(base);
    this.hostname = url.hostname;
    this.port = Number(url.port || 80);
    this.authorization = authorization;
    this.pool = pool;
  }

  // One request: {status, headers, body (parsed JSON when JSON), ms}; rejects on network errors
  // and when no answer came within timeoutS.
  request(method, path, body, timeoutS = 30, signal = undefined) {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers = { Authorization: this.authorization, Accept: "application/json" };
    if (payload) {
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = payload.length;
    }
    const started = performance.now();
    measured.requests++;
    return new Promise((resolve, reject) => {
      const req = http.request(
        { hostname: this.hostname, port: this.port, method, path, headers, agent: this.pool, signal },
        (res) => {
          const chunks = [];
          res.on("data", (chunk) => chunks.push(chunk));
          res.on("error", reject);
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8");
            let parsed = text;
            if ((res.headers["content-type"] || "").includes("json") && text) {
              try {
                parsed = JSON.parse(text);
              } catch {
                parsed = text;
              }
            }
            resolve({
              status: res.statusCode,
              headers: res.headers,
              body: parsed,
              ms: performance.now() - started,
            });
          });
        },
      );
      req.setTimeout(timeoutS * 1000, () => req.destroy(new Error(`no answer in ${timeoutS} s`)));
      req.on("error", reject);
      if (payload) req.write(payload);
      req.end();
    });
  }
}

// A made-up pipeline: each stage's worker handles `rate` items/s and holds `rssMb`.
class SimulatedPipeline {
  constructor(stages, workers) {
    this.stages = stages; // [{name, max_workers, rate, rss_mb}]
    this.workers = { ...workers };
  }

  sample() {
    const capacity = this.stages.map((s) => this.workers[s.name] * (s.rate || 1000));
    const throughput = Math.min(...capacity);
    return {
      throughput,
      stages: this.stages.map((s, i) => ({
        name: s.name,
        workers: this.workers[s.name],
        items_per_s: throughput,
        busy_fraction: Math.min(1, throughput / capacity[i]),
        in_queue: 0,
        out_queue: 1,
        queue_capacity: 16,
        cpu_percent: 100 * this.workers[s.name] * Math.min(1, throughput / capacity[i]),
        rss_mb: s.rss_mb || 100,
      })),
    };
  }
}

export class Agent {
  constructor(config, host, pool) {
    this.config = config;
    this.hostId = host.id;
    this.client = new Client(config.url, `Agent ${host.agent_token}`, pool);
    this.stages = config.stages;
    this.cpus = config.cpus;
    this.memoryLimitMb = config.memory_mb;
    // "the agent's own: its whole CPUs, at least one, plus the number of stages"
    this.workerBudget =
      config.worker_budget ?? Math.max(1, Math.floor(this.cpus)) + this.stages.length;
    this.memoryBudgetMb = config.memory_budget_mb ?? 0.8 * this.memoryLimitMb;
    this.pipeline = new SimulatedPipeline(
      this.stages,
      Object.fromEntries(this.stages.map((s) => [s.name, 1])),
    );
    // "strictly increasing over the agent's life (keep it across restarts)"
    this.seq = config.seq_start ?? Date.now();
    this.buffer = []; // samples not yet stored, oldest first
    this.bufferMax = config.buffer_max ?? 3600;
    this.dropped = 0; // "dropped_samples": since the last successful batch
    this.appliedVersion = null;
    this.known = 0; // the newest version seen, applied or refused ("versions only grow")
    this.refused = []; // refusals not yet reported
    this.statusDirty = false; // an allocation_status to report at once
    this.maxSamples = config.max_samples ?? MAX_SAMPLES;
    this.stopped = false;
    this.fatal = null;
    this.counts = { sent: 0, stored: 0, duplicates: 0, invalid: 0, generated: 0 };
    this.injectInvalidAt = new Set(config.invalid_samples || []); // sample indexes to spoil
    this.wake = null; // resolves the shipping loop's wait early
    this.pollAbort = new AbortController(); // ends a held long-poll at stop
  }

  tag(event) {
    return { host: this.hostId, ...event };
  }

  nextSample() {
    const measured = this.pipeline.sample();
    const index = this.counts.generated++;
    const sample = {
      seq: this.seq++,
      ts: Date.now() / 1000,
      allocation_version: this.appliedVersion,
      host: {
        cpus: this.cpus,
        cpu_percent: 50,
        memory_used_mb: 1024,
        memory_limit_mb: this.memoryLimitMb,
        worker_budget: this.workerBudget,
      },
      trainer: { throughput: measured.throughput, idle_fraction: 0.1, device: "cpu" },
      stages: measured.stages,
    };
    if (this.injectInvalidAt.has(index)) sample.stages[0].busy_fraction = 1.7;
    this.buffer.push(sample);
    // "When the buffer overflows it drops the oldest samples and reports how many."
    while (this.buffer.length > this.bufferMax) {
      this.buffer.shift();
      this.dropped++;
    }
  }

  // -- allocations --------------------------------------------------------------------------
  // "An agent never applies an allocation blindly": the reason it is refused, or null.
  check(allocation) {
    if (allocation.layout !== undefined && allocation.layout !== null) {
      return "this pipeline cannot change its layout";
    }
    const workers = allocation.workers || {};
    const names = new Set(this.stages.map((s) => s.name));
    for (const name of Object.keys(workers)) {
      if (!names.has(name)) return `unknown stage '${name}'`;
    }
    let slots = 0;
    let memory = 0;
    for (const stage of this.stages) {
      const count = workers[stage.name];
      if (count === undefined) return `stage '${stage.name}' is missing`;
      if (!Number.isInteger(count)) return `stage '${stage.name}': ${count} is not an integer`;
      if (count < 1) return `stage '${stage.name}' asks for ${count} workers, below 1`;
      if (stage.max_workers && count > stage.max_workers) {
        return `stage '${stage.name}' asks for ${count} workers, above its max_workers ${stage.max_workers}`;
      }
      slots += count; // every stage of this pipeline computes: one slot a worker
      memory += count * (stage.rss_mb || 100);
    }
    if (slots > this.workerBudget) {
      return `the allocation takes ${slots} CPU slots but the host budget is ${this.workerBudget}`;
    }
    if (memory > this.memoryBudgetMb) {
      return `the allocation takes ${memory} MB but the memory budget is ${this.memoryBudgetMb} MB`;
    }
    return null;
  }

  receive(allocation) {
    if (!Number.isInteger(allocation.version) || allocation.version <= this.known) return;
    this.known = allocation.version;
    const reason = this.check(allocation);
    if (reason === null) {
      this.pipeline.workers = { ...allocation.workers };
      this.appliedVersion = allocation.version;
      emit(this.tag({ event: "applied", version: allocation.version, source: allocation.source }));
    } else {
      this.refused.push({ version: allocation.version, reason });
      emit(this.tag({ event: "refused", version: allocation.version, reason }));
    }
    // "reports it at once, without waiting for its next sample"
    this.statusDirty = true;
    if (this.wake) this.wake();
  }

  async pollLoop() {
    let failures = 0;
    const wait = this.config.poll_wait_s ?? 30;
    while (!this.stopped) {
      let answer;
      try {
        answer = await this.client.request(
          "GET",
          `/api/v1/hosts/${this.hostId}/allocation/?after=${this.known}&wait=${wait}`,
          undefined,
          wait + 15,
          this.pollAbort.signal,
        );
      } catch (error) {
        if (this.stopped) return;
        const seconds = backoff(failures++);
        emit(this.tag({ event: "retry", what: "poll", status: null, error: String(error), seconds }));
        await sleep(seconds * 1000);
        continue;
      }
      emit(this.tag({ event: "poll", status: answer.status, ms: answer.ms }));
      if (answer.status === 200) {
        failures = 0;
        this.receive(answer.body);
      } else if (answer.status === 204) {
        failures = 0;
      } else if (await this.mustStop(answer, "poll", () => failures++)) {
        return;
      }
    }
  }

  // What every answer other than success means; true when this agent must stop.
  async mustStop(answer, what, attempt) {
    const detail = typeof answer.body === "object" ? answer.body.detail : answer.body;
    if (answer.status === 401 || answer.status === 403) {
      this.fatal = { status: answer.status, detail };
      emit(this.tag({ event: "fatal", what, status: answer.status, detail }));
      this.stop();
      return true;
    }
    if (answer.status === 429 || answer.status === 503) {
      const told = retryAfter(answer.headers);
      const seconds = told ?? backoff(attempt());
      emit(this.tag({ event: "retry", what, status: answer.status, retry_after: told, seconds }));
      await sleep(seconds * 1000);
      return false;
    }
    const seconds = backoff(attempt());
    emit(this.tag({ event: "retry", what, status: answer.status, detail, seconds }));
    await sleep(seconds * 1000);
    return false;
  }

  // -- metrics ------------------------------------------------------------------------------
  batchBody(samples) {
    const body = { samples };
    if (this.appliedVersion !== null || this.refused.length) {
      body.allocation_status = { applied_version: this.appliedVersion, refused: this.refused };
    }
    body.dropped_samples = this.dropped;
    return body;
  }

  // Ships the buffer (and any allocation_status) until empty or the control plane cannot take
  // it; resolves when done or when a retry must wait.
  async ship() {
    let failures = 0;
    while (!this.stopped && (this.buffer.length || this.statusDirty)) {
      let take = Math.min(this.buffer.length, this.maxSamples);
      let body = this.batchBody(this.buffer.slice(0, take));
      // "1 MiB per body": fewer samples until it fits
      while (take > 1 && Buffer.byteLength(JSON.stringify(body)) > MAX_BODY) {
        take = Math.floor(take / 2);
        body = this.batchBody(this.buffer.slice(0, take));
      }
      const reportedRefusals = this.refused.length;
      let answer;
      try {
        answer = await this.client.request("POST", `/api/v1/hosts/${this.hostId}/metrics/`, body);
      } catch (error) {
        measured.errors++;
        const seconds = backoff(failures++);
        emit(this.tag({ event: "retry", what: "batch", status: null, error: String(error), seconds }));
        await sleep(seconds * 1000);
        continue;
      }
      const detail = typeof answer.body === "object" ? answer.body.detail : answer.body;
      emit(this.tag({ event: "batch", status: answer.status, samples: take, ms: answer.ms, detail }));
      if (answer.status !== 200) measured.errors++;
      if (answer.status === 200) {
        measured.batchMs.push(answer.ms);
        failures = 0;
        this.buffer.splice(0, take);
        this.refused.splice(0, reportedRefusals);
        this.statusDirty = false;
        this.dropped = 0;
        this.counts.sent += take;
        this.counts.stored += answer.body.stored;
        this.counts.duplicates += answer.body.duplicates;
        if (answer.body.latest_allocation_version > this.known && this.wake) this.wake();
      } else if (answer.status === 400 || answer.status === 409) {
        // "never retry a 400 or a 409": drop the sample it names and resend the rest
        const named = /^samples\[(\d+)\]/.exec(detail || "");
        if (named && Number(named[1]) < take) {
          const [gone] = this.buffer.splice(Number(named[1]), 1);
          this.counts.invalid++;
          emit(this.tag({ event: "dropped_invalid", seq: gone.seq, detail }));
        } else if ((detail || "").startsWith("allocation_status")) {
          this.refused.splice(0, reportedRefusals);
          this.statusDirty = false;
          emit(this.tag({ event: "dropped_status", detail }));
        } else {
          this.buffer.splice(0, take);
          this.counts.invalid += take;
          emit(this.tag({ event: "dropped_batch", samples: take, detail }));
        }
      } else if (answer.status === 413) {
        this.maxSamples = Math.max(1, Math.floor(take / 2));
        emit(this.tag({ event: "smaller_batches", samples: this.maxSamples, detail }));
      } else if (await this.mustStop(answer, "batch", () => failures++)) {
        return;
      }
    }
  }

  async shipLoop() {
    const interval = (this.config.sample_interval_s ?? 1) * 1000;
    const every = this.config.batch_every ?? 5;
    // "spread": each agent starts at its own phase; "in step": all at once
    if (this.config.phase_s) await sleep(this.config.phase_s * 1000);
    let tick = 0;
    let next = performance.now();
    while (!this.stopped) {
      this.nextSample();
      tick++;
      if (tick % every === 0 || this.statusDirty) await this.ship();
      next += interval;
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, Math.max(0, next - performance.now()));
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = null;
      if (this.statusDirty) await this.ship();
    }
  }

  stop() {
    this.stopped = true;
    this.pollAbort.abort();
    if (this.wake) this.wake();
  }

  async run() {
    await Promise.all([this.shipLoop(), this.pollLoop()]);
  }

  async drain(timeoutS) {
    // at the end: what is buffered is sent, bounded (the bound's timer is cleared once the
    // buffer is out: left pending, it kept the process alive for the whole bound)
    this.stopped = false;
    let timer;
    const bound = new Promise((resolve) => {
      timer = setTimeout(resolve, timeoutS * 1000);
    });
    await Promise.race([this.ship(), bound]);
    clearTimeout(timer);
    this.stopped = true;
  }
}

async function register(config) {
  const pool = new http.Agent({ keepAlive: true });
  const api = new Client(config.url, `Token ${config.operator_token}`, pool);
  const job = await api.request("POST", "/api/v1/jobs/", {
    name: config.job_name || "node-agent",
    stages: config.stages.map((s) => ({ name: s.name, max_workers: s.max_workers ?? null })),
    tuner: config.tuner || "static",
  });
  if (job.status !== 201) throw new Error(`job: ${job.status} ${JSON.stringify(job.body)}`);
  const hosts = [];
  const count = config.hosts || 1;
  for (let first = 0; first < count; first += 8) {
    const batch = [];
    for (let i = first; i < Math.min(count, first + 8); i++) {
      batch.push(
        api.request("POST", `/api/v1/jobs/${job.body.id}/hosts/`, {
          name: `node-${i}`,
          cpus: config.cpus,
          memory_mb: config.memory_mb,
          worker_budget: null,
          ranks: 1,
        }),
      );
    }
    for (const host of await Promise.all(batch)) {
      if (host.status !== 201) throw new Error(`host: ${host.status} ${JSON.stringify(host.body)}`);
      hosts.push({ id: host.body.id, agent_token: host.body.agent_token, allocation: host.body.allocation });
    }
  }
  pool.destroy();
  process.stdout.write(JSON.stringify({ job_id: job.body.id, hosts }) + "\n");
}

function percentile(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function run(config) {
  quiet = Boolean(config.quiet);
  const pool = new http.Agent({ keepAlive: true, keepAliveMsecs: 1000 });
  const cpuBefore = process.cpuUsage();
  const spread = config.shape === "spread";
  const every = (config.batch_every ?? 5) * (config.sample_interval_s ?? 1);
  const agents = config.hosts.map(
    (host, i) =>
      new Agent(
        { ...config, phase_s: spread ? (i / config.hosts.length) * every : 0 },
        host,
        pool,
      ),
  );
  const stopAll = () => agents.forEach((a) => a.stop());
  process.on("SIGTERM", stopAll);
  process.on("SIGINT", stopAll);
  const timer = config.seconds ? setTimeout(stopAll, config.seconds * 1000) : null;
  await Promise.all(agents.map((a) => a.run()));
  clearTimeout(timer); // every agent stopped early (a 401): the process ends now
  await Promise.all(agents.map((a) => (a.fatal ? null : a.drain(config.drain_s ?? 10))));
  for (const a of agents) {
    emit(
      a.tag({
        event: "summary",
        ...a.counts,
        buffered: a.buffer.length,
        applied_version: a.appliedVersion,
        known: a.known,
        seq_next: a.seq,
        fatal: a.fatal,
      }),
    );
  }
  const sorted = measured.batchMs.sort((a, b) => a - b);
  const cpu = process.cpuUsage(cpuBefore);
  emit({
    event: "figures",
    agents: agents.length,
    shape: config.shape || "in-step",
    batches_stored: sorted.length,
    samples_generated: agents.reduce((n, a) => n + a.counts.generated, 0),
    samples_stored: agents.reduce((n, a) => n + a.counts.stored, 0),
    errors: measured.errors,
    requests: measured.requests,
    p50_ms: percentile(sorted, 50),
    p95_ms: percentile(sorted, 95),
    p99_ms: percentile(sorted, 99),
    max_ms: sorted.length ? sorted[sorted.length - 1] : null,
    cpu_ms_per_request: (cpu.user + cpu.system) / 1000 / Math.max(1, measured.requests),
  });
  pool.destroy();
}

const [command, path] = process.argv.slice(2);
if (command === "register" || command === "run") {
  const config = JSON.parse(readFileSync(path, "utf8"));
  (command === "register" ? register : run)(config).catch((error) => {
    process.stderr.write(`${error.stack || error}\n`);
    process.exit(1);
  });
} else if (command !== undefined) {
  process.stderr.write("usage: agent.mjs register|run CONFIG.json\n");
  process.exit(2);
}
