// The dashboard: polls the leader's admin endpoints about once a second and redraws.
//
// Everything shown comes from this origin's REST API with the operator's key (kept in
// sessionStorage, so it is gone with the tab). Text from the API (ids, errors, payloads) is
// only ever set with textContent, never parsed as HTML.

import { LineChart } from "./charts.js";

const KEY_STORAGE = "dispatch.apiKey";
const POLL_MS = 1000;
const HISTORY_WINDOW_S = 300;
const LIST_LIMIT = 50;
// The tenants' figures come from the Delta statistics (a roll-up of minutes): reading them
// every second would cost the node a table read a second for nothing new.
const TENANTS_EVERY_MS = 10000;
const TENANTS_MINUTES = 15;

const $ = (id) => document.getElementById(id);

const state = {
  key: sessionStorage.getItem(KEY_STORAGE),
  timer: null,
  running: false,
  refreshing: false,
  history: [],
  lastPointT: null,
  clockOffsetS: 0, // server clock - browser clock, for "3 s ago" that ignores skew
  lookupId: null,
  tenantsAt: 0, // when the tenants were last asked for (browser ms)
};

class ApiError extends Error {
  constructor(status, body) {
    super(body?.detail || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error;
    this.body = body;
  }
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.key}` };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  // A follower redirects /v1 to the leader, another origin: the page does not follow (its
  // Content-Security-Policy would refuse anyway) and says where the leader is instead.
  const response = await fetch(path, { ...options, headers, cache: "no-store", redirect: "manual" });
  if (response.type === "opaqueredirect") throw new ApiError(307, { error: "not_leader" });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

// --- time and text ------------------------------------------------------------------------

const serverNow = () => Date.now() / 1000 + state.clockOffsetS;

function ago(t) {
  if (typeof t !== "number") return "–";
  return `${duration(serverNow() - t)} ago`;
}

function until(t) {
  if (typeof t !== "number") return "–";
  const left = t - serverNow();
  return left >= 0 ? `in ${duration(left)}` : `${duration(-left)} late`;
}

function duration(seconds) {
  const s = Math.max(0, seconds);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 90) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function shortId(id) {
  return id.length > 18 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id;
}

function statusBadge(status) {
  const badge = document.createElement("span");
  badge.className = "status";
  badge.dataset.status = status;
  badge.textContent = status;
  return badge;
}

// --- tables -------------------------------------------------------------------------------

// A column: `text(item)` (a string), or `render(cell, item)` for cells with elements. Rows are
// kept by key and updated in place, so a button does not vanish under the pointer every second.
function syncRows(table, items, key, columns) {
  const body = table.tBodies[0];
  const existing = new Map();
  for (const row of [...body.rows]) {
    if (row.dataset.key === undefined) row.remove(); // the "none" placeholder
    else existing.set(row.dataset.key, row);
  }
  let cursor = body.firstElementChild;
  for (const item of items) {
    const rowKey = key(item);
    let row = existing.get(rowKey);
    if (row === undefined) {
      row = document.createElement("tr");
      row.dataset.key = rowKey;
      for (const column of columns) {
        const cell = document.createElement("td");
        if (column.className) cell.className = column.className;
        row.append(cell);
      }
    } else {
      existing.delete(rowKey);
    }
    columns.forEach((column, index) => {
      const cell = row.cells[index];
      if (column.render) {
        column.render(cell, item);
      } else {
        const text = column.text(item) ?? "";
        if (cell.textContent !== text) cell.textContent = text;
        if (column.title) cell.title = column.title(item) ?? "";
      }
    });
    if (row === cursor) cursor = cursor.nextElementSibling;
    else body.insertBefore(row, cursor);
  }
  for (const row of existing.values()) row.remove();
  if (items.length === 0) {
    const row = document.createElement("tr");
    row.className = "empty";
    const cell = document.createElement("td");
    cell.colSpan = columns.length;
    cell.textContent = "none";
    row.append(cell);
    body.append(row);
  }
}

function renderStatus(cell, item) {
  if (cell.firstChild?.dataset?.status !== item.status) cell.replaceChildren(statusBadge(item.status));
}

const jobIdColumn = {
  className: "id",
  text: (job) => shortId(job.id),
  title: (job) => job.id,
};

// --- panels -------------------------------------------------------------------------------

// The leader's routing rule (NATS subjects): `*` is one token, `>` one or more at the end.
function subjectMatches(pattern, subject) {
  for (let index = 0; index < pattern.length; index++) {
    if (pattern[index] === ">") return index < subject.length;
    if (index >= subject.length) return false;
    if (pattern[index] !== "*" && pattern[index] !== subject[index]) return false;
  }
  return pattern.length === subject.length;
}

// Whether a connected worker takes jobs of `exec`; null when the workers are not known.
function served(exec, workers) {
  if (!workers) return null;
  const subject = `job.assign.${exec}`.split(".");
  return workers.some((worker) => worker.subjects.some((pattern) => subjectMatches(pattern.split("."), subject)));
}

const UNSERVED = "no worker serves this exec now: its jobs wait until one does";
const PAUSED = "paused: nothing new starts until it is resumed (running jobs go on)";

function pausedBadge() {
  const badge = document.createElement("span");
  badge.className = "paused-badge";
  badge.textContent = "paused";
  badge.title = PAUSED;
  return badge;
}

function showQueues(queues, workers) {
  $("queues-count").textContent = `(${queues.length})`;
  const deepest = Math.max(1, ...queues.map((queue) => queue.ready + queue.delayed + queue.running));
  syncRows($("queues"), queues, (queue) => queue.exec, [
    {
      render(cell, queue) {
        // A queue nobody serves only grows: marked, so it is not mistaken for a slow one.
        const unserved = served(queue.exec, workers) === false;
        const paused = queue.paused === true;
        cell.closest("tr").classList.toggle("unserved", unserved);
        cell.closest("tr").classList.toggle("paused", paused);
        const shown = `${queue.exec}|${unserved}|${paused}`;
        if (cell.dataset.shown !== shown) {
          cell.dataset.shown = shown;
          const name = document.createElement("span");
          name.textContent = queue.exec;
          cell.replaceChildren(name);
          if (paused) cell.append(" ", pausedBadge());
          if (unserved) {
            const badge = document.createElement("span");
            badge.className = "unserved-badge";
            badge.textContent = "no worker";
            badge.title = UNSERVED;
            cell.append(" ", badge);
          }
        }
        cell.title = paused ? PAUSED : unserved ? UNSERVED : "";
      },
    },
    { className: "num", text: (queue) => String(queue.ready) },
    { className: "num", text: (queue) => String(queue.delayed) },
    { className: "num", text: (queue) => String(queue.running) },
    {
      className: "bar-cell",
      render(cell, queue) {
        if (!cell.firstChild) {
          const bar = document.createElement("div");
          bar.className = "bar";
          for (const part of ["ready", "delayed", "running"]) {
            const segment = document.createElement("span");
            segment.className = `bar-${part}`;
            bar.append(segment);
          }
          cell.append(bar);
        }
        const segments = cell.firstChild.children;
        ["ready", "delayed", "running"].forEach((part, index) => {
          segments[index].style.width = `${(100 * queue[part]) / deepest}%`;
        });
        cell.title = `${queue.ready} ready, ${queue.delayed} delayed, ${queue.running} running`;
      },
    },
  ]);
}

function showWorkers(workers) {
  $("workers-count").textContent = `(${workers.length})`;
  $("total-workers").textContent = String(workers.length);
  syncRows($("workers"), workers, (worker) => worker.worker_id, [
    { className: "id", text: (worker) => worker.worker_id },
    { text: (worker) => worker.subjects.join(", ") },
    { className: "num", text: (worker) => String(worker.credit) },
    { className: "num", text: (worker) => String(worker.running.length) },
    { text: (worker) => ago(worker.last_seen) },
  ]);
}

function showTotals(counts) {
  for (const status of ["queued", "running", "succeeded", "dead", "cancelled", "expired"]) {
    $(`total-${status}`).textContent = String(counts[status] ?? 0);
  }
}

function showInFlight(inFlight) {
  const shown = inFlight.jobs.length;
  $("inflight-count").textContent =
    shown < inFlight.total ? `(${shown} of ${inFlight.total})` : `(${inFlight.total})`;
  syncRows($("inflight"), inFlight.jobs, (job) => job.id, [
    jobIdColumn,
    { text: (job) => job.exec },
    { text: (job) => job.client_id },
    { className: "id", text: (job) => job.worker_id ?? "–" },
    { className: "num", text: (job) => `${job.attempts} / ${job.max_attempts}` },
    { text: (job) => until(job.deadline) },
    { className: "error", text: (job) => job.error ?? "", title: (job) => job.error ?? "" },
  ]);
}

async function redrive(button, jobId) {
  button.disabled = true;
  button.textContent = "Redriving…";
  try {
    const job = await api(`/v1/dlq/${encodeURIComponent(jobId)}/redrive`, { method: "POST" });
    toast(`Redriven ${jobId}: ${job.status}`, "ok");
    button.textContent = "Redriven"; // the row leaves the table with the next refresh
    refreshNow();
  } catch (error) {
    toast(`Redrive of ${jobId} failed: ${error.message}`, "error");
    button.disabled = false;
    button.textContent = "Redrive";
  }
}

const CANCELLABLE = new Set(["queued", "retrying", "running"]);

// `{done, total, message, at}` as "30 / 120 (25 %) resizing, 2 s ago".
function progressText(progress) {
  const share = progress.total ? ` (${Math.floor((100 * progress.done) / progress.total)} %)` : "";
  const count = progress.total == null ? `${progress.done}` : `${progress.done} / ${progress.total}`;
  const message = progress.message ? ` ${progress.message}` : "";
  return `${count}${share}${message}, ${ago(progress.at)}`;
}

function cancelButton(jobId) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "cancel";
  button.dataset.action = "cancel";
  button.textContent = "Cancel";
  button.addEventListener("click", async () => {
    button.disabled = true;
    button.textContent = "Cancelling…";
    try {
      const job = await api(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`, {
        method: "POST",
        body: JSON.stringify({ reason: "cancelled from the dashboard" }),
      });
      toast(`Cancelled ${jobId}: ${job.status}`, "ok");
      showLookup();
    } catch (error) {
      toast(`Cancel of ${jobId} failed: ${error.message}`, "error");
      button.disabled = false;
      button.textContent = "Cancel";
    }
  });
  return button;
}

