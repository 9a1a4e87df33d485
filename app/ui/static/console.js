// upr console: plain JavaScript, no build step, no library.
// Data: GET /ui/api/overview once a second, GET /events by long polling; the token (if the node
// needs one) travels in the Authorization header and lives in sessionStorage (this tab only).
"use strict";

const POLL_MS = 1000;
const LOST_AFTER_MS = 3500;      // no answer for this long: show "connection lost"
const EVENT_WAIT_S = 20;
const MAX_EVENTS_SHOWN = 500;
const PURGE_WARN_SEQNOS = 1000;  // a consumer this close above the purge seqno is highlighted
const TOKEN_KEY = "upr-console-token";

const S = {
  token: sessionStorage.getItem(TOKEN_KEY),
  overview: null,
  lastOk: 0,
  authFailed: false,
  eventsSince: 0,
  eventsLog: null,
  events: [],
  sort: { key: "partition", dir: 1 },
  openFailover: new Set(),
  page: "overview",
  started: false,
};

// ------------------------------------------------------------------ helpers
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "title" || k === "role" || k === "scope" || k === "colspan") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}
const $ = (sel) => document.querySelector(sel);
const fmtInt = (n) => (n === null || n === undefined) ? "–" : Number(n).toLocaleString("en-US");
function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; n = Number(n) || 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}
function fmtDuration(s) {
  s = Math.floor(s); const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}
const fmtTime = (t) => new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";

class AuthError extends Error {}

async function api(path, { signal, wait } = {}) {
  const headers = { "Accept": "application/json" };
  if (wait) headers["Prefer"] = "wait=" + wait;
  if (S.token) headers["Authorization"] = "Bearer " + S.token;
  const r = await fetch(path, { headers, signal, cache: "no-store", credentials: "omit" });
  if (r.status === 401 || r.status === 403) {
    let detail = "";
    try { detail = (await r.json()).detail || ""; } catch (_) { /* not JSON */ }
    throw new AuthError(detail || ("HTTP " + r.status));
  }
  if (!r.ok) throw new Error("HTTP " + r.status);
  return r.json();
}

// ------------------------------------------------------------------ auth
function showLogin(message) {
  S.authFailed = true;
  S.started = false;  // the loops end on an auth failure; signing in starts them again
  $("#main").hidden = true;
  $("#login").hidden = false;
  const err = $("#login-error");
  err.hidden = !message;
  err.textContent = message || "";
  setConn("auth", "sign-in required");
  $("#token").focus();
}

async function signIn(ev) {
  ev.preventDefault();
  const candidate = $("#token").value.trim();
  if (!candidate) return;
  S.token = candidate;
  try {
    const data = await api("/ui/api/overview");
    sessionStorage.setItem(TOKEN_KEY, candidate);
    $("#token").value = "";
    S.authFailed = false;
    $("#login").hidden = true;
    onOverview(data);
    startLoops();
  } catch (e) {
    S.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (e instanceof AuthError) showLogin("Token refused: " + e.message);
    else showLogin("Cannot reach the node: " + e.message);
  }
}

// ------------------------------------------------------------------ connection state
function setConn(kind, text) {
  const c = $("#conn");
  c.className = "conn " + kind;
  $("#conn-text").textContent = text;
}

function checkLost() {
  if (S.authFailed) return;
  if (Date.now() - S.lastOk > LOST_AFTER_MS) {
    setConn("lost", "connection lost — retrying" + (S.lastOk ? " (last update " + new Date(S.lastOk).toLocaleTimeString() + ")" : ""));
    document.body.classList.add("stale");
  }
}

// ------------------------------------------------------------------ loops
async function pollOverview() {
  const started = Date.now();
  try {
    onOverview(await api("/ui/api/overview", { signal: AbortSignal.timeout(5000) }));
  } catch (e) {
    if (e instanceof AuthError) { S.token = null; sessionStorage.removeItem(TOKEN_KEY); showLogin("Token refused: " + e.message); return; }
  }
  checkLost();
  // a fixed rhythm, not a fixed pause: a slow answer still leaves one update a second
  setTimeout(pollOverview, Math.max(100, POLL_MS - (Date.now() - started)));
}

