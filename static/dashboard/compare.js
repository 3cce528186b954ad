// Two hosts (on a shared clock) or two tuning sessions (aligned on their start) on one chart.
(function () {
  "use strict";
  const { api, all, toDates, layout, draw, Live, ApiError, config } = window.InTune;
  const settings = config();
  const $ = (id) => document.getElementById(id);
  const COLOURS = ["#0072B2", "#D55E00"];

  const HOST_METRICS = {
    throughput: { label: "end-to-end throughput", unit: "samples/s", pick: (s) => s.throughput },
    idle: { label: "accelerator waiting for input", unit: "% of wall time", pick: (s) => s.idle_fraction.map((v) => (v === null ? null : v * 100)) },
    cpu: { label: "CPUs in use", unit: "CPUs", pick: (s) => s.cpu_percent.map((v, i) => (v === null ? null : (v / 100) * s.cpus[i])) },
    memory: { label: "memory in use", unit: "MB", pick: (s) => s.memory_used_mb },
  };
  const SESSION_METRICS = {
    reward: { label: "reward per step", unit: "reward", x: "decision step" },
    throughput: { label: "end-to-end throughput", unit: "samples/s", x: "seconds since the session started" },
    idle: { label: "accelerator waiting for input", unit: "% of wall time", x: "seconds since the session started" },
  };

  function fillOptions(select, items, chosen) {
    select.innerHTML = items.map((i) => `<option value="${i.value}">${window.InTune.escapeHtml(i.label)}</option>`).join("");
    if (chosen !== undefined && items.some((i) => String(i.value) === String(chosen))) select.value = String(chosen);
  }

  function setMode() {
    const mode = $("compare-mode").value;
    const params = new URLSearchParams(location.search);
    const entries = mode === "hosts"
      ? settings.hosts.map((h) => ({ value: h.id, label: h.label }))
      : settings.sessions.map((s) => ({ value: s.id, label: s.label }));
    fillOptions($("compare-a"), entries, params.get("a") || (entries[0] && entries[0].value));
    fillOptions($("compare-b"), entries, params.get("b") || (entries[1] && entries[1].value) || (entries[0] && entries[0].value));
    const metrics = mode === "hosts" ? HOST_METRICS : SESSION_METRICS;
    fillOptions($("compare-metric"), Object.entries(metrics).map(([value, m]) => ({ value, label: m.label })), params.get("metric"));
    document.querySelector("[data-hosts-only]").hidden = mode !== "hosts";
    $("compare-help").textContent = entries.length < 1
      ? `Nothing to compare yet: ${mode === "hosts" ? "register hosts" : "start tuning sessions"} first.`
      : mode === "hosts" ? "Both hosts on the same clock." : "Both sessions aligned on their start (step 0, or second 0).";
  }

  // A 404 names what was compared and is gone (its host deleted, or its job with it).
  async function named(what, request) {
    try {
      return await request;
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) throw new ApiError(404, `${what} no longer exists`);
      throw error;
    }
  }

  async function hostTrace(id, metric, rangeS, index) {
    const now = Date.now() / 1000;
    const step = Math.max(1, Math.ceil(rangeS / settings.maxPoints));
    const host = settings.hosts.find((h) => String(h.id) === String(id));
    const data = await named(`host ${host ? host.label : id}`, api(`/api/v1/hosts/${id}/metrics/?since=${(now - rangeS).toFixed(3)}&until=${(now + 60).toFixed(3)}&step=${step}`));
    return { x: toDates(data.series.ts), y: HOST_METRICS[metric].pick(data.series), name: `${index ? "B" : "A"}: ${host ? host.label : id}`,
      mode: "lines", line: { color: COLOURS[index], width: 2 } };
  }

  async function sessionTrace(id, metric, index) {
    const session = settings.sessions.find((s) => String(s.id) === String(id));
    const name = `${index ? "B" : "A"}: ${session ? session.label : id}`;
    if (metric === "reward") {
      const page = await named(`the host of session ${name.slice(3)}`, api(`/api/v1/hosts/${session.host}/decisions/?session=${id}&limit=1000`));
      const decisions = (page.results || page).slice().sort((a, b) => a.step - b.step);
      return { x: decisions.map((d) => d.step), y: decisions.map((d) => d.reward), name, mode: "lines+markers", marker: { size: 4 }, line: { color: COLOURS[index], width: 2 } };
    }
    const until = session.stoppedAt || Date.now() / 1000;
    const step = Math.max(1, Math.ceil((until - session.startedAt) / settings.maxPoints));
    const data = await named(`the host of session ${name.slice(3)}`, api(`/api/v1/hosts/${session.host}/metrics/?since=${session.startedAt.toFixed(3)}&until=${(until + 1).toFixed(3)}&step=${step}`));
    const s = data.series;
    const y = metric === "throughput" ? s.throughput : s.idle_fraction.map((v) => (v === null ? null : v * 100));
    return { x: s.ts.map((t) => t - session.startedAt), y, name, mode: "lines", line: { color: COLOURS[index], width: 2 } };
  }

  async function tick() {
    const mode = $("compare-mode").value;
    const a = $("compare-a").value, b = $("compare-b").value, metric = $("compare-metric").value;
    if (!a || !b) return;
    const rangeS = Number($("compare-range").value);
    const traces = mode === "hosts"
      ? await all([hostTrace(a, metric, rangeS, 0), hostTrace(b, metric, rangeS, 1)])
      : await all([sessionTrace(a, metric, 0), sessionTrace(b, metric, 1)]);
    const m = mode === "hosts" ? HOST_METRICS[metric] : SESSION_METRICS[metric];
    const title = `${m.label[0].toUpperCase()}${m.label.slice(1)}: A against B`;
    draw("chart-compare", traces, layout(title, { x: mode === "hosts" ? "time" : m.x, y: m.unit, uirevision: `${mode}:${a}:${b}:${metric}:${rangeS}` }));
    $("note-compare").textContent = traces.map((t) => `${t.name}: ${t.x.length} points`).join(" · ");
    document.body.dataset.exportPrefix = `compare-${mode}-${a}-${b}`;
  }

  // A host compared here that was deleted answers 404 for good: the page says so and stops, as
  // the job page does, instead of retrying for as long as it is open; a choice made after that
  // loads the page again, whose lists no longer hold what was deleted.
  const live = new Live(tick, settings.refreshMs || 2000, {
    gone: (error) => (error.status === 404 ? `Deleted: ${error.message}; the chart is the last one shown.` : null),
  });
  window.live = live;
  const params = new URLSearchParams(location.search);
  if (params.get("mode")) $("compare-mode").value = params.get("mode");
  setMode();
  $("compare-mode").addEventListener("change", () => {
    if (live.ended) {
      location.assign(`?mode=${$("compare-mode").value}`);
      return;
    }
    history.replaceState(null, "", location.pathname);
    setMode();
    live.now();
  });
  for (const id of ["compare-a", "compare-b", "compare-metric", "compare-range"]) {
    $(id).addEventListener("change", () => {
      const q = new URLSearchParams({ mode: $("compare-mode").value, a: $("compare-a").value, b: $("compare-b").value, metric: $("compare-metric").value });
      if (live.ended) {
        location.assign(`?${q}`);
        return;
      }
      history.replaceState(null, "", `?${q}`);
      live.now();
    });
  }
  live.now();
})();