function showDeadLetters(jobs) {
  $("dlq-count").textContent = jobs.length >= LIST_LIMIT ? `(first ${jobs.length})` : `(${jobs.length})`;
  syncRows($("dlq"), jobs, (job) => job.id, [
    jobIdColumn,
    { text: (job) => job.exec },
    { text: (job) => job.client_id },
    { text: (job) => job.dead_reason ?? "–" },
    { className: "num", text: (job) => `${job.attempts} / ${job.max_attempts}` },
    { className: "error", text: (job) => job.error ?? "", title: (job) => job.error ?? "" },
    { text: (job) => ago(job.updated_at) },
    {
      className: "action",
      render(cell, job) {
        const since = String(job.updated_at);
        let button = cell.firstChild;
        if (button && button.dataset.deadSince === since) return;
        // New, or dead again since the last redrive (within one refresh): a fresh button.
        button = document.createElement("button");
        button.type = "button";
        button.className = "redrive";
        button.dataset.action = "redrive";
        button.dataset.jobId = job.id;
        button.dataset.deadSince = since;
        button.textContent = "Redrive";
        button.addEventListener("click", () => redrive(button, job.id));
        cell.replaceChildren(button);
      },
    },
  ]);
}

function showFailures(jobs) {
  syncRows($("failures"), jobs, (job) => job.id, [
    jobIdColumn,
    { text: (job) => job.exec },
    { render: renderStatus },
    { className: "num", text: (job) => `${job.attempts} / ${job.max_attempts}` },
    {
      className: "error",
      text: (job) => job.error || job.dead_reason || "",
      title: (job) => job.error ?? "",
    },
    { text: (job) => ago(job.updated_at) },
  ]);
}

