// The home page: every job's state, refreshed live, with a throughput sparkline each.
(function () {
  "use strict";
  const { api, all, fmt, toDates, Live, renderAlerts, config } = window.InTune;
  const settings = config();

  function jobStatus(job) {
    if (job.hosts_total === 0) return ["no hosts", "muted"];
    if (job.hosts_online > 0) return [job.hosts_offline > 0 ? "degraded" : "running", job.hosts_offline > 0 ? "warn" : "ok"];
    if (job.hosts_offline > 0) return ["offline", "bad"];
    return ["waiting for agents", "muted"];
  }

  function sparkline(job) {
    const node = document.getElementById(`spark-${job.id}`);
    if (!node) return;
    const { ts, throughput } = job.sparkline;
    Plotly.react(node, [{
      x: toDates(ts), y: throughput, mode: ts.length < 3 ? "lines+markers" : "lines", line: { color: "#0072B2", width: 1.5 },
      marker: { size: 4 },
      fill: "tozeroy", fillcolor: "rgba(0,114,178,0.12)", hovertemplate: "%{y:,.0f} samples/s<extra></extra>",
      name: "throughput",
    }], {
      margin: { l: 0, r: 0, t: 0, b: 0 }, height: 36, width: 160, showlegend: false,
      xaxis: { visible: false }, yaxis: { visible: false, rangemode: "tozero" },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    }, { displayModeBar: false, staticPlot: false });
    node.dataset.points = String(ts.length);
  }

  function setCell(row, field, text, cls) {
    const cell = row.querySelector(`[data-field="${field}"]`);
    if (!cell) return;
    cell.textContent = text;
    if (cls !== undefined) cell.className = cls;
  }

  // A job deleted since the page loaded: its row kept its last figures, "running", for as long
  // as the page stayed open. It now says "deleted", its figures and sparkline emptied.
  function markDeleted(row) {
    if (row.dataset.deleted) return;
    row.dataset.deleted = "true";
    row.querySelector('[data-field="status"]').innerHTML = '<span class="badge muted">deleted</span>';
    for (const field of ["hosts", "throughput", "idle", "tuning"]) setCell(row, field, "–");
    const spark = row.querySelector(".sparkline");
    if (spark) { Plotly.purge(spark); spark.dataset.points = "0"; }
  }

  async function tick() {
    const [summary, alerts] = await all([api("/dashboard/api/jobs/"), api("/dashboard/api/alerts/")]);
    const listed = new Set(summary.jobs.map((job) => String(job.id)));
    for (const row of document.querySelectorAll("tr[data-job-id]")) {
      if (!listed.has(row.dataset.jobId)) markDeleted(row);
    }
    for (const job of summary.jobs) {
      const row = document.querySelector(`tr[data-job-id="${job.id}"]`);
      if (!row) continue; // a job created since the page loaded shows on the next visit
      const [status, cls] = jobStatus(job);
      const cell = row.querySelector('[data-field="status"]');
      cell.innerHTML = `<span class="badge ${cls}">${status}</span>`;
      const parts = [`${job.hosts_online} online`, `${job.hosts_offline} offline`];
      if (job.hosts_new) parts.push(`${job.hosts_new} new`);
      setCell(row, "hosts", parts.join(" · "));
      setCell(row, "throughput", job.throughput === null ? "–" : `${fmt.rate(job.throughput)}`, "num");
      setCell(row, "idle", fmt.pct(job.idle_fraction), `num ${job.idle_fraction > 0.5 ? "bad-text" : ""}`);
      const tuning = job.tuning === "running" ? `running on ${job.tuning_sessions} host${job.tuning_sessions === 1 ? "" : "s"}` : "stopped";
      setCell(row, "tuning", job.overrides ? `${tuning} · ${job.overrides} overridden` : tuning);
      sparkline(job);
    }
    renderAlerts(document.getElementById("alerts"), alerts.alerts);
  }

  new Live(tick, settings.refreshMs || 1000).now();
})();
