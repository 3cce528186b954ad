// The job page: one host at a time. Charts of throughput, accelerator idle time, allocation,
// CPU and memory; the tuning session and its decisions; the override form; the audit trail.
// Metrics are fetched once for the range, then only the newest buckets on each refresh, so a
// 24 h range costs one large query and then small ones; Plotly's uirevision keeps the zoom.
(function () {
  "use strict";
  const { api, ApiError, Section, fmt, toDates, layout, draw, Live, renderAlerts, escapeHtml, plotlyText, registerTableExport, config, PALETTE } = window.InTune;
  const settings = config();
  const job = settings.job;
  const stageNames = settings.stages;
  const stageColour = Object.fromEntries(stageNames.map((s, i) => [s, PALETTE[i % PALETTE.length]]));
  const SOURCE_STYLE = {
    policy: { symbol: "circle", color: "#0072B2", label: "policy decision" },
    override: { symbol: "diamond", color: "#D55E00", label: "override by a person" },
    default: { symbol: "square", color: "#6b7280", label: "default allocation" },
  };
  const MAX_DECISIONS = 500;

  const state = {
    hostId: null, rangeS: 900, step: 1, metrics: null, overview: null, allocations: [],
    decisions: [], sessions: [], audit: [], ticks: 0, formTouched: false,
    sort: { key: "created_at", descending: true },
  };

  const $ = (id) => document.getElementById(id);
  const hostById = (id) => settings.hosts.find((h) => h.id === id);

  // --- metrics: fetched once per range, then merged bucket by bucket ---------------------------
  function emptySeries(keys) { return Object.fromEntries(keys.map((k) => [k, []])); }

  function mergeInto(target, fresh, cutFrom, keepFrom) {
    // Drop what the fresh answer replaces (the newest, possibly partial bucket on) and what fell
    // out of the range, then append.
    const keys = Object.keys(fresh);
    const keep = target.ts.map((t) => t >= keepFrom && t < cutFrom);
    for (const key of keys) {
      const old = target[key] || [];
      target[key] = old.filter((_, i) => keep[i]).concat(fresh[key]);
    }
  }

  async function fetchMetrics() {
    const now = Date.now() / 1000;
    const keepFrom = now - state.rangeS;
    const base = `/api/v1/hosts/${state.hostId}/metrics/`;
    const untilParam = `until=${(now + 60).toFixed(3)}`;
    if (!state.metrics) {
      const step = Math.max(1, Math.ceil(state.rangeS / 1000));
      const data = await api(`${base}?since=${keepFrom.toFixed(3)}&${untilParam}&step=${step}`);
      state.step = data.step;
      return data;
    }
    // Taken before the request: a host picked or a range chosen while it is out sets
    // state.metrics to null ("Cannot read properties of null (reading 'series')" in the console,
    // the refresh failed); the tick then drops this answer.
    const merged = state.metrics;
    const ts = merged.series.ts;
    const last = ts.length ? ts[ts.length - 1] : keepFrom;
    const cutFrom = Math.max(keepFrom, Math.floor(last / state.step) * state.step);
    const data = await api(`${base}?since=${cutFrom.toFixed(3)}&${untilParam}&step=${state.step}`);
    mergeInto(merged.series, data.series, cutFrom, keepFrom);
    for (const [name, series] of Object.entries(data.stages)) {
      if (!merged.stages[name]) merged.stages[name] = emptySeries(Object.keys(series));
      mergeInto(merged.stages[name], series, cutFrom, keepFrom);
    }
    merged.rank_workers = data.rank_workers && Object.keys(data.rank_workers).length ? data.rank_workers : merged.rank_workers;
    merged.ranks = merged.ranks || {};
    for (const [rank, series] of Object.entries(data.ranks || {})) {
      if (!merged.ranks[rank]) merged.ranks[rank] = emptySeries(Object.keys(series));
      mergeInto(merged.ranks[rank], series, cutFrom, keepFrom);
    }
    return merged;
  }

  // --- charts ---------------------------------------------------------------------------------
  const revision = () => `${state.hostId}:${state.rangeS}`;

  function drawThroughput(m, overview) {
    const s = m.series;
    const x = toDates(s.ts);
    const traces = [{ x, y: s.throughput, name: "end-to-end throughput", mode: "lines", line: { color: "#0072B2", width: 2 },
      hovertemplate: "%{y:,.0f} samples/s<extra>end-to-end</extra>" }];
    const twin = overview && overview.twin;
    const extra = {};
    let note;
    if (twin && twin.best_throughput !== null) {
      const end = new Date(), start = new Date(Date.now() - state.rangeS * 1000);
      traces.push({ x: [start, end], y: [twin.best_throughput, twin.best_throughput], name: "twin's best for this host",
        mode: "lines", line: { color: "#009E73", dash: "dash", width: 2 }, hovertemplate: "%{y:,.0f} samples/s<extra>twin's best</extra>" });
      note = `The twin (fitted ${fmt.dateTime(twin.fitted_at)}) estimates this host's best at ${fmt.rate(twin.best_throughput)} with ${fmt.workers(twin.allocation)}.`;
    } else {
      const reason = (twin && twin.reason) || "no twin fitted for this host yet";
      note = `No estimate of the best this host allows: ${reason}.`;
      extra.annotations = [{ text: `No twin estimate: ${plotlyText(reason)}`, xref: "paper", yref: "paper", x: 1, y: 1.02,
        xanchor: "right", yanchor: "bottom", showarrow: false, font: { size: 11, color: "#6b7280" } }];
    }
    draw("chart-throughput", traces, layout("End-to-end throughput against the twin's best", { y: "samples/s", uirevision: revision(), extra }));
    $("note-throughput").textContent = note;
  }

  function drawIdle(m) {
    const s = m.series;
    const x = toDates(s.ts);
    const waiting = s.idle_fraction.map((v) => (v === null ? null : v * 100));
    const compute = s.idle_fraction.map((v) => (v === null ? null : (1 - v) * 100));
    draw("chart-idle", [
      { x, y: compute, name: "compute", type: "bar", marker: { color: "#009E73" }, hovertemplate: "%{y:.1f} %<extra>compute</extra>" },
      { x, y: waiting, name: "waiting for input", type: "bar", marker: { color: "#D55E00" }, hovertemplate: "%{y:.1f} %<extra>waiting for input</extra>" },
    ], layout("Accelerator time per interval: compute against waiting for input", {
      y: "% of wall time", uirevision: revision(),
      extra: { barmode: "stack", bargap: 0, yaxis: { title: { text: "% of wall time" }, range: [0, 100], gridcolor: "#e4e7eb" } },
    }));
    const n = waiting.filter((v) => v !== null);
    $("note-idle").textContent = n.length
      ? `Over the range the accelerator waited for input ${(n.reduce((a, b) => a + b, 0) / n.length).toFixed(1)} % of the time (bucket ${state.step} s).`
      : "No samples in this range yet.";
  }

  function drawStages(m) {
    const traces = stageNames.filter((n) => m.stages[n]).map((name) => ({
      x: toDates(m.stages[name].ts), y: m.stages[name].items_per_s, name, mode: "lines",
      line: { color: stageColour[name], width: 1.8 }, hovertemplate: `%{y:,.0f} items/s<extra>${name}</extra>`,
    }));
    draw("chart-stages", traces, layout("Throughput per stage", { y: "items/s", uirevision: revision() }));
  }

  // A multi-rank host (torchrun --nproc-per-node N): each rank's samples/s, the slowest drawn
  // thick, because DDP waits for it; the card is hidden on a host of one rank.
  function drawRanks(m) {
    const ranks = Object.keys(m.ranks || {}).sort((a, b) => Number(a) - Number(b));
    const card = document.querySelector('[data-chart="ranks"]');
    if (card) card.style.display = ranks.length < 2 ? "none" : "";
    if (ranks.length < 2) return;
    const mean = (values) => {
      const v = values.filter((x) => x !== null);
      return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
    };
    const rate = Object.fromEntries(ranks.map((r) => [r, mean(m.ranks[r].throughput)]));
    const slowest = ranks.reduce((a, b) => (rate[b] !== null && (rate[a] === null || rate[b] < rate[a]) ? b : a));
    const traces = ranks.map((r) => ({
      x: toDates(m.ranks[r].ts), y: m.ranks[r].throughput, name: r === slowest ? `rank ${r} (slowest)` : `rank ${r}`,
      mode: "lines", line: { color: r === slowest ? "#D55E00" : "#56B4E9", width: r === slowest ? 3 : 1.5 },
      customdata: m.ranks[r].idle_fraction.map((v) => (v === null ? null : v * 100)),
      hovertemplate: `%{y:,.0f} samples/s, waiting %{customdata:.0f} %<extra>rank ${r}</extra>`,
    }));
    draw("chart-ranks", traces, layout("Samples/s per rank (DDP waits for the slowest)", { y: "samples/s", uirevision: revision() }));
    const fastest = ranks.reduce((a, b) => (rate[b] !== null && (rate[a] === null || rate[b] > rate[a]) ? b : a));
    const idle = mean(m.ranks[slowest].idle_fraction);
    $("note-ranks").textContent = `${ranks.length} ranks on this host. Rank ${slowest} is the slowest: ${fmt.rate(rate[slowest])} against ${fmt.rate(rate[fastest])} for rank ${fastest}`
      + (idle === null ? "." : `; it waited for input ${(idle * 100).toFixed(1)} % of the time.`)
      + " The host's throughput above is the sum over its ranks; the host agent splits each allocation among its ranks by what each needs.";
    drawRankTable(ranks, rate, slowest, m);
  }

  // Each rank in a row: samples/s and time waiting for input over the range, and the workers it
  // runs now; the slowest rank's row is highlighted, as DDP waits for it.
  function drawRankTable(ranks, rate, slowest, m) {
    const card = document.querySelector('[data-chart="ranks"]');
    let table = document.getElementById("table-ranks");
    if (!table) {
      table = document.createElement("table");
      table.id = "table-ranks";
      table.className = "ranks";
      card.appendChild(table);
    }
    const mean = (values) => {
      const v = (values || []).filter((x) => x !== null);
      return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
    };
    const shares = m.rank_workers || {};
    const head = "<thead><tr><th scope=\"col\">Rank</th><th scope=\"col\">Samples/s</th><th scope=\"col\">Waiting for input</th><th scope=\"col\">Workers</th></tr></thead>";
    const rows = ranks.map((r) => {
      const idle = mean(m.ranks[r].idle_fraction);
      const workers = shares[r] ? Object.entries(shares[r]).map(([name, n]) => `${escapeHtml(name)} ${Number(n)}`).join(", ") : "—";
      const mark = r === slowest ? ' <span class="badge slowest-badge">slowest</span>' : "";
      return `<tr data-rank="${escapeHtml(r)}"${r === slowest ? ' class="slowest"' : ""}><th scope="row">rank ${escapeHtml(r)}${mark}</th>`
        + `<td>${rate[r] === null ? "—" : fmt.rate(rate[r])}</td><td>${idle === null ? "—" : (idle * 100).toFixed(1) + " %"}</td><td>${workers}</td></tr>`;
    });
    table.innerHTML = `${head}<tbody>${rows.join("")}</tbody>`;
  }

  // Allocations in force over time (stacked, as steps) and a marker at every change.
  function drawAllocation(history, overview, m) {
    const now = Date.now() / 1000;
    // Start where the measurements start, like the other charts, not at an empty range start.
    const start = Math.max(now - state.rangeS, m.series.ts.length ? m.series.ts[0] : now - state.rangeS);
    const inForce = history.filter((a, i) => a.status === "applied" || (a.status === "pending" && i === history.length - 1)
      || (a.source === "default" && a.status !== "refused" && a.status !== "superseded"));
    const points = inForce.map((a) => ({ t: Math.max(start, a.applied_at || a.created_at), workers: a.workers }));
    if (points.length) points.push({ t: now, workers: points[points.length - 1].workers });
    const x = toDates(points.map((p) => p.t));
    // A fused layout names its groups ("read+parse"): one band per group, in its first stage's colour.
    const groups = [...new Set(points.flatMap((p) => Object.keys(p.workers)))].filter((n) => !stageNames.includes(n));
    const colourOf = (name) => stageColour[name] || stageColour[name.split("+")[0]] || PALETTE[0];
    const traces = [...stageNames, ...groups].map((name) => ({
      x, y: points.map((p) => p.workers[name] ?? null), name, stackgroup: "workers", mode: "lines",
      line: { shape: "hv", width: 0.5, color: colourOf(name), dash: name.includes("+") ? "dot" : "solid" }, fillcolor: colourOf(name) + "B3",
      hovertemplate: `%{y} workers<extra>${escapeHtml(name)}</extra>`,
    }));
    const changes = history.filter((a) => a.created_at >= start);
    for (const [source, style] of Object.entries(SOURCE_STYLE)) {
      const mine = changes.filter((a) => a.source === source);
      if (!mine.length) continue;
      traces.push({
        x: toDates(mine.map((a) => a.created_at)), y: mine.map((a) => Object.values(a.workers).reduce((p, q) => p + q, 0)),
        name: style.label, mode: "markers", marker: { symbol: style.symbol, size: 11, color: style.color, line: { color: "#fff", width: 1.5 } },
        // Plotly reads the text as HTML: the person's name and the agent's reason are escaped.
        text: mine.map((a) => `v${a.version} ${a.source}${a.created_by ? " by " + plotlyText(a.created_by) : ""} · ${a.status}`
          + `${a.refusal_reason ? ": " + plotlyText(a.refusal_reason) : ""}<br>${plotlyText(fmt.workers(a.workers))}`),
        hovertemplate: "%{text}<extra></extra>",
      });
    }
    const budget = overview ? overview.worker_budget : hostById(state.hostId).workerBudget;
    traces.push({ x: [new Date(start * 1000), new Date(now * 1000)], y: [budget, budget], name: `CPU slots (${budget})`,
      mode: "lines", line: { color: "#1f2933", dash: "dot", width: 1.5 }, hoverinfo: "skip" });
    draw("chart-allocation", traces, layout("Workers per stage, and who changed them", {
      y: "workers (CPU slots)", uirevision: revision(), extra: { hovermode: "closest" },
    }));
    $("note-allocation").textContent = changes.length
      ? `${changes.length} change${changes.length === 1 ? "" : "s"} in this range: ● policy, ◆ override, ■ default.`
      : "No allocation change in this range.";
  }

  function drawCpu(m, overview) {
    const s = m.series;
    const used = s.cpu_percent.map((v, i) => (v === null || s.cpus[i] === null ? null : (v / 100) * s.cpus[i]));
    const x = toDates(s.ts);
    const budget = overview ? overview.cpus : hostById(state.hostId).cpus;
    const end = x.length ? x[x.length - 1] : new Date();
    const begin = x.length ? x[0] : new Date(Date.now() - state.rangeS * 1000);
    draw("chart-cpu", [
      { x, y: used, name: "CPUs in use", mode: "lines", line: { color: "#0072B2", width: 2 }, fill: "tozeroy", fillcolor: "rgba(0,114,178,0.10)", hovertemplate: "%{y:.2f} CPUs<extra>in use</extra>" },
      { x: [begin, end], y: [budget, budget], name: `budget (${budget} CPUs)`, mode: "lines", line: { color: "#D55E00", dash: "dash", width: 2 }, hoverinfo: "skip" },
    ], layout("Host CPU use against the budget", { y: "CPUs", uirevision: revision() }));
  }

  function drawMemory(m, overview) {
    const s = m.series;
    const x = toDates(s.ts);
    const budget = overview ? overview.memory_mb : hostById(state.hostId).memoryMb;
    const end = x.length ? x[x.length - 1] : new Date();
    const begin = x.length ? x[0] : new Date(Date.now() - state.rangeS * 1000);
    draw("chart-memory", [
      { x, y: s.memory_used_mb, name: "memory in use", mode: "lines", line: { color: "#CC79A7", width: 2 }, fill: "tozeroy", fillcolor: "rgba(204,121,167,0.12)", hovertemplate: "%{y:,.0f} MB<extra>in use</extra>" },
      { x, y: s.memory_limit_mb, name: "limit the agent reports", mode: "lines", line: { color: "#6b7280", width: 1.5 }, hovertemplate: "%{y:,.0f} MB<extra>reported limit</extra>" },
      { x: [begin, end], y: [budget, budget], name: `budget (${Math.round(budget)} MB)`, mode: "lines", line: { color: "#D55E00", dash: "dash", width: 2 }, hoverinfo: "skip" },
    ], layout("Host memory use against the budget", { y: "MB", uirevision: revision() }));
  }

  function selectedSession() {
    const chosen = $("filter-session").value;
    if (chosen) return state.sessions.find((s) => String(s.id) === chosen) || null;
    return state.sessions[0] || null;
  }

  function drawReward() {
    const session = selectedSession();
    const decisions = state.decisions.filter((d) => !session || d.session === session.id).slice().sort((a, b) => a.step - b.step);
    const x = decisions.map((d) => d.step);
    draw("chart-reward", [
      { x, y: decisions.map((d) => d.reward), name: "reward", mode: "lines+markers", line: { color: "#0072B2", width: 2 }, marker: { size: 4 }, hovertemplate: "step %{x}: reward %{y:.3f}<extra></extra>" },
      { x, y: decisions.map((d) => d.epsilon), name: "epsilon (exploration)", mode: "lines", yaxis: "y2", line: { color: "#E69F00", dash: "dot", width: 2 }, hovertemplate: "step %{x}: ε %{y:.3f}<extra></extra>" },
    ], layout(session ? `Reward per step and epsilon, session #${session.id}` : "Reward per step and epsilon", {
      x: "decision step", y: "reward", uirevision: `${revision()}:${session ? session.id : ""}`,
      extra: {
        hovermode: "closest",
        yaxis: { title: { text: "reward" }, automargin: true, gridcolor: "#e4e7eb", zeroline: true },
        yaxis2: { title: { text: "epsilon" }, overlaying: "y", side: "right", range: [0, 1], showgrid: false, automargin: true },
      },
    }));
    $("note-reward").textContent = decisions.length ? `${decisions.length} decisions shown.` : "No decisions yet: start tuning to see the policy learn.";
  }

  // --- headline: lead with the answer, as TensorBoard's input-pipeline analyzer does ------------
  function drawVerdict(m, overview) {
    const node = $("verdict");
    const s = m.series;
    const recent = [];
    const cutoff = Date.now() / 1000 - 30;
    s.ts.forEach((t, i) => { if (t >= cutoff && s.idle_fraction[i] !== null) recent.push(s.idle_fraction[i]); });
    const parts = [];
    let level = "muted";
    if (overview && overview.state === "offline") {
      parts.push(`The agent is silent since ${fmt.dateTime(overview.last_seen)}.`);
      level = "bad";
    }
    if (recent.length) {
      const idle = recent.reduce((a, b) => a + b, 0) / recent.length;
      const pct = `${(idle * 100).toFixed(1)} %`;
      if (idle > 0.5) { parts.push(`Highly input-bound: the accelerator waited for input ${pct} of the last 30 s.`); level = "bad"; }
      else if (idle > 0.2) { parts.push(`Moderately input-bound: the accelerator waited for input ${pct} of the last 30 s.`); level = "warn"; }
      else if (idle > 0.05) { parts.push(`Slightly input-bound: the accelerator waited for input ${pct} of the last 30 s.`); level = "ok"; }
      else { parts.push(`Not input-bound: the accelerator waited for input only ${pct} of the last 30 s.`); level = "ok"; }
      let busiest = null;
      for (const name of stageNames) {
        const st = m.stages[name];
        if (!st || !st.ts.length) continue;
        const busy = st.busy_fraction[st.busy_fraction.length - 1];
        if (busiest === null || busy > busiest.busy) busiest = { name, busy, workers: st.workers[st.workers.length - 1] };
      }
      if (busiest) {
        const n = Math.round(busiest.workers);
        parts.push(`Busiest stage: ${busiest.name} (busy ${(busiest.busy * 100).toFixed(0)} %, ${n} worker${n === 1 ? "" : "s"}).`);
      }
    } else if (!overview || overview.state !== "offline") {
      parts.push("No samples in the last 30 s.");
    }
    node.textContent = parts.join(" ");
    node.className = `verdict ${level}`;
  }

  // --- tables ---------------------------------------------------------------------------------
  function qValuesHtml(decision) {
    const q = decision.q_values;
    if (!q || !Object.keys(q).length) return '<span class="muted">–</span>';
    const entries = Object.entries(q).sort((a, b) => b[1] - a[1]);
    const shown = entries.slice(0, 5).map(([label, value]) =>
      `<span class="q${label === decision.action ? " chosen" : ""}">${escapeHtml(label)} <b>${value.toFixed(3)}</b></span>`);
    if (entries.length > 5) shown.push(`<span class="muted">+${entries.length - 5} more</span>`);
    return shown.join(" ");
  }

  function filteredDecisions() {
    const session = $("filter-session").value;
    const text = $("filter-action").value.trim().toLowerCase();
    const changedOnly = $("filter-changed").checked;
    let previousVersion = new Map();
    // A decision changed the allocation when its version differs from the one before it.
    const byStep = state.decisions.slice().sort((a, b) => a.session - b.session || a.step - b.step);
    for (const d of byStep) {
      const prev = previousVersion.get(d.session);
      d._changed = prev !== undefined && d.version !== null && d.version !== prev;
      previousVersion.set(d.session, d.version);
    }
    const rows = state.decisions.filter((d) => (!session || String(d.session) === session)
      && (!text || d.action.toLowerCase().includes(text)) && (!changedOnly || d._changed));
    const { key, descending } = state.sort;
    const value = (d) => (key === "created_at" ? Date.parse(d.created_at) : d[key] ?? -Infinity);
    rows.sort((a, b) => (descending ? value(b) - value(a) : value(a) - value(b)));
    return rows;
  }

  // Each stage's workers in an allocation: with a layout, every stage of a group runs the group's.
  function stageWorkers(alloc) {
    const out = { ...alloc.workers };
    for (const [name, n] of Object.entries(alloc.workers || {})) {
      if (name.includes("+")) for (const stage of name.split("+")) out[stage] = n;
    }
    return out;
  }
  function renderDecisions() {
    const rows = filteredDecisions();
    const body = $("decisions-table").tBodies[0];
    if (!rows.length) {
      body.innerHTML = `<tr><td colspan="7" class="muted">${state.decisions.length ? "No decision matches the filters." : "No decisions yet."}</td></tr>`;
      return;
    }
    body.innerHTML = rows.slice(0, 200).map((d) => `<tr data-step="${d.step}">
      <td>${fmt.dateTime(d.created_at)}</td><td class="num">${d.step}</td><td>${escapeHtml(d.action)}</td>
      <td class="qvalues">${qValuesHtml(d)}</td><td class="num">${fmt.num(d.reward, 3)}</td><td class="num">${fmt.num(d.epsilon, 3)}</td>
      <td>${d.workers ? `${escapeHtml(fmt.workers(d.workers))} <span class="muted small">v${d.version}</span>` : "–"}</td></tr>`).join("");
  }

  registerTableExport("decisions", () => ({
    columns: ["session", "step", "created_at", "action", "reward", "epsilon", "version", "workers", "q_values"],
    rows: filteredDecisions().map((d) => ({ ...d, workers: JSON.stringify(d.workers), q_values: JSON.stringify(d.q_values) })),
  }));

  function renderSessions() {
    const select = $("filter-session");
    const chosen = select.value;
    select.innerHTML = '<option value="">all</option>' + state.sessions.map((s) =>
      `<option value="${s.id}">#${s.id} ${escapeHtml(s.tuner)} (${s.status})</option>`).join("");
    select.value = state.sessions.some((s) => String(s.id) === chosen) ? chosen : "";
    const session = state.sessions[0];
    const summary = $("session-summary");
    const bar = $("session-progress");
    if (!session) {
      summary.textContent = "No tuning session on this host yet.";
      bar.style.width = "0";
      return;
    }
    const p = session.progress || {};
    const steps = session.max_steps ? `step ${session.steps} of ${session.max_steps}` : `step ${session.steps}`;
    summary.innerHTML = `<span class="badge ${session.status === "running" ? "ok" : session.status === "failed" ? "bad" : "muted"}">${escapeHtml(session.status)}</span>
      Session #${session.id} · ${escapeHtml(session.tuner)} · ${steps} · last reward ${fmt.num(p.last_reward, 3)} · ε ${fmt.num(p.epsilon, 3)}
      · started ${fmt.dateTime(session.started_at)}${session.error ? ` · <span class="error">${escapeHtml(session.error)}</span>` : ""}`;
    bar.style.width = p.fraction !== null && p.fraction !== undefined ? `${Math.min(100, p.fraction * 100)}%` : session.status === "running" ? "100%" : "0";
    bar.classList.toggle("indeterminate", (p.fraction === null || p.fraction === undefined) && session.status === "running");
  }

  function renderAudit() {
    const rows = state.audit.filter((e) => e.host === null || e.host === state.hostId);
    const body = $("audit-table").tBodies[0];
    body.innerHTML = rows.length ? rows.map((e) => `<tr><td>${fmt.dateTime(e.at)}</td><td>${escapeHtml(e.actor_name)}</td>
      <td>${escapeHtml(e.action)}</td><td class="details">${escapeHtml(auditDetails(e.details))}</td></tr>`).join("")
      : '<tr><td colspan="4" class="muted">Nothing yet.</td></tr>';
  }

  function auditDetails(details) {
    if (!details) return "";
    return Object.entries(details).map(([k, v]) => `${k}: ${typeof v === "object" && v !== null ? (k === "workers" ? fmt.workers(v) : JSON.stringify(v)) : v}`).join("; ");
  }

  // The table's rows by host id, found once: a selector per host per refresh searched the whole
  // document 500 times a second on a job of 500 hosts.
  let hostRows = null;

  // A cell is written only when its text changes: every write makes the browser lay out the
  // table again, and on a job of 500 hosts most cells (state, allocation, override, a silent
  // host's figures) read the same from one refresh to the next.
  function setText(cell, text) {
    if (cell && cell.textContent !== text) cell.textContent = text;
  }

  function renderHostsTable(hosts) {
    if (!hostRows) hostRows = new Map([...document.querySelectorAll("#hosts-table tr[data-host-id]")].map((r) => [Number(r.dataset.hostId), r]));
    for (const h of hosts) {
      const row = hostRows.get(h.id);
      if (!row) continue;
      const selected = h.id === state.hostId;
      if (row.classList.contains("selected") !== selected) row.classList.toggle("selected", selected);
      const cls = { online: "ok", offline: "bad", new: "muted" }[h.state] || "muted";
      const stateCell = row.querySelector('[data-field="state"]');
      const badge = stateCell.firstElementChild;
      if (!badge || badge.className !== `badge ${cls}` || badge.textContent !== h.state) {
        stateCell.innerHTML = `<span class="badge ${cls}">${escapeHtml(h.state)}</span>`;
      }
      setText(row.querySelector('[data-field="throughput"]'), fmt.rate(h.throughput));
      setText(row.querySelector('[data-field="idle"]'), fmt.pct(h.idle_fraction));
      setText(row.querySelector('[data-field="allocation"]'), h.applied_version === h.allocation_version
        ? `v${h.applied_version} applied` : `v${h.allocation_version} published, v${h.applied_version} applied`);
      setText(row.querySelector('[data-field="override"]'), h.override ? "override in force" : "–");
    }
  }

  // --- override form ---------------------------------------------------------------------------
  function renderOverview(o) {
    $("host-name").textContent = o.name;
    const badge = $("host-state");
    badge.textContent = o.state;
    badge.className = `badge ${{ online: "ok", offline: "bad", new: "muted" }[o.state] || "muted"}`;
    const current = $("override-current");
    const alloc = o.allocation;
    const allocText = alloc ? `v${alloc.version} (${alloc.source}) ${alloc.status}${alloc.refusal_reason ? `: ${alloc.refusal_reason}` : ""}` : "none";
    if (o.override) {
      current.innerHTML = `<strong>Override in force</strong> by ${escapeHtml(o.override.created_by || "someone")}: ${escapeHtml(fmt.workers(o.override.workers))}
        <br>Reason: “${escapeHtml(o.override.reason)}” · ${o.override.expires_at ? `expires ${fmt.dateTime(o.override.expires_at)}` : "until released"}
        <br>Allocation <span id="override-allocation-status" data-status="${alloc ? alloc.status : ""}" data-version="${alloc ? alloc.version : ""}">${escapeHtml(allocText)}</span>`;
      current.className = "override-current active";
    } else {
      current.innerHTML = `No override: the policy decides. Allocation <span id="override-allocation-status" data-status="${alloc ? alloc.status : ""}" data-version="${alloc ? alloc.version : ""}">${escapeHtml(allocText)}</span>`;
      current.className = "override-current";
    }
    const form = $("override-form");
    if (!form) return;
    $("override-release").disabled = !o.override;
    const slots = o.budget ? o.budget.cpu_slots : o.worker_budget;
    $("override-limits").textContent = `Limits: ${slots} CPU slots on ${o.cpus} CPUs in all (a worker that computes takes one slot, a worker that waits the CPU it was measured to use), ${Math.round(o.memory_mb)} MB of memory; every stage needs at least 1 worker.${o.budget ? ` Now: ${o.budget.summary}.` : ""}`;
    for (const limit of o.limits) {
      const input = form.querySelector(`input[data-stage="${CSS.escape(limit.name)}"]`);
      if (!input) continue;
      input.max = String(limit.max);
      form.querySelector(`[data-limit-for="${CSS.escape(limit.name)}"]`).textContent = `1–${limit.max}`;
      if (!state.formTouched && alloc) input.value = String(stageWorkers(alloc)[limit.name] ?? 1);
    }
    updateTotal();
  }

  // The workers per stage as the form holds them, and the stages whose count the browser cannot
  // read as a whole number: an empty field, 2.5, or "3,5" typed where the decimal mark is a
  // point (Firefox and Safari then give the field an empty value and set validity.badInput;
  // Chromium drops the comma as it is typed).
  function formWorkers() {
    const workers = {};
    const unreadable = [];
    for (const input of $("override-form").querySelectorAll("input[data-stage]")) {
      const text = input.value.trim();
      const n = Number(text);
      if (input.validity.badInput || text === "" || !Number.isInteger(n)) unreadable.push(input.dataset.stage);
      else workers[input.dataset.stage] = n;
    }
    return { workers, unreadable };
  }

  function updateTotal() {
    // CPU slots as agents/budget.py counts them: workers x the slots one worker takes.
    const perWorker = {};
    for (const limit of (state.overview && state.overview.limits) || []) perWorker[limit.name] = limit.worker_cpu ?? 1;
    const { workers } = formWorkers();
    // The allocation is per rank: every rank of a multi-rank host runs it.
    const overview = state.overview;
    const ranks = (overview && overview.budget && overview.budget.ranks) || (overview && overview.ranks) || 1;
    const total = Math.round(ranks * Object.entries(workers).reduce((a, [name, n]) => a + (Number(n) || 0) * (perWorker[name] ?? 1), 0) * 100) / 100;
    const budget = overview ? (overview.budget ? overview.budget.cpu_slots : overview.worker_budget) : hostById(state.hostId).workerBudget;
    const over = Math.round((total - budget) * 100) / 100;
    const node = $("override-total");
    node.textContent = `Total ${total}${ranks > 1 ? ` (${ranks} ranks, per-rank workers)` : ""} of ${budget} CPU slots${over > 0 ? ` — ${over} over the budget: the control plane will refuse this` : ""}.`;
    node.className = `total ${over > 0 ? "warn-text" : ""}`;
  }

  function setMessage(id, text, kind) {
    const node = $(id);
    node.textContent = text;
    node.className = `form-message ${kind || ""}`;
  }

  function wireControls() {
    const form = $("override-form");
    if (form) {
      form.addEventListener("input", (e) => { if (e.target.dataset.stage) { state.formTouched = true; updateTotal(); } });
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const { workers, unreadable } = formWorkers();
        if (unreadable.length) {
          const names = unreadable.map((name) => `'${name}'`).join(", ");
          setMessage("override-message", `Not sent: the worker count of ${names} is not a whole number this browser can read; type digits only, e.g. 3.`, "error");
          return;
        }
        const expiresIn = form.elements.expires_in.value;
        const body = {
          workers, reason: form.elements.reason.value,
          expires_at: expiresIn ? new Date(Date.now() + Number(expiresIn) * 1000).toISOString() : null,
        };
        const hostId = state.hostId;
        setMessage("override-message", "Sending…", "");
        try {
          const override = await api(`/api/v1/hosts/${hostId}/override/`, { method: "PUT", body });
          state.formTouched = false;
          setMessage("override-message", `Override sent as allocation v${override.version}; waiting for the agent to apply it.`, "success");
        } catch (error) {
          setMessage("override-message", `Refused: ${error.message}`, "error");
        }
        live.now();
      });
      $("override-release").addEventListener("click", async () => {
        try {
          await api(`/api/v1/hosts/${state.hostId}/override/`, { method: "DELETE" });
          setMessage("override-message", "Override released: the policy decides again.", "success");
        } catch (error) {
          setMessage("override-message", `Could not release: ${error.message}`, "error");
        }
        live.now();
      });
    }
    const tuning = $("tuning-form");
    if (tuning) {
      tuning.addEventListener("submit", async (event) => {
        event.preventDefault();
        const body = { tuner: tuning.elements.tuner.value };
        if (tuning.elements.max_steps.value) body.max_steps = Number(tuning.elements.max_steps.value);
        if (tuning.elements.this_host.checked) body.hosts = [state.hostId];
        try {
          const started = await api(`/api/v1/jobs/${job.id}/tuning/`, { method: "POST", body });
          setMessage("tuning-message", started.length ? `Started ${started.length} session${started.length === 1 ? "" : "s"}.` : "Tuning already runs on these hosts.", "success");
        } catch (error) {
          setMessage("tuning-message", `Could not start: ${error.message}`, "error");
        }
        live.now();
      });
      $("stop-tuning").addEventListener("click", async () => {
        try {
          const answer = await api(`/api/v1/jobs/${job.id}/tuning/`, { method: "DELETE" });
          setMessage("tuning-message", `Stopped ${answer.stopped} session${answer.stopped === 1 ? "" : "s"}; the allocation in force stays.`, "success");
        } catch (error) {
          setMessage("tuning-message", `Could not stop: ${error.message}`, "error");
        }
        live.now();
      });
    }
    for (const id of ["filter-session", "filter-action", "filter-changed"]) {
      $(id).addEventListener("input", () => { renderDecisions(); drawReward(); });
    }
    for (const th of document.querySelectorAll("#decisions-table th[data-sort]")) {
      th.addEventListener("click", () => {
        const key = th.dataset.sort;
        state.sort = { key, descending: state.sort.key === key ? !state.sort.descending : true };
        for (const other of document.querySelectorAll("#decisions-table th[data-sort]")) other.removeAttribute("aria-sort");
        th.setAttribute("aria-sort", state.sort.descending ? "descending" : "ascending");
        renderDecisions();
      });
    }
    $("range-select").addEventListener("change", (e) => { state.rangeS = Number(e.target.value); state.metrics = null; live.now(); });
    // The host's button picks it from the keyboard; a click anywhere on its row does too. The
    // row itself was a tab stop that did nothing (one per host: 500 on a job of 500 hosts) and
    // its aria-label hid its cells from screen readers.
    const hostsTable = $("hosts-table");
    if (hostsTable) {
      hostsTable.addEventListener("click", (event) => {
        const row = event.target.closest("tr[data-host-id]");
        if (row) selectHost(Number(row.dataset.hostId));
      });
    }
  }

  function selectHost(hostId) {
    if (!hostById(hostId)) hostId = settings.hosts[0].id;
    if (state.hostId === hostId) return;
    Object.assign(state, { hostId, metrics: null, overview: null, allocations: [], decisions: [], sessions: [], audit: [], ticks: 0, formTouched: false });
    if (sections) for (const part of Object.values(sections)) part.section.reset();
    history.replaceState(null, "", `#host-${hostId}`);
    document.body.dataset.exportPrefix = `${job.name}-${hostById(hostId).name}`;
    $("host-name").textContent = hostById(hostId).name;
    if (window.live) live.now();
  }

  // --- the refresh ----------------------------------------------------------------------------
  // Each part of the page refreshes from its own request and fails on its own (Section): the
  // decisions endpoint answering 500, or hanging, leaves the charts, the hosts and the alerts
  // live. Built once the page has hosts (the cards exist).
  let sections = null;
  function buildSections() {
    const card = (node) => node && node.closest(".card");
    const chart = (name) => document.querySelector(`[data-chart="${name}"]`);
    const metricCharts = ["throughput", "idle", "stages", "ranks", "cpu", "memory"].map(chart);
    return {
      metrics: { section: new Section("the measurements", [...metricCharts, $("verdict")]), fast: true,
        request: () => fetchMetrics(), keep: (v) => { state.metrics = v; } },
      overview: { section: new Section("the host's overview", [card($("override-current"))]), fast: true,
        request: (h) => api(`/dashboard/api/hosts/${h}/overview/`), keep: (v) => { state.overview = v; } },
      allocations: { section: new Section("the allocations", [chart("allocation")]), fast: true,
        request: (h, since) => api(`/dashboard/api/hosts/${h}/allocations/?since=${since.toFixed(3)}`),
        keep: (v) => { state.allocations = v.allocations; } },
      hosts: { section: new Section("the hosts", [card($("hosts-table"))]), fast: true,
        request: () => api(`/dashboard/api/jobs/${job.id}/hosts/`), keep: (v) => renderHostsTable(v.hosts) },
      alerts: { section: new Section("the alerts", [$("alerts")], { before: $("alerts") }), fast: true,
        request: () => api(`/dashboard/api/jobs/${job.id}/alerts/`), keep: (v) => renderAlerts($("alerts"), v.alerts) },
      sessions: { section: new Section("the tuning session", [card($("session-summary"))]),
        request: (h) => api(`/api/v1/jobs/${job.id}/tuning/?host=${h}`),
        keep: (v, h) => { state.sessions = v.filter((s) => s.host === h); renderSessions(); } },
      decisions: { section: new Section("the decisions", [card($("decisions-table")), chart("reward")]),
        request: (h) => api(`/api/v1/hosts/${h}/decisions/?limit=${MAX_DECISIONS}`),
        keep: (v) => { state.decisions = v.results || v; renderDecisions(); drawReward(); } },
      audit: { section: new Section("the audit trail", [card($("audit-table"))]),
        request: () => api(`/api/v1/audit/?job=${job.id}&limit=50`),
        keep: (v) => { state.audit = v.results || v; renderAudit(); } },
    };
  }

  // Waits for `promises`, but no longer than `ms`: a section still out lands for the next refresh.
  function settledWithin(promises, ms) {
    let timer;
    const bound = new Promise((resolve) => { timer = setTimeout(resolve, ms); });
    return Promise.race([Promise.allSettled(promises), bound]).finally(() => clearTimeout(timer));
  }

  // A refresh fails as a whole (the page's own status, its backoff and probe) only when no
  // section was refreshed, or when an answer means the page can go no further: logged out
  // (401, 403) or its job or host deleted (404).
  const ends = (error) => error instanceof ApiError && [401, 403, 404].includes(error.status);

  async function tick() {
    const hostId = state.hostId;
    const rangeS = state.rangeS;
    const key = `${hostId}:${rangeS}`;
    const slow = state.ticks % 2 === 0; // decisions, sessions and the audit trail every other tick
    state.ticks += 1;
    const since = Date.now() / 1000 - state.rangeS;
    const asked = Object.values(sections).filter((part) => (part.fast || slow) && part.section.due());
    const out = asked.map((part) => [part, part.section.ask(key, part.request(hostId, since))]);
    // A failing section's retry is not waited for (a hung endpoint would hold every retry's
    // refresh for sectionWaitMs): it lands, or fails, for a later refresh.
    const waited = out.filter(([part]) => !part.section.failures).map(([, request]) => request);
    await settledWithin(waited, window.InTune.sectionWaitMs);
    // Answers for another host or range (picked meanwhile) are dropped: the next refresh, asked
    // for then, shows it.
    const landed = Object.values(sections).map((part) => [part, part.section.take()])
      .filter(([, result]) => result && result.key === key);
    const failed = landed.filter(([, result]) => "error" in result);
    const stop = failed.find(([, result]) => ends(result.error));
    if (stop) throw stop[1].error;
    if (!landed.length) return;
    if (failed.length === landed.length) throw failed[0][1].error;
    for (const [part, result] of landed) {
      if ("error" in result) {
        part.section.failed(result.error, live);
        continue;
      }
      part.keep(result.value, hostId);
      part.section.succeeded();
    }
    if (state.overview) renderOverview(state.overview);
    const metrics = state.metrics;
    if (metrics) {
      const overview = state.overview;
      drawThroughput(metrics, overview);
      drawIdle(metrics);
      drawStages(metrics);
      drawRanks(metrics);
      drawAllocation(state.allocations, overview, metrics);
      drawCpu(metrics, overview);
      drawMemory(metrics, overview);
      drawVerdict(metrics, overview);
    }
    document.body.dataset.refreshedAt = String(Date.now());
  }

  if (!settings.hosts.length) {
    // Nothing to refresh until an agent registers a host: the page says so, not "Live".
    const status = document.querySelector("[data-live-status]");
    const toggle = document.querySelector("[data-live-toggle]");
    if (status) status.textContent = "No hosts yet: reload once an agent has registered";
    if (toggle) toggle.disabled = true;
    return;
  }
  // Every request of the page is about this job or one of its hosts: a 404 means it was deleted.
  sections = buildSections();
  const live = new Live(tick, settings.refreshMs || 1000, {
    gone: (error) => (error.status === 404 ? "Deleted: this job or host no longer exists; the figures are the last ones shown." : null),
  });
  window.live = live;
  const fromHash = Number((location.hash.match(/^#host-(\d+)$/) || [])[1]);
  selectHost(fromHash || settings.hosts[0].id);
  wireControls();
  live.now();
})();