function showFinished(jobs) {
  syncRows($("finished"), jobs, (job) => job.id, [
    jobIdColumn,
    { text: (job) => job.exec },
    { render: renderStatus },
    { className: "id", text: (job) => job.worker_id ?? "–" },
    { text: (job) => duration(job.updated_at - job.submitted_at) },
    { text: (job) => ago(job.updated_at) },
  ]);
}

function waitText(seconds) {
  return typeof seconds === "number" ? duration(seconds) : "–";
}

function showTenants(listing) {
  const tenants = listing.tenants;
  const breaching = tenants.filter((tenant) => tenant.breaches > 0).length;
  $("tenants-count").textContent = breaching ? `(${tenants.length}, ${breaching} over target)` : `(${tenants.length})`;
  $("tenants-window").textContent = `queue waits against each client's target, last ${listing.minutes} min`;
  // Clients over their target first, most breaches first; the rest by id.
  const ordered = [...tenants].sort((a, b) => b.breaches - a.breaches || (a.client_id < b.client_id ? -1 : 1));
  const overTarget = (tenant, seconds) => typeof seconds === "number" && seconds > tenant.wait_target_s;
  const wait = (key) => ({
    className: "num",
    render(cell, tenant) {
      const text = waitText(tenant[key]);
      if (cell.textContent !== text) cell.textContent = text;
      cell.classList.toggle("over", overTarget(tenant, tenant[key]));
    },
  });
  syncRows($("tenants"), ordered, (tenant) => tenant.client_id, [
    {
      className: "id",
      render(cell, tenant) {
        // A paused client starts nothing new: marked, so its growing queue is not a mystery;
        // and so is a limited one, with its limit.
        const limit = tenant.limit ?? null;
        const key = `${tenant.client_id}|${tenant.paused}|${limit ? `${limitText(limit)}|${limit.source}` : ""}`;
        if (cell.dataset.key !== key) {
          cell.dataset.key = key;
          const name = document.createElement("span");
          name.textContent = tenant.client_id;
          cell.replaceChildren(name);
          if (tenant.paused) cell.append(" ", pausedBadge());
          if (limit) cell.append(" ", limitBadge(limit));
        }
        cell.title = tenant.execs.map((row) => `${row.exec}: ${row.breaches} breaches of ${row.queue_wait_n}`).join("\n");
      },
    },
    { className: "num", text: (tenant) => String(tenant.queued) },
    { className: "num", text: (tenant) => String(tenant.running) },
    { className: "num", text: (tenant) => String(tenant.submitted) },
    { className: "num", text: (tenant) => String(tenant.completed) },
    { className: "num", text: (tenant) => String(tenant.dead) },
    wait("queue_wait_p50_s"),
    wait("queue_wait_p95_s"),
    wait("queue_wait_p99_s"),
    { className: "num", text: (tenant) => duration(tenant.wait_target_s) },
    {
      className: "num breaches",
      render(cell, tenant) {
        const text = String(tenant.breaches);
        if (cell.textContent !== text) cell.textContent = text;
        cell.closest("tr").dataset.breaching = tenant.breaches > 0 ? "yes" : "no";
        cell.title = `${tenant.breaches} of ${tenant.queue_wait_n} waits over ${duration(tenant.wait_target_s)}`;
      },
    },
  ]);
}