async function pollEvents() {
  while (!S.authFailed) {
    const started = Date.now();
    try {
      const log = S.eventsLog ? `&log=${encodeURIComponent(S.eventsLog)}` : "";
      const page = await api(`/events?since=${S.eventsSince}${log}`, { wait: EVENT_WAIT_S, signal: AbortSignal.timeout((EVENT_WAIT_S + 10) * 1000) });
      if (page.reset) S.events = [];
      S.eventsSince = page.last_id;
      S.eventsLog = page.log_id;
      if (page.events.length || page.reset) {
        S.events = S.events.concat(page.events).slice(-MAX_EVENTS_SHOWN);
        renderEvents();
      } else {
        // nothing new, answered without waiting (the node lets only so many readers wait):
        // asking again at once would spin, so keep the overview's rhythm
        await new Promise((res) => setTimeout(res, Math.max(0, POLL_MS - (Date.now() - started))));
      }
    } catch (e) {
      if (e instanceof AuthError) return;
      await new Promise((res) => setTimeout(res, POLL_MS));
    }
  }
}

function startLoops() {
  if (S.started) return;
  S.started = true;
  setTimeout(pollOverview, POLL_MS);
  pollEvents();
}

function onOverview(data) {
  S.overview = data;
  S.lastOk = Date.now();
  document.body.classList.remove("stale");
  $("#main").hidden = false;
  setConn("ok", "live · node " + (data.node.length > 16 ? data.node.slice(0, 12) : data.node) + " · updated " + new Date().toLocaleTimeString());
  if (!document.hidden) render();  // a background tab draws when it is shown again
}

// ------------------------------------------------------------------ pages
function showPage() {
  const page = (location.hash || "#overview").slice(1);
  S.page = ["overview", "partitions", "streams", "events"].includes(page) ? page : "overview";
  for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== "page-" + S.page;
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === S.page) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  render();
}

function render() {
  if (!S.overview) return;
  if (S.page === "overview") renderOverview();
  else if (S.page === "partitions") renderPartitions();
  else if (S.page === "streams") renderStreams();
  else renderEvents();
}

// placement per partition in a cluster: {active, replicas: [{node, in_sync, lag}]}
function placements() {
  const c = S.overview.cluster;
  const out = new Map();
  if (c && c.map) for (const p of c.map.partitions) out.set(p.partition, p);
  return out;
}

