// Shared by the dashboard's pages: API calls, number formats, chart defaults, CSV/JSON export
// and the live-refresh loop (which a person can pause).
(function () {
  "use strict";

  // Okabe–Ito: distinguishable with the common colour-vision deficiencies, readable on white.
  const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C8C00", "#332288", "#882255", "#44AA99"];

  function config() {
    const node = document.getElementById("dashboard-config");
    return node ? JSON.parse(node.textContent) : {};
  }

  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  // fetch with the session cookie and CSRF token; JSON in and out; errors carry the API's detail.
  async function api(url, { method = "GET", body } = {}) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
    const response = await fetch(url, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 204) return null;
    let payload = null;
    try { payload = await response.json(); } catch (_) { /* an HTML error page */ }
    if (!response.ok) {
      const detail = (payload && payload.detail) || `${method} ${url} answered ${response.status}`;
      throw new ApiError(response.status, detail);
    }
    return payload;
  }

  const fmt = {
    rate(v) {
      if (v === null || v === undefined || Number.isNaN(v)) return "–";
      if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(2)} M samples/s`;
      return `${v.toLocaleString("en-US", { maximumFractionDigits: v < 10 ? 1 : 0 })} samples/s`;
    },
    pct(v) { return v === null || v === undefined ? "–" : `${(v * 100).toFixed(1)} %`; },
    num(v, digits = 2) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); },
    time(ts) { return ts ? new Date(ts * 1000).toLocaleTimeString([], { hour12: false }) : "–"; },
    dateTime(value) {
      if (!value) return "–";
      const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
      return d.toLocaleString([], { hour12: false, month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
    },
    workers(w) { return w ? Object.entries(w).map(([k, v]) => `${k} ${v}`).join(" · ") : "–"; },
  };

  const toDates = (ts) => ts.map((t) => new Date(t * 1000));

  // Every chart: a title, axis titles with units, a legend under the plot, the same font.
  // uirevision keeps a person's zoom, pan and legend choices across live redraws.
  function layout(title, { x = "time", y = "", uirevision = "keep", extra = {} } = {}) {
    return Object.assign({
      title: { text: title, x: 0.01, xanchor: "left", font: { size: 15 } },
      font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12, color: "#1f2933" },
      margin: { l: 64, r: 64, t: 44, b: 40 },
      xaxis: { title: { text: x }, automargin: true, gridcolor: "#e4e7eb" },
      yaxis: { title: { text: y }, automargin: true, rangemode: "tozero", gridcolor: "#e4e7eb" },
      // Below the axis title, which sits under two rows of date ticks.
      legend: { orientation: "h", x: 0, y: -0.3, yanchor: "top" },
      colorway: PALETTE,
      hovermode: "x unified",
      uirevision,
      paper_bgcolor: "#ffffff",
      plot_bgcolor: "#ffffff",
    }, extra);
  }

  const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function draw(id, traces, chartLayout) {
    const node = document.getElementById(id);
    if (!node) return;
    Plotly.react(node, traces, chartLayout, PLOT_CONFIG);
    node.dataset.points = String(traces.reduce((n, t) => n + ((t.x && t.x.length) || 0), 0));
  }

  // --- export ---------------------------------------------------------------------------------
  function download(filename, text, type) {
    const blob = new Blob([text], { type });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = filename;
    document.body.appendChild(link);
    link.click();
    setTimeout(() => { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
  }

  const csvCell = (v) => {
    if (v === null || v === undefined) return "";
    const s = v instanceof Date ? v.toISOString() : String(v);
    return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };

  // `headers` names the columns in the file (e.g. the axis titles), `columns` the row keys.
  function toCsv(columns, rows, headers = columns) {
    return [headers.map(csvCell).join(","), ...rows.map((r) => columns.map((c) => csvCell(r[c])).join(","))].join("\n") + "\n";
  }

  // The data a chart shows: one row per point, with the series' name.
  function chartRows(id) {
    const node = document.getElementById(id);
    const rows = [];
    for (const trace of (node && node.data) || []) {
      if (!trace.x || trace.meta === "decoration") continue;
      trace.x.forEach((x, i) => rows.push({ series: trace.name || "", x, y: trace.y ? trace.y[i] : null }));
    }
    return rows;
  }

  function chartExport(id) {
    const node = document.getElementById(id);
    const title = (node && node.layout && node.layout.title && node.layout.title.text) || id;
    const axis = (a) => (node && node.layout && node.layout[a] && node.layout[a].title && node.layout[a].title.text) || "";
    return {
      title, x: axis("xaxis"), y: axis("yaxis"),
      series: ((node && node.data) || []).filter((t) => t.x && t.meta !== "decoration").map((t) => ({
        name: t.name || "", x: t.x.map((v) => (v instanceof Date ? v.toISOString() : v)), y: t.y || [],
      })),
    };
  }

  const tableExporters = {};
  function registerTableExport(name, fn) { tableExporters[name] = fn; }

  function slug(s) { return String(s).toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, ""); }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-export]");
    if (!button) return;
    const kind = button.dataset.export;
    const stamp = new Date().toISOString().replace(/[:.]/g, "-");
    const prefix = document.body.dataset.exportPrefix || "intune";
    if (button.dataset.table) {
      const { columns, rows } = tableExporters[button.dataset.table]();
      const name = `${prefix}-${button.dataset.table}-${stamp}`;
      if (kind === "csv") download(`${name}.csv`, toCsv(columns, rows), "text/csv");
      else download(`${name}.json`, JSON.stringify(rows, null, 2), "application/json");
      return;
    }
    const id = button.dataset.chartId;
    const name = `${prefix}-${slug(id.replace(/^chart-/, ""))}-${stamp}`;
    if (kind === "csv") {
      const rows = chartRows(id).map((r) => ({ ...r, x: r.x instanceof Date ? r.x.toISOString() : r.x }));
      const { x, y } = chartExport(id);
      download(`${name}.csv`, toCsv(["series", "x", "y"], rows, ["series", x || "x", y || "y"]), "text/csv");
    } else {
      download(`${name}.json`, JSON.stringify(chartExport(id), null, 2), "application/json");
    }
  });

  // --- live refresh ---------------------------------------------------------------------------
  const isHidden = () => document.visibilityState === "hidden";

  // Calls `tick` every `periodMs` while not paused; one call at a time, so a slow answer never
  // piles requests up. The Pause button and a hidden tab both stop it.
  class Live {
    constructor(tick, periodMs) {
      this.tick = tick;
      this.periodMs = periodMs;
      this.paused = false;
      this.running = false;
      this.timer = null;
      this.root = document.querySelector("[data-live]");
      this.status = this.root && this.root.querySelector("[data-live-status]");
      this.toggle = this.root && this.root.querySelector("[data-live-toggle]");
      if (this.toggle) this.toggle.addEventListener("click", () => this.setPaused(!this.paused));
      // Shown again, a page refreshes at once, unless a person paused it.
      document.addEventListener("visibilitychange", () => { if (!isHidden() && !this.paused) this.now(); });
    }
    setPaused(paused) {
      this.paused = paused;
      if (this.toggle) {
        this.toggle.textContent = paused ? "Resume" : "Pause";
        this.toggle.setAttribute("aria-pressed", String(paused));
      }
      if (this.root) this.root.classList.toggle("paused", paused);
      if (this.status) this.status.textContent = paused ? "Paused" : "Live";
      if (!paused) this.now();
    }
    async now() {
      if (this.running) return;
      clearTimeout(this.timer);
      this.running = true;
      try {
        await this.tick();
        if (this.root) this.root.classList.remove("failing");
        if (this.status && !this.paused) this.status.textContent = `Live · ${fmt.time(Date.now() / 1000)}`;
      } catch (error) {
        console.error(error);
        if (this.root) this.root.classList.add("failing");
        if (this.status) this.status.textContent = `Refresh failed: ${error.message}`;
      } finally {
        this.running = false;
        // A hidden page schedules nothing: visibilitychange starts it again when it is shown.
        if (!this.paused) this.timer = setTimeout(() => { if (!isHidden() && !this.paused) this.now(); }, this.periodMs);
      }
    }
  }

  function renderAlerts(container, alerts) {
    if (!container) return;
    container.replaceChildren(...alerts.map((a) => {
      const item = document.createElement("div");
      item.className = `alert ${a.severity}`;
      item.dataset.kind = a.kind;
      item.textContent = a.message;
      return item;
    }));
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  window.InTune = { PALETTE, config, api, ApiError, fmt, toDates, layout, draw, Live, renderAlerts, escapeHtml, registerTableExport, toCsv, chartRows };
})();