// A limit's knobs as "≤ 10 running · 50/s (burst 100)"; "–" for a knob it does not set.
function limitText(limit) {
  const parts = [];
  if (limit.max_inflight != null) parts.push(`≤ ${limit.max_inflight} running`);
  if (limit.rate != null) parts.push(`${limit.rate}/s (burst ${limit.burst ?? "–"})`);
  return parts.join(" · ");
}

function limitBadge(limit) {
  const badge = document.createElement("span");
  badge.className = "limit-badge";
  badge.dataset.source = limit.source;
  badge.textContent = limitText(limit);
  badge.title = `limit (${limit.source}): ${limitText(limit)}`;
  return badge;
}

const knob = (value) => (value == null ? "–" : String(value));

function showLimits(limits) {
  $("limits-count").textContent = `(${limits.length})`;
  syncRows($("limits"), limits, (limit) => `${limit.scope}|${limit.target}`, [
    { text: (limit) => limit.scope },
    { className: "id", text: (limit) => limit.target, title: (limit) => limit.target },
    { className: "num", text: (limit) => knob(limit.max_inflight) },
    { className: "num", text: (limit) => knob(limit.rate) },
    { className: "num", text: (limit) => knob(limit.burst) },
    { className: "num", text: (limit) => knob(limit.inflight) },
    {
      className: "num held",
      render(cell, limit) {
        const text = String(limit.held);
        if (cell.textContent !== text) cell.textContent = text;
        cell.closest("tr").classList.toggle("holding", limit.held > 0);
        cell.title = `${limit.held} queued job(s) wait for this limit`;
      },
    },
    {
      text: (limit) => limit.source,
      title: (limit) => (limit.source === "runtime" ? `set ${ago(limit.at)}` : "from the settings"),
    },
    { text: (limit) => limit.by ?? "–" },
    { className: "error", text: (limit) => limit.reason ?? "", title: (limit) => limit.reason ?? "" },
  ]);
}