function renderOverview() {
  const o = S.overview, t = o.totals;
  const hist = o.history;
  const last = (a) => a.length ? a[a.length - 1] : 0;
  const cards = [
    ["Node", o.node.length > 16 ? o.node.slice(0, 12) : o.node],
    ["Uptime", fmtDuration(o.uptime_s)],
    ["Partitions", fmtInt(o.partition_count)],
    ["Items", fmtInt(t.items)],
    ["Mutations/s", fmtInt(Math.round(last(hist.mutations_per_s)))],
    ["Deliveries/s", fmtInt(Math.round(last(hist.deliveries_per_s)))],
    ["Queue memory", fmtBytes(t.queue_bytes) + " of " + fmtBytes(t.queue_memory_limit_bytes)],
    ["Unpersisted", fmtInt(t.queue_depth) + " items"],
    ["Flushes/s", String(last(hist.flushes_per_s))],
    ["Streams", fmtInt(t.streams_connected)],
    ["Flushing", o.flush_fault ? "✖ FAILING: " + o.flush_fault : "✔ ok"],
  ];
  const box = $("#cards");
  box.replaceChildren(...cards.map(([k, v]) => el("div", { class: "card" + (k === "Flushing" && o.flush_fault ? " bad" : ""), "data-card": k },
    el("div", { class: "k", text: k }), el("div", { class: "v", text: v }))));
  drawChart($("#chart-mutations"), hist.time, hist.mutations_per_s);
  drawChart($("#chart-deliveries"), hist.time, hist.deliveries_per_s);
  drawChart($("#chart-flushes"), hist.time, hist.flushes_per_s);
  drawChart($("#chart-queue"), hist.time, hist.queue_bytes, fmtBytes);

  const cluster = o.cluster;
  $("#cluster-part").hidden = !cluster;
  const place = placements();
  if (cluster) {
    const counts = {};
    for (const p of place.values()) {
      (counts[p.active] = counts[p.active] || { a: 0, r: 0 }).a++;
      for (const r of p.replicas) (counts[r.node] = counts[r.node] || { a: 0, r: 0 }).r++;
    }
    $("#nodes-table tbody").replaceChildren(...cluster.nodes.map((n) => el("tr", {},
      el("td", {}, n.name + (n.name === cluster.node ? " (this node)" : "") + (n.name === cluster.orchestrator ? " ★ orchestrator" : "")),
      el("td", { class: n.state === "up" ? "good" : "bad" }, (n.state === "up" ? "▲ up" : "▼ DOWN")),
      el("td", {}, n.url || "–"),
      el("td", {}, fmtInt((counts[n.name] || {}).a || 0)),
      el("td", {}, fmtInt((counts[n.name] || {}).r || 0)))));
  }
  // the grid: one cell per partition, a symbol and a colour (never colour alone)
  const map = $("#map");
  const n = o.partitions.length;
  map.className = "map " + (n > 256 ? "tiny" : n > 64 ? "small" : "big");
  const nodeIndex = new Map();
  if (cluster) cluster.nodes.forEach((nd, i) => nodeIndex.set(nd.name, i + 1));
  const cells = o.partitions.map((p) => {
    const pl = place.get(p.partition);
    let cls = "cell s-" + p.state, sym = p.state[0].toUpperCase(), title = `partition ${p.partition}: ${p.state}, high ${p.high_seqno}, persisted ${p.persisted_seqno}`;
    if (pl) {
      const up = new Set(cluster.nodes.filter((nd) => nd.state === "up").map((nd) => nd.name));
      const down = pl.replicas.filter((r) => !up.has(r.node));
      const lagging = pl.replicas.filter((r) => up.has(r.node) && !r.in_sync);
      sym = pl.active ? String(nodeIndex.get(pl.active) || "?") : "✖";
      cls = "cell " + (!pl.active ? "s-dead" : down.length || lagging.length ? "s-catching" : "s-active");
      if (down.length) sym += "↓"; else if (lagging.length) sym += "…";
      title += `; active ${pl.active || "none"}; replicas ${pl.replicas.map((r) => r.node + (!up.has(r.node) ? " DOWN" : r.in_sync ? " in sync" : " catching up")).join(", ") || "none"}`;
    }
    if (p.queue_depth > 0) title += `; backlog ${p.queue_depth}`;
    return el("div", { class: cls, role: "listitem", title, "data-partition": p.partition, "aria-label": title }, sym);
  });
  map.replaceChildren(...cells);
  $("#map-legend").textContent = cluster
    ? "Each cell is a partition: the number is its active node (row in the table above), “…” = a replica is catching up, “↓” = a replica's node is down, ✖ = no active. Hover for details."
    : "Each cell is a partition: A = active, R = replica, P = pending, D = dead. Hover for details.";
}

function drawChart(canvas, times, values, fmt) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 420, h = canvas.clientHeight || 110;
  if (canvas.width !== w * dpr) { canvas.width = w * dpr; canvas.height = h * dpr; }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const max = Math.max(1, ...values);
  g.strokeStyle = "#ccd"; g.lineWidth = 1;
  g.beginPath(); g.moveTo(0, h - 0.5); g.lineTo(w, h - 0.5); g.stroke();
  g.fillStyle = "#445"; g.font = "11px sans-serif";
  g.fillText("max " + (fmt ? fmt(max) : fmtInt(Math.round(max))) + " · last " + (values.length ? (fmt ? fmt(values[values.length - 1]) : fmtInt(Math.round(values[values.length - 1]))) : "–") + " · last " + (values.length < 120 ? values.length + " s" : Math.round(values.length / 60) + " min"), 4, 12);
  if (values.length < 2) return;
  g.strokeStyle = "#2563eb"; g.lineWidth = 1.5;
  g.beginPath();
  values.forEach((v, i) => {
    const x = i / (values.length - 1) * (w - 2) + 1, y = h - 2 - v / max * (h - 20);
    if (i) g.lineTo(x, y); else g.moveTo(x, y);
  });
  g.stroke();
}

