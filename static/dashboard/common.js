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
  // Every request has a deadline (InTune.requestTimeoutMs): a control plane that accepts the
  // connection and never answers, or a network that drops the packets, would otherwise hold the
  // live refresh, waiting for it, for good while the page went on showing "Live".
  // No answer at all (the server down or restarting, the connection reset, the deadline) is an
  // ApiError of status 0, with the same words in every engine: fetch's own TypeError says
  // "Failed to fetch" in Chromium, "NetworkError when attempting to fetch resource." in Firefox
  // and "Load failed" in WebKit. The answer's body is read whole before it is parsed, so that a
  // connection cut mid-answer fails the request instead of handing the page a null.
  async function api(url, { method = "GET", body } = {}) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
    const timeoutMs = window.InTune.requestTimeoutMs;
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), timeoutMs);
    const unanswered = (error) => new ApiError(0, deadline.signal.aborted
      ? `${method} ${url} had no answer within ${timeoutMs / 1000} s`
      : `${method} ${url}: the control plane could not be reached (${error && error.message})`);
    try {
      let response, text;
      try {
        response = await fetch(url, {
          method, headers, credentials: "same-origin", signal: deadline.signal,
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        text = await response.text();
      } catch (error) {
        throw unanswered(error);
      }
      if (deadline.signal.aborted) throw unanswered(null);
      if (response.status === 204) return null;
      let payload = null;
      try { payload = JSON.parse(text); } catch (_) { /* an HTML error page, or a login page */ }
      if (!response.ok) {
        const detail = (payload && payload.detail) || `${method} ${url} answered ${response.status}`;
        throw new ApiError(response.status, detail);
      }
      if (payload === null) {
        // A proxy's page or the login form, answered 200 where JSON was asked for.
        throw new ApiError(response.status, `${method} ${url} answered ${response.status} without JSON`);
      }
      return payload;
    } finally {
      clearTimeout(timer);
    }
  }

  // Promise.all that waits for every request to end before it fails: Promise.all rejects at the
  // first failure and leaves the others in flight, so a page whose one endpoint failed fast while
  // another was slow started its next refresh over the requests still out, and piled them up.
  async function all(requests) {
    const results = await Promise.allSettled(requests);
    const failed = results.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
    return results.map((r) => r.value);
  }

  // Numbers in the browser's locale, as the dates are: rates were grouped en-US ("1,027
  // samples/s") next to German dates, and a German reader takes 1,027 for one and a bit.
  const number = (v, digits) => Number(v).toLocaleString(undefined, { minimumFractionDigits: digits, maximumFractionDigits: digits });
  // The same marks for Plotly's ticks and hovers: decimal mark, then thousands separator.
  const parts = new Intl.NumberFormat().formatToParts(12345.6);
  const SEPARATORS = ((parts.find((p) => p.type === "decimal") || {}).value || ".")
    + ((parts.find((p) => p.type === "group") || {}).value || ",");

  const fmt = {
    rate(v) {
      if (v === null || v === undefined || Number.isNaN(v)) return "–";
      if (Math.abs(v) >= 1e6) return `${number(v / 1e6, 2)} M samples/s`;
      return `${Number(v).toLocaleString(undefined, { maximumFractionDigits: v < 10 ? 1 : 0 })} samples/s`;
    },
    pct(v) { return v === null || v === undefined ? "–" : `${number(v * 100, 1)} %`; },
    num(v, digits = 2) { return v === null || v === undefined ? "–" : number(v, digits); },
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
      separators: SEPARATORS,
      uirevision,
      paper_bgcolor: "#ffffff",
      plot_bgcolor: "#ffffff",
    }, extra);
  }

  const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  // Plotly reads a trace's name as HTML of its own (<b>, <br>, and <a href> as a link that opens
  // a new tab): a job named '<a href="https://…">…</a>' put that link in the legend of every
  // viewer's comparison chart, and "R&D <team>" lost its "<team>". Names go in escaped, and
  // Plotly shows them as they were typed; the exports undo the escape.
  function draw(id, traces, chartLayout) {
    const node = document.getElementById(id);
    if (!node) return;
    const named = traces.map((t) => (t.name === undefined ? t : { ...t, name: plotlyText(t.name) }));
    Plotly.react(node, named, chartLayout, PLOT_CONFIG);
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
      trace.x.forEach((x, i) => rows.push({ series: unescapeHtml(trace.name || ""), x, y: trace.y ? trace.y[i] : null }));
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
        name: unescapeHtml(t.name || ""), x: t.x.map((v) => (v instanceof Date ? v.toISOString() : v)), y: t.y || [],
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

  // A page being left (a link followed, another address typed, the tab closed): every engine
  // ends the requests it has in flight and hands their failure to the page before it goes,
  // Firefox and WebKit between beforeunload and pagehide, Chromium between pagehide and unload
  // (measured 2026-11-30). Such a failure is no news to anyone: reported, it put "TypeError:
  // NetworkError when attempting to fetch resource." in Firefox's console at every navigation
  // made during a refresh (2 of 25 on a loaded host), which failed the phone-size test. A
  // failure within LEAVING_MS of either event is kept quiet; a page that stays (a download
  // link fires beforeunload too) reports the next one.
  const LEAVING_MS = 10000;
  let leftAt = null;
  const markLeaving = () => { leftAt = Date.now(); };
  window.addEventListener("beforeunload", markLeaving);
  window.addEventListener("pagehide", markLeaving);
  window.addEventListener("pageshow", () => { leftAt = null; });
  const leaving = () => leftAt !== null && Date.now() - leftAt < LEAVING_MS;

  // Calls `tick` every `periodMs` while not paused; one call at a time, so a slow answer never
  // piles requests up. The Pause button and a hidden tab both stop it. While refreshes fail (the
  // control plane restarts, the network is away) the wait doubles after each failure, up to
  // `maxBackoffMs`; the page says it is reconnecting and how old its data is, and a retry first
  // asks `probe` (one small request) whether the control plane answers again, rather than
  // sending a whole refresh's requests into a server that is away (each one a line in
  // Chromium's console). The first refresh that succeeds resumes the period, and the browser
  // coming back online tries at once. A control plane that cannot be reached, or answers with
  // an error, is shown on the page and told in the console once, as a warning; an error of the
  // page's own (a bug in drawing an answer) is a console error, once a run of failures.
  class Live {
    constructor(tick, periodMs, { maxBackoffMs = 15000, probe = () => api("/healthz"), gone = null } = {}) {
      this.tick = tick;
      // gone(error): what to say when the error means the page's subject was deleted (a 404),
      // or null; the page then stops refreshing instead of retrying for as long as it is open.
      this.gone = gone;
      this.ended = null;
      this.periodMs = periodMs;
      this.maxBackoffMs = maxBackoffMs;
      this.probe = probe;
      this.paused = false;
      this.running = false;
      this.timer = null;
      this.failures = 0;
      this.failingSince = null;
      this.refreshedAt = null;
      this.lastError = null;
      this.again = false;
      this.root = document.querySelector("[data-live]");
      this.status = this.root && this.root.querySelector("[data-live-status]");
      this.toggle = this.root && this.root.querySelector("[data-live-toggle]");
      if (this.toggle) this.toggle.addEventListener("click", () => this.setPaused(!this.paused));
      // Shown again, a page refreshes at once, unless a person paused it.
      document.addEventListener("visibilitychange", () => { if (!isHidden() && !this.paused) this.now(); });
      window.addEventListener("online", () => { if (!isHidden() && !this.paused) this.now(); });
      // Back from the browser's back-forward cache: its data is as old as the visit.
      window.addEventListener("pageshow", (event) => { if (event.persisted && !this.paused) this.now(); });
    }
    setPaused(paused) {
      this.paused = paused;
      if (this.toggle) {
        this.toggle.textContent = paused ? "Resume" : "Pause";
        this.toggle.setAttribute("aria-pressed", String(paused));
      }
      if (this.root) this.root.classList.toggle("paused", paused);
      if (paused) clearTimeout(this.timer);
      this.showStatus();
      if (!paused) this.now();
    }
    // The wait before the next refresh: the period, or the backoff after failures.
    delayMs() {
      if (!this.failures) return this.periodMs;
      return Math.min(Math.max(this.maxBackoffMs, this.periodMs), this.periodMs * 2 ** this.failures);
    }
    showStatus(error) {
      if (!this.status) return;
      const failing = this.failures > 0;
      if (this.root) this.root.classList.toggle("failing", failing);
      document.body.classList.toggle("stale", failing);
      if (this.paused) {
        this.status.textContent = "Paused";
      } else if (!failing) {
        this.status.textContent = this.refreshedAt ? `Live · ${fmt.time(this.refreshedAt)}` : "Live";
        this.status.removeAttribute("title");
      } else {
        // Paused and resumed while failing, the page says again what it said.
        const shown = error || this.lastError;
        const data = this.refreshedAt ? `data from ${fmt.time(this.refreshedAt)}` : "no data yet";
        const unreachable = shown instanceof ApiError && shown.status === 0;
        // No answer at all says little more than "Reconnecting"; an answer's detail is news.
        const reason = shown && !unreachable ? `: ${shown.message}` : "";
        this.status.textContent = `${unreachable ? "Reconnecting" : "Refresh failed"} since ${fmt.time(this.failingSince)}, `
          + `retrying in ${Math.round(this.delayMs() / 1000)} s · ${data}${reason}`;
        if (shown) this.status.title = shown.message;
      }
    }
    // No more refreshes: the page says why (and offers `link`, an element, after it).
    end(message, link) {
      this.ended = message;
      clearTimeout(this.timer);
      if (this.root) this.root.classList.add("failing", "ended");
      if (this.toggle) this.toggle.disabled = true;
      if (this.status) {
        this.status.replaceChildren(...(link ? [`${message} `, link] : [message]));
        this.status.removeAttribute("title");
      }
      document.body.classList.add("stale");
    }
    // Logged out (the session expired, or ended in another tab): every request would answer
    // 401 until the person logs in again, so the page stops asking and links to the login,
    // which brings the person back here. It used to retry every 15 s for as long as it was open,
    // saying "Refresh failed ...: Authentication credentials were not provided."
    loggedOut() {
      const link = document.createElement("a");
      link.href = `/accounts/login/?next=${encodeURIComponent(location.pathname + location.search + location.hash)}`;
      link.textContent = "Log in again";
      link.dataset.login = "";
      this.end(`Logged out at ${fmt.time(Date.now() / 1000)}; the figures are the last ones shown.`, link);
    }
    async now() {
      if (this.ended) return;
      // Asked while a refresh runs (the browser back online, a form sent), one more runs as soon
      // as it ends: never two at once, and never more than one waiting.
      if (this.running) { this.again = true; return; }
      this.again = false;
      clearTimeout(this.timer);
      this.running = true;
      try {
        if (this.failures && this.probe) await this.probe();
        await this.tick();
        if (this.failures && !leaving()) {
          console.info(`live refresh works again after ${this.failures} failed, since ${fmt.time(this.failingSince)}`);
        }
        this.failures = 0;
        this.failingSince = null;
        this.lastError = null;
        this.refreshedAt = Date.now() / 1000;
        this.showStatus();
      } catch (error) {
        this.failures += 1;
        this.lastError = error;
        if (this.failingSince === null) this.failingSince = Date.now() / 1000;
        const gone = !leaving() && error instanceof ApiError && this.gone && this.gone(error);
        if (!leaving() && error instanceof ApiError && (error.status === 401 || error.status === 403)) {
          console.warn(`live refresh stopped: ${error.message}`);
          this.loggedOut();
        } else if (gone) {
          console.warn(`live refresh stopped: ${error.message}`);
          this.end(gone);
        } else if (!leaving()) {
          // One line in the console a run of failures, not one a retry for hours.
          if (this.failures === 1) {
            if (error instanceof ApiError) console.warn(`live refresh failed, retrying with a backoff: ${error.message}`);
            else console.error(error);
          }
          this.showStatus(error);
        }
      } finally {
        this.running = false;
        // A hidden page schedules nothing: visibilitychange starts it again when it is shown.
        if (!this.paused && !this.ended) this.timer = setTimeout(() => { if (!isHidden() && !this.paused) this.now(); }, this.again ? 0 : this.delayMs());
      }
    }
  }

  // One part of a page that refreshes from its own request (the job page's decisions, its alerts,
  // its charts of measurements): a request that fails or hangs marks its part stale and leaves
  // the others live. One endpoint answering 500 used to fail the whole refresh, and every chart
  // of the page stopped with it. A failing part is asked again after a backoff that doubles up
  // to the page's (live.maxBackoffMs), is told in the console once a run of failures, and says on
  // the page since when its figures are old. It has at most one request out: a hung one is not
  // asked again before its deadline (InTune.requestTimeoutMs) ends it.
  class Section {
    constructor(name, cards, { before = null } = {}) {
      this.name = name;
      this.cards = cards.filter(Boolean);
      this.failures = 0;
      this.failingSince = null;
      this.retryAt = 0;
      this.refreshedAt = null;
      this.out = null;
      this.landed = null;
      this.status = document.createElement("p");
      this.status.className = "section-status";
      this.status.setAttribute("role", "status");
      this.status.hidden = true;
      if (before) before.before(this.status);
      else if (this.cards.length) this.cards[0].prepend(this.status);
    }
    due() { return !this.out && (!this.failures || Date.now() >= this.retryAt); }
    // `request` is under way; its answer (or error) is kept, tagged with `key`, until taken.
    ask(key, request) {
      this.out = request.then((value) => ({ key, value }), (error) => ({ key, error }))
        .then((result) => { this.landed = result; this.out = null; });
      return this.out;
    }
    take() {
      const result = this.landed;
      this.landed = null;
      return result;
    }
    // A new subject (another host): what failed for the last one says nothing of this one.
    reset() {
      this.failures = 0;
      this.failingSince = null;
      this.refreshedAt = null;
      this.landed = null;
      this.show();
    }
    succeeded() {
      if (this.failures && !leaving()) console.info(`${this.name}: refreshed again after ${this.failures} failed`);
      this.failures = 0;
      this.failingSince = null;
      this.refreshedAt = Date.now() / 1000;
      this.show();
    }
    failed(error, live) {
      this.failures += 1;
      if (this.failingSince === null) this.failingSince = Date.now() / 1000;
      const delayMs = Math.min(Math.max(live.maxBackoffMs, live.periodMs), live.periodMs * 2 ** this.failures);
      this.retryAt = Date.now() + delayMs;
      if (this.failures === 1 && !leaving()) {
        if (error instanceof ApiError) console.warn(`${this.name}: refresh failed, retrying with a backoff: ${error.message}`);
        else console.error(error);
      }
      this.show(error, delayMs);
    }
    show(error, delayMs) {
      const failing = this.failures > 0;
      for (const card of this.cards) card.classList.toggle("stale", failing);
      this.status.hidden = !failing;
      if (!failing) {
        this.status.textContent = "";
        return;
      }
      const unreachable = error instanceof ApiError && error.status === 0;
      const data = this.refreshedAt ? `data from ${fmt.time(this.refreshedAt)}` : "no data yet";
      this.status.textContent = `${this.name[0].toUpperCase()}${this.name.slice(1)}: `
        + `${unreachable ? "no answer" : "refresh failed"} since ${fmt.time(this.failingSince)}, `
        + `retrying in ${Math.round(delayMs / 1000)} s · ${data}: ${error && error.message}`;
    }
  }

  // The most alerts listed one by one; the rest are counted by kind in a summary that opens onto
  // them. A rack of 500 hosts falling silent listed 500 alerts, 22,000 px above the charts, and
  // replaced them all in an aria-live region every second.
  const ALERTS_SHOWN = 5;
  const ALERT_KINDS = { silent: "agent silent", throughput_drop: "throughput fell", idle_high: "waiting for input" };

  function alertItem(a) {
    const item = document.createElement("div");
    item.className = `alert ${a.severity}`;
    item.dataset.kind = a.kind;
    item.textContent = a.message;
    return item;
  }

  function renderAlerts(container, alerts) {
    if (!container) return;
    container.alerts = alerts;
    // Unchanged alerts are left alone: a live region announces again whatever is replaced.
    const key = JSON.stringify(alerts.map((a) => a.message));
    const wasOpen = !!(container.querySelector("details") || {}).open;
    if (container.dataset.key === key && container.dataset.open === String(wasOpen)) return;
    container.dataset.key = key;
    container.dataset.open = String(wasOpen);
    const items = alerts.slice(0, ALERTS_SHOWN).map(alertItem);
    const rest = alerts.slice(ALERTS_SHOWN);
    if (rest.length) {
      const counts = {};
      for (const a of rest) counts[a.kind] = (counts[a.kind] || 0) + 1;
      const more = document.createElement("details");
      more.className = "alert-more";
      more.open = wasOpen;
      const summary = document.createElement("summary");
      summary.textContent = `${rest.length} more alert${rest.length === 1 ? "" : "s"}: `
        + Object.entries(counts).map(([kind, n]) => `${n} ${ALERT_KINDS[kind] || kind}`).join(", ");
      more.append(summary);
      // Listed only while open: closed, the page holds five alerts, not five hundred.
      if (wasOpen) more.append(...rest.map(alertItem));
      more.addEventListener("toggle", () => renderAlerts(container, container.alerts));
      items.push(more);
    }
    container.replaceChildren(...items);
  }

  const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const CHARACTERS = Object.fromEntries(Object.entries(ENTITIES).map(([c, e]) => [e, c]));
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ENTITIES[c]);
  }
  // Text for Plotly, which reads <b>, <br>, <a href> and a few more as HTML of its own, and
  // decodes &amp; &lt; &gt; but not &quot;: with no '<' left, no tag can form.
  function plotlyText(s) {
    return String(s).replace(/[&<>]/g, (c) => ENTITIES[c]);
  }
  // The text escapeHtml or plotlyText was given back (a chart's series name, for its export).
  function unescapeHtml(s) {
    return String(s).replace(/&(?:amp|lt|gt|quot|#39);/g, (e) => CHARACTERS[e]);
  }

  // requestTimeoutMs: each request's deadline; sectionWaitMs: how long a refresh waits for its
  // sections' answers before it shows those that came (the others land for the next); a test
  // may shorten either.
  window.InTune = { requestTimeoutMs: 20000, sectionWaitMs: 3000, PALETTE, config, api, all, ApiError, fmt, toDates, layout, draw, Live, Section, renderAlerts, escapeHtml, registerTableExport, toCsv, chartRows, plotlyText, unescapeHtml };
})();