function showLeader(leader, overview) {
  const box = $("leader");
  $("node-address").textContent = leader?.node ?? overview?.node ?? "–";
  if (leader) {
    $("leader-address").textContent = leader.leader ?? "none ready";
    box.dataset.state = leader.is_leader ? "leader" : leader.leader ? "follower" : "none";
  }
  const epoch = leader?.epoch ?? overview?.epoch;
  $("leader-epoch").textContent = epoch === null || epoch === undefined ? "–" : String(epoch);
}

// --- charts -------------------------------------------------------------------------------

const charts = {};

function makeCharts() {
  charts.throughput = new LineChart($("chart-throughput"), $("legend-throughput"), {
    windowS: HISTORY_WINDOW_S,
    series: [
      { key: "enqueued", label: "enqueued", color: "#6b7fd7" },
      { key: "completed", label: "completed", color: "#2e9e6a" },
      { key: "requeued", label: "retried", color: "#e0a030" },
      { key: "dead", label: "dead", color: "#d64545" },
    ],
  });
  charts.latency = new LineChart($("chart-latency"), $("legend-latency"), {
    windowS: HISTORY_WINDOW_S,
    scale: 1000,
    series: [
      { key: "dispatch_p50", label: "dispatch p50", color: "#6b7fd7" },
      { key: "dispatch_p95", label: "dispatch p95", color: "#9b59b6" },
      { key: "dispatch_p99", label: "dispatch p99", color: "#c0392b" },
      { key: "commit_p95", label: "commit p95", color: "#2e9e6a" },
    ],
  });
  charts.backlog = new LineChart($("chart-backlog"), $("legend-backlog"), {
    windowS: HISTORY_WINDOW_S,
    series: [
      { key: "queued", label: "queued", color: "#6b7fd7" },
      { key: "in_flight", label: "running", color: "#2e9e6a" },
    ],
  });
}

function addHistory(points) {
  // Two refreshes in flight at once ask with the same `since`: keep each point once.
  const fresh = points.filter((point) => state.lastPointT === null || point.t > state.lastPointT);
  if (fresh.length) {
    state.history.push(...fresh);
    state.lastPointT = fresh[fresh.length - 1].t;
  }
  const start = serverNow() - HISTORY_WINDOW_S - 5;
  while (state.history.length && state.history[0].t < start) state.history.shift();
  const last = state.history[state.history.length - 1];
  $("total-rate").textContent = last ? last.completed.toFixed(last.completed < 10 ? 1 : 0) : "–";
}

function drawCharts() {
  const now = serverNow();
  for (const chart of Object.values(charts)) chart.draw(state.history, now);
}

// --- job look-up --------------------------------------------------------------------------