function partitionRows() {
  const place = placements();
  return S.overview.partitions.map((p) => {
    const pl = place.get(p.partition);
    return Object.assign({}, p, { active: pl ? (pl.active || "none") : "", failovers: p.failover_log.length, placement: pl });
  });
}

function renderPartitions() {
  const o = S.overview;
  const stateSel = $("#filter-state"), nodeSel = $("#filter-node");
  fillSelect(stateSel, [...new Set(o.partitions.map((p) => p.state))].sort());
  $("#filter-node-label").hidden = !o.cluster;
  if (o.cluster) fillSelect(nodeSel, o.cluster.nodes.map((n) => n.name));
  const st = stateSel.value, nd = nodeSel.value, txt = $("#filter-text").value.trim();
  let rows = partitionRows().filter((r) =>
    (!st || r.state === st) &&
    (!nd || r.active === nd || (r.placement && r.placement.replicas.some((x) => x.node === nd))) &&
    (!txt || String(r.partition) === txt || String(r.partition).startsWith(txt)));
  const { key, dir } = S.sort;
  rows.sort((a, b) => (a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : a.partition - b.partition) * dir);
  $("#partitions-table").classList.toggle("no-cluster", !o.cluster);
  $("#part-count").textContent = `${rows.length} of ${o.partitions.length} partitions`;
  const cols = ["partition", "state", "high_seqno", "persisted_seqno", "purge_seqno", "queue_depth", "item_count", "active"];
  $("#partitions-table tbody").replaceChildren(...rows.map((r) => {
    const tr = el("tr", { "data-partition": r.partition });
    for (const c of cols) {
      let v = r[c];
      if (c === "state") v = { active: "● active", replica: "◐ replica", pending: "○ pending", dead: "✖ dead" }[v] || v;
      else if (c !== "active" && typeof v === "number") v = fmtInt(v);
      const cls = c === "state" ? "st-" + r.state : c === "queue_depth" && r.queue_depth > 0 ? "warn" : null;
      tr.append(el(c === "partition" ? "th" : "td", { "data-key": c, class: cls, scope: c === "partition" ? "row" : null, "data-value": r[c] }, v === "" ? "–" : v));
    }
    const det = el("details", { open: S.openFailover.has(r.partition) },
      el("summary", {}, `${r.failovers} entr${r.failovers === 1 ? "y" : "ies"} (uuid ${r.uuid})`),
      el("table", { class: "inner" }, el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "uuid"), el("th", { scope: "col" }, "from seqno"))),
        el("tbody", {}, ...r.failover_log.map(([u, s]) => el("tr", {}, el("td", {}, u), el("td", {}, fmtInt(s)))))));
    det.addEventListener("toggle", () => { if (det.open) S.openFailover.add(r.partition); else S.openFailover.delete(r.partition); });
    tr.append(el("td", { "data-key": "failover_log" }, det));
    return tr;
  }));
  for (const th of document.querySelectorAll("#partitions-table thead th")) {
    th.setAttribute("aria-sort", th.dataset.key === key ? (dir > 0 ? "ascending" : "descending") : "none");
  }
}

function fillSelect(sel, values) {
  const have = [...sel.options].slice(1).map((o) => o.value).join("\n");
  if (have === values.join("\n")) return;
  const keep = sel.value;
  sel.replaceChildren(el("option", { value: "" }, "any"), ...values.map((v) => el("option", { value: v }, v)));
  sel.value = values.includes(keep) ? keep : "";
}