async function showLookup() {
  const result = $("lookup-result");
  if (!state.lookupId) {
    result.hidden = true;
    return;
  }
  let rows;
  try {
    const job = await api(`/v1/jobs/${encodeURIComponent(state.lookupId)}`);
    rows = [
      ["id", job.id],
      ["status", statusBadge(job.status)],
      ["exec", job.exec],
      ["client", job.client_id],
      ["attempts", `${job.attempts} / ${job.max_attempts}`],
      ["worker", job.worker_id ?? "–"],
      // A retrying job: when its next attempt may start (null: as soon as a worker is free).
      ...(job.status === "retrying"
        ? [["next attempt", job.next_attempt_at == null ? "when a worker is free" : until(job.next_attempt_at)]]
        : []),
      ...(job.expires_at == null ? [] : [["expires", until(job.expires_at)]]),
      // The hard time limit of each attempt; while one runs, when it is stopped.
      ...(job.max_run_s == null
        ? []
        : [["time limit", job.run_limit_at == null ? `${job.max_run_s} s an attempt` : `${job.max_run_s} s, stops ${until(job.run_limit_at)}`]]),
      ...(job.cancel_requested_at == null ? [] : [["cancel asked", ago(job.cancel_requested_at)]]),
      ...(job.progress == null ? [] : [["progress", progressText(job.progress)]]),
      ...(job.key == null ? [] : [["key", job.key]]),
      ["submitted", ago(job.submitted_at)],
      ["updated", ago(job.updated_at)],
      ["error", job.error ?? "–"],
      ["dead reason", job.dead_reason ?? "–"],
      ["payload", JSON.stringify(job.payload)],
      ["result", JSON.stringify(job.result)],
    ];
    result.dataset.status = job.status;
    if (CANCELLABLE.has(job.status)) rows.push(["action", cancelButton(job.id)]);
  } catch (error) {
    if (error.status === 401 || error.status === 403) throw error;
    rows = [["error", error.status === 404 ? `no job ${state.lookupId}` : error.message]];
    result.dataset.status = "missing";
  }
  result.replaceChildren(
    ...rows.flatMap(([label, value]) => {
      const term = document.createElement("dt");
      term.textContent = label;
      const detail = document.createElement("dd");
      detail.dataset.field = label;
      if (value instanceof Node) detail.append(value);
      else detail.textContent = value;
      return [term, detail];
    }),
  );
  result.hidden = false;
}

// --- status line, notices, toasts ---------------------------------------------------------

function setConnection(kind, text) {
  const line = $("connection");
  line.dataset.state = kind;
  line.textContent = text;
}

function setNotice(text) {
  const notice = $("notice");
  notice.hidden = !text;
  notice.textContent = text ?? "";
}

function toast(text, kind) {
  const item = document.createElement("p");
  item.className = `toast toast-${kind}`;
  item.textContent = text;
  $("toasts").append(item);
  setTimeout(() => item.remove(), 6000);
}

// --- the refresh loop ---------------------------------------------------------------------

function authFailed(error) {
  if (error.status === 401) {
    forgetKey();
    setNotice("The API key was refused (unknown key): enter an admin key.");
    return true;
  }
  if (error.status === 403) {
    stopPolling();
    setConnection("error", "forbidden");
    setNotice("This key may not read the dashboard: it needs the admin role.");
    return true;
  }
  return false;
}