function renderStreams() {
  const streams = S.overview.streams;
  $("#streams-empty").hidden = streams.length > 0;
  $("#stream-list").replaceChildren(...streams.map((s) => {
    const maxLag = Math.max(0, ...s.partitions.map((p) => p.lag));
    const lagS = s.partitions.map((p) => p.lag_s).filter((x) => x !== null);
    const atRisk = s.partitions.filter((p) => p.purge_seqno > 0 && p.purge_distance < PURGE_WARN_SEQNOS);
    const head = el("div", { class: "stream-head" },
      el("h3", {}, (s.name || "(no hello yet)") + " ", el("span", { class: "badge " + s.kind }, s.kind === "replication" ? "⇄ replication" : "consumer")),
      el("dl", {},
        ...[["address", s.remote], ["codec", s.codec], ["window", fmtBytes(s.window_bytes)], ["unacked", fmtBytes(s.bytes_buffered)],
          ["partitions", String(s.partitions.length)], ["max lag", fmtInt(maxLag) + " seqnos" + (lagS.length ? ", " + Math.max(...lagS).toFixed(1) + " s" : "")],
          ["rollbacks", fmtInt(s.rollbacks)], ["cursor drops", fmtInt(s.cursor_drops)], ["connected", fmtTime(s.connected_at)]]
          .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)])));
    if (atRisk.length) head.append(el("p", { class: "bad" }, `⚠ ${atRisk.length} partition(s) within ${PURGE_WARN_SEQNOS} seqnos of the purge horizon: a disconnect there means a rollback to 0`));
    const table = el("table", { class: "lag" },
      el("thead", {}, el("tr", {}, ...["Partition", "Last sent seqno", "Lag (seqnos)", "Lag (s)", "Purge seqno", "Above purge"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...s.partitions.map((p) => {
        const risk = p.purge_seqno > 0 && p.purge_distance < PURGE_WARN_SEQNOS;
        return el("tr", { "data-partition": p.partition },
          el("th", { scope: "row" }, String(p.partition)), el("td", {}, fmtInt(p.last_sent_seqno)),
          el("td", { class: p.lag > 0 ? "warn" : null, "data-key": "lag" }, fmtInt(p.lag)),
          el("td", { "data-key": "lag_s" }, p.lag_s === null ? "– (reading history)" : p.lag_s.toFixed(1)),
          el("td", {}, fmtInt(p.purge_seqno)),
          el("td", { class: risk ? "bad" : null }, (risk ? "⚠ " : "") + fmtInt(p.purge_distance)));
      })));
    return el("article", { class: "stream", "data-stream": s.name }, head, el("div", { class: "scroll" }, table));
  }));
}

function renderEvents() {
  const kinds = [...new Set(S.events.map((e) => e.kind))].sort();
  fillSelect($("#filter-kind"), kinds);
  const k = $("#filter-kind").value;
  const shown = S.events.filter((e) => !k || e.kind === k).slice().reverse();
  $("#events-empty").hidden = shown.length > 0;
  $("#event-list").replaceChildren(...shown.map((e) => el("li", { class: "event sev-" + e.severity, "data-kind": e.kind },
    el("time", { dateTime: new Date(e.time * 1000).toISOString() }, fmtTime(e.time)),
    el("span", { class: "badge sev-" + e.severity }, { error: "✖ error", warning: "⚠ warning", info: "ℹ info" }[e.severity] || e.severity),
    el("span", { class: "kind" }, e.kind.replace("_", " ")),
    el("span", { class: "msg" }, e.message),
    Object.keys(e.details).length ? el("details", {}, el("summary", {}, "details"), el("pre", {}, JSON.stringify(e.details, null, 1))) : null)));
}

// ------------------------------------------------------------------ start
async function boot() {
  $("#login-form").addEventListener("submit", signIn);
  window.addEventListener("hashchange", showPage);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) render(); });
  for (const th of document.querySelectorAll("#partitions-table thead th")) {
    th.querySelector("button").addEventListener("click", () => {
      const key = th.dataset.key;
      S.sort = { key, dir: S.sort.key === key ? -S.sort.dir : 1 };
      renderPartitions();
    });
  }
  for (const id of ["#filter-state", "#filter-node", "#filter-text", "#filter-kind"]) {
    $(id).addEventListener("input", render);
  }
  setInterval(checkLost, 1000);
  showPage();
  try {
    onOverview(await api("/ui/api/overview"));
    startLoops();
  } catch (e) {
    if (e instanceof AuthError) { S.token = null; sessionStorage.removeItem(TOKEN_KEY); showLogin(null); }
    else { S.lastOk = 0; setConn("lost", "connection lost — retrying"); startLoops(); }
  }
}

document.addEventListener("DOMContentLoaded", boot);