async function refresh() {
  if (!state.key) return;
  const since = state.lastPointT === null ? "" : `&since=${state.lastPointT}`;
  const tenantsDue = Date.now() - state.tenantsAt >= TENANTS_EVERY_MS;
  if (tenantsDue) state.tenantsAt = Date.now();
  const calls = await Promise.allSettled([
    api("/v1/leader"),
    api("/v1/queues"),
    api("/v1/workers"),
    api(`/v1/dlq?limit=${LIST_LIMIT}`),
    api(`/v1/overview?limit=${LIST_LIMIT}${since}`),
    tenantsDue ? api(`/v1/tenants?minutes=${TENANTS_MINUTES}`) : Promise.resolve(null),
    api("/v1/limits"),
  ]);
  const [leader, queues, workers, deadLetters, overview, tenants, limits] = calls.map((call) =>
    call.status === "fulfilled" ? call.value : null,
  );
  // A failed read is asked for again at the next refresh, not in ten seconds.
  if (tenantsDue && tenants === null) state.tenantsAt = 0;
  const errors = calls.filter((call) => call.status === "rejected").map((call) => call.reason);
  for (const error of errors) if (authFailed(error)) return;

  if (overview) {
    state.clockOffsetS = overview.server_time - Date.now() / 1000;
    showTotals(overview.counts);
    showInFlight(overview.in_flight);
    showFailures(overview.recent_failures);
    showFinished(overview.recently_finished);
    addHistory(overview.history);
  }
  showLeader(leader, overview);
  if (queues) showQueues(queues.queues, workers?.workers);
  if (workers) showWorkers(workers.workers);
  if (deadLetters) showDeadLetters(deadLetters.jobs);
  if (tenants) showTenants(tenants);
  if (limits) showLimits(limits.limits);
  drawCharts();
  try {
    await showLookup();
  } catch (error) {
    if (authFailed(error)) return;
  }

  if (errors.length === 0) {
    setConnection("live", `live · ${new Date().toLocaleTimeString()}`);
    setNotice(null);
  } else {
    const first = errors[0];
    if (first.status === 307 || first.code === "not_leader") {
      const where = leader?.leader ? ` The leader is ${leader.leader}.` : "";
      setNotice(`This node is not the leader: open the dashboard on the leader.${where}`);
    } else if (first.status === 503) {
      setNotice("No leader is ready on this node yet (failover or start-up); retrying.");
    } else if (first instanceof ApiError) {
      setNotice(`The API answered ${first.status}: ${first.message}`);
    } else {
      setNotice("The API is unreachable; retrying.");
    }
    setConnection("error", `error · ${new Date().toLocaleTimeString()}`);
  }
}

async function tick() {
  state.timer = null;
  // One refresh at a time: the one in progress schedules the next when it ends.
  if (!state.running || state.refreshing) return;
  state.refreshing = true;
  try {
    // A hidden tab polls nothing: the history keeps filling on the server meanwhile.
    if (document.visibilityState !== "hidden") await refresh();
  } catch (error) {
    setConnection("error", "error");
    setNotice(`The dashboard failed to refresh: ${error.message}`);
  } finally {
    state.refreshing = false;
  }
  // Scheduled after the refresh finished, so a slow leader never piles up requests.
  if (state.running && state.timer === null) state.timer = setTimeout(tick, POLL_MS);
}

/** Refresh now instead of at the next tick (after a redrive, on becoming visible). */
function refreshNow() {
  if (state.timer !== null) clearTimeout(state.timer);
  state.timer = null;
  tick();
}

function startPolling() {
  state.running = true;
  state.tenantsAt = 0;
  document.body.dataset.auth = "set";
  setConnection("connecting", "connecting…");
  refreshNow();
}

function stopPolling() {
  state.running = false;
  if (state.timer !== null) clearTimeout(state.timer);
  state.timer = null;
}

function forgetKey() {
  stopPolling();
  sessionStorage.removeItem(KEY_STORAGE);
  state.key = null;
  document.body.dataset.auth = "none";
  setConnection("idle", "not connected");
  $("api-key").focus();
}

function init() {
  makeCharts();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) {
      setNotice("Enter an API key (an admin key: `dispatch keys --role admin`).");
      return;
    }
    $("api-key").value = "";
    sessionStorage.setItem(KEY_STORAGE, key);
    state.key = key;
    setNotice(null);
    startPolling();
  });
  $("key-forget").addEventListener("click", forgetKey);
  $("lookup-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.lookupId = $("lookup-id").value.trim() || null;
    showLookup().catch(authFailed);
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.running) refreshNow();
  });
  window.addEventListener("resize", drawCharts);
  if (state.key) startPolling();
  else $("api-key").focus();
}

init();
