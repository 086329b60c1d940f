// Live dashboard: a snapshot first (so the page is complete at once), then server-sent events:
// `balances` (changed account views) and `stats` (once a second). No framework, no build step.
"use strict";
const $ = (id) => document.getElementById(id);
const accounts = new Map();   // account_id -> view
let flashed = new Set();
let version = 0;

function esc(s) { return String(s ?? "").replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])); }
function amount(m) { return m.decimal ?? m.minor; }
function neg(m) { return m.minor.startsWith("-") ? " neg" : ""; }
function ago(s) { if (s == null) return "–"; if (s < 60) return s.toFixed(0) + " s"; if (s < 3600) return (s / 60).toFixed(0) + " min"; return (s / 3600).toFixed(1) + " h"; }

function renderAccounts() {
  const q = $("filter").value.trim().toLowerCase();
  const rows = [...accounts.values()]
    .filter((a) => !q || a.account_id.toLowerCase().includes(q))
    .sort((a, b) => (b.account_id.startsWith("sys:") - a.account_id.startsWith("sys:")) || a.account_id.localeCompare(b.account_id))
    .slice(0, 300);
  $("accounts").innerHTML = rows.map((a) => `
    <tr data-account="${esc(a.account_id)}" class="${a.account_id.startsWith("sys:") ? "sys" : ""}${flashed.has(a.account_id) ? " flash" : ""}">
      <td>${esc(a.account_id)}${a.shards > 1 ? ` <span class="tag">${a.shards} shards</span>` : ""}</td>
      <td>${esc(a.currency)}</td>
      <td class="num${neg(a.posted)}">${esc(amount(a.posted))}</td>
      <td class="num">${esc(amount(a.held))}</td>
      <td class="num${neg(a.available)}">${esc(amount(a.available))}</td>
      <td class="num">${a.seq}</td>
      <td><span class="tag${a.status === "open" ? "" : " bad"}">${esc(a.status)}</span></td>
    </tr>`).join("");
  $("account-count").textContent = `${accounts.size} accounts`;
  flashed = new Set();
}

function setupCanvas(c) {
  // Draw at device pixels: the CSS height stays what the HTML says, the bitmap follows the width.
  if (!c.dataset.h) c.dataset.h = c.height;
  const dpr = window.devicePixelRatio || 1, w = c.clientWidth || 600, h = +c.dataset.h;
  c.style.height = h + "px"; c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
  const ctx = c.getContext("2d"); ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return [ctx, w, h];
}

// A small hand-drawn chart: series = [{values, color, fill}], stacked when `stacked`.
function chart(canvas, labels, series, stacked) {
  const [ctx, w, h] = setupCanvas(canvas);
  const pad = {l: 40, r: 8, t: 8, b: 18}, n = labels.length;
  ctx.clearRect(0, 0, w, h);
  const tops = labels.map((_, i) => stacked ? series.reduce((s, x) => s + x.values[i], 0) : Math.max(...series.map((x) => x.values[i])));
  const max = Math.max(1, ...tops) * 1.15;
  const x = (i) => pad.l + (n <= 1 ? 0 : (i * (w - pad.l - pad.r)) / (n - 1));
  const y = (v) => h - pad.b - (v / max) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#263049"; ctx.fillStyle = "#8a96b0"; ctx.font = "11px system-ui"; ctx.lineWidth = 1;
  for (let k = 0; k <= 3; k++) {
    const v = (max / 1.15) * k / 3, yy = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(pad.l, yy); ctx.lineTo(w - pad.r, yy); ctx.stroke();
    ctx.fillText(v >= 100 ? v.toFixed(0) : v.toFixed(1), 4, yy + 4);
  }
  if (n > 1) { ctx.fillText(labels[0], pad.l, h - 4); const last = labels[n - 1]; ctx.fillText(last, w - pad.r - ctx.measureText(last).width, h - 4); }
  const base = new Array(n).fill(0);
  for (const s of series) {
    const top = s.values.map((v, i) => (stacked ? base[i] : 0) + v);
    // A step series holds its value until the next point (a balance between two changes).
    const trace = () => top.forEach((v, i) => {
      if (!i) ctx.moveTo(x(i), y(v)); else { if (s.step) ctx.lineTo(x(i), y(top[i - 1])); ctx.lineTo(x(i), y(v)); } });
    ctx.beginPath();
    trace();
    if (s.fill) {
      for (let i = n - 1; i >= 0; i--) ctx.lineTo(x(i), y(stacked ? base[i] : 0));
      ctx.closePath(); ctx.fillStyle = s.fill; ctx.fill();
      ctx.beginPath(); trace();
    }
    ctx.strokeStyle = s.color; ctx.lineWidth = 1.8; ctx.stroke();
    if (stacked) top.forEach((v, i) => (base[i] = v));
  }
}

// Grouped bars: series = [{values, color}], one group per label.
function bars(canvas, labels, series) {
  const [ctx, w, h] = setupCanvas(canvas);
  const pad = {l: 40, r: 8, t: 8, b: 18}, n = Math.max(labels.length, 1);
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1, ...series.flatMap((s) => s.values)) * 1.15;
  const y = (v) => h - pad.b - (v / max) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#263049"; ctx.fillStyle = "#8a96b0"; ctx.font = "11px system-ui"; ctx.lineWidth = 1;
  for (let k = 0; k <= 3; k++) {
    const v = (max / 1.15) * k / 3, yy = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(pad.l, yy); ctx.lineTo(w - pad.r, yy); ctx.stroke();
    ctx.fillText(v >= 100 ? v.toFixed(0) : v.toFixed(1), 4, yy + 4);
  }
  const group = (w - pad.l - pad.r) / n, bw = Math.max(2, (group * 0.7) / Math.max(series.length, 1));
  labels.forEach((label, i) => {
    const x0 = pad.l + i * group + group * 0.15;
    series.forEach((s, j) => {
      const v = s.values[i] || 0;
      ctx.fillStyle = s.color; ctx.fillRect(x0 + j * bw, y(v), bw - 1, h - pad.b - y(v));
    });
    ctx.fillStyle = "#8a96b0"; ctx.fillText(label, x0, h - 4);
  });
}

const PALETTE = ["#6aa9ff", "#3ecf8e", "#f7b955", "#ff6b6b", "#b18cff", "#4fd1c5", "#f78fb3", "#a3be8c"];
let pickedAccount = new URLSearchParams(location.search).get("account") || "";

// One account's posted, held and available after each of its last 500 changes (from its history, holds
// included), one step per change; the axis is the changes in order, labelled with the first and last time.
async function renderAccountChart() {
  const id = pickedAccount;
  $("account-pick").value = id;
  document.querySelectorAll("#accounts tr").forEach((tr) => tr.classList.toggle("picked", tr.dataset.account === id));
  if (!id) { $("account-meta").textContent = "pick an account"; return; }
  const r = await fetch(`/accounts/${encodeURIComponent(id)}/series?limit=500`);
  const body = await r.json();
  if (!r.ok) { $("account-meta").textContent = body.error ? body.error.code : "error"; chart($("account-chart"), [], [], false); return; }
  const pts = body.points, num = (m) => Number(m.decimal ?? m.minor);
  $("account-meta").textContent = `${id} · ${pts.length} change(s)` + (pts.length ? ` · posted ${amount(pts[pts.length - 1].posted)} ${body.currency}` : "");
  chart($("account-chart"), pts.map((p) => clock(p.at_ms)), [
    {values: pts.map((p) => num(p.posted)), color: "#6aa9ff", fill: "rgba(106,169,255,.10)", step: true},
    {values: pts.map((p) => num(p.held)), color: "#f7b955", step: true},
    {values: pts.map((p) => num(p.posted) - num(p.held)), color: "#3ecf8e", step: true}], false);
}

function pickAccount(id) {
  pickedAccount = id;
  renderAccountChart().catch(() => {});
}

function renderOperations(s) {
  const ch = s.clearing_history.length ? s.clearing_history : [{t_ms: s.now_ms, minor: {}}];
  const currencies = [...new Set(ch.flatMap((p) => Object.keys(p.minor)))].sort();
  chart($("clearing-chart"), ch.map((p) => clock(p.t_ms)),
        currencies.map((c, i) => ({values: ch.map((p) => Number(p.minor[c] ?? 0)), color: PALETTE[i % PALETTE.length]})), false);
  $("clearing-legend").innerHTML = currencies.map((c, i) => `<span><i class="sw" style="background:${PALETTE[i % PALETTE.length]}"></i>${esc(c)}</span>`).join("")
    || `<span>nothing in clearing</span>`;
  $("stuck-after").textContent = `stuck after ${s.stuck_after_s} s`;
  $("transfers").innerHTML = s.transfers_in_clearing.map((t) => `<tr><td>${esc(t.transaction_id)}</td>
      <td class="num">${esc(amount(t))} ${esc(t.currency)}</td>
      <td class="num${t.age_s >= s.stuck_after_s ? " stuck" : ""}">${ago(t.age_s)}</td></tr>`).join("")
    || `<tr><td colspan="3" class="muted">no transfer in flight</td></tr>`;

  const wk = s.workers || {configured: false, latency: [], lag: []};
  const lat = wk.latency.length ? wk.latency : [{t_ms: s.now_ms, p50: 0, p95: 0, p99: 0}];
  const ms = (v) => v == null ? 0 : v * 1000;
  chart($("latency"), lat.map((p) => clock(p.t_ms)), [
    {values: lat.map((p) => ms(p.p50)), color: "#3ecf8e"}, {values: lat.map((p) => ms(p.p95)), color: "#f7b955"},
    {values: lat.map((p) => ms(p.p99)), color: "#ff6b6b"}], false);
  const last = wk.latency[wk.latency.length - 1];
  $("latency-now").innerHTML = !wk.configured ? `<span>set LEDGER_WORKER_METRICS to the workers' /metrics</span>`
    : last ? ["p50", "p95", "p99"].map((q) => `<span>${q} <b>${ms(last[q]).toFixed(1)} ms</b></span>`).join("")
    : `<span>no command decided lately</span>`;

  const partitions = new Set(wk.lag.map((x) => x.partition));
  const store = {};
  for (const [, byPart] of Object.entries(s.lag_by_partition || {}))
    for (const [p, n] of Object.entries(byPart)) { store[p] = (store[p] || 0) + n; partitions.add(+p); }
  const parts = [...partitions].sort((a, b) => a - b);
  const cmd = Object.fromEntries(wk.lag.map((x) => [x.partition, x.lag]));
  bars($("partition-lag"), parts.map(String), [
    {values: parts.map((p) => cmd[p] || 0), color: "#6aa9ff"}, {values: parts.map((p) => store[p] || 0), color: "#b18cff"}]);
  $("partition-lag-note").innerHTML = `<span>partitions <b>${parts.length}</b></span>` +
    `<span>commands behind <b>${Object.values(cmd).reduce((a, b) => a + b, 0)}</b></span>` +
    `<span>read store behind <b>${Object.values(store).reduce((a, b) => a + b, 0)}</b></span>`;
}

function clock(ms) { const d = new Date(ms); return d.toTimeString().slice(0, 8); }

function renderStats(s) {
  const tp = s.throughput;
  // Rejected at the bottom, accepted stacked on it: the top line is the total, drawn in the accepted colour.
  chart($("throughput"), tp.map((p) => clock(p.t * 1000)), [
    {values: tp.map((p) => p.rejected), color: "#ff6b6b", fill: "rgba(255,107,107,.30)"},
    {values: tp.map((p) => p.accepted), color: "#3ecf8e", fill: "rgba(62,207,142,.18)"}], true);
  const lh = s.lag_history.length ? s.lag_history : [{t_ms: s.now_ms, lag: s.lag_total}];
  chart($("lag"), lh.map((p) => clock(p.t_ms)), [{values: lh.map((p) => p.lag), color: "#6aa9ff", fill: "rgba(106,169,255,.15)"}], false);
  $("lag-topics").innerHTML = Object.entries(s.lag).map(([t, n]) => `<span>${esc(t)} <b>${n}</b></span>`).join("");
  const lagPill = $("lag-status");
  lagPill.textContent = s.lag_total === 0 ? "caught up" : `lag ${s.lag_total} records`;
  lagPill.className = "pill " + (s.lag_total === 0 ? "ok" : s.lag_total < 1000 ? "warn" : "bad");
  const recon = $("recon-status");
  recon.textContent = s.reconciled ? "books balance" : "IMBALANCE";
  recon.className = "pill " + (s.reconciled ? "ok" : "bad");
  $("sums").innerHTML = s.sums.map((x) => `<tr><td>${esc(x.currency)}</td><td class="num">${esc(amount(x))}</td>
      <td><span class="tag ${x.balanced ? "ok" : "bad"}">${x.balanced ? "balanced" : "off"}</span></td></tr>`).join("")
    || `<tr><td colspan="3" class="muted">no balances yet</td></tr>`;
  $("clearing").innerHTML = s.clearing.map((x) => `<tr><td>${esc(x.currency)}</td><td class="num">${esc(amount(x))}</td>
      <td class="num">${x.minor === "0" ? "–" : ago(x.age_s)}</td></tr>`).join("")
    || `<tr><td colspan="3" class="muted">nothing in flight</td></tr>`;
  const top = Math.max(1, ...s.rejections.map((r) => r.count));
  $("reasons").innerHTML = s.rejections.map((r) => `<div class="bar"><span class="label">${esc(r.reason)}</span>
      <span class="track"><span class="fill" style="width:${(100 * r.count / top).toFixed(1)}%; display:block"></span></span>
      <span class="n">${r.count}</span></div>`).join("") || `<div class="muted small">no rejections</div>`;
  renderOperations(s);
  $("recent").innerHTML = s.recent_rejections.map((r) => `<li><span class="muted">${clock(r.at_ms)}</span>
      <span class="r">${esc(r.reason)}</span><span class="c">${esc(r.client_id)}/${esc(r.command_id)}</span></li>`).join("");
}

function applyBalances(list) {
  for (const a of list) { accounts.set(a.account_id, a); flashed.add(a.account_id); }
  renderAccounts();
  // The picked account's chart follows its changes: read again when its view changed.
  if (pickedAccount && list.some((a) => a.account_id === pickedAccount)) renderAccountChart().catch(() => {});
}

function connect() {
  if (!window.EventSource) { poll(); return; }
  // ?stream_s=N: shorter event streams (each reconnect resumes by Last-Event-ID), for headless browsers.
  const streamS = new URLSearchParams(location.search).get("stream_s");
  const es = new EventSource(`/events?since=${version}` + (streamS ? `&max_s=${encodeURIComponent(streamS)}` : ""));
  const pill = $("conn-status");
  let lost = null;
  es.addEventListener("open", () => { clearTimeout(lost); lost = null; pill.textContent = "live"; pill.className = "pill ok"; });
  es.addEventListener("balances", (e) => { version = +e.lastEventId || version; applyBalances(JSON.parse(e.data)); });
  es.addEventListener("stats", (e) => renderStats(JSON.parse(e.data)));
  // A stream ending is normal (the server rotates them); only say so when the reconnect does not come.
  es.addEventListener("error", () => { if (!lost) lost = setTimeout(() => { pill.textContent = "reconnecting…"; pill.className = "pill warn"; }, 4000); });
}

async function snapshot() {
  const r = await fetch("/api/snapshot");
  const snap = await r.json();
  $("prefix").textContent = snap.prefix ? `· ${snap.prefix}` : "";
  version = snap.stats.version;
  for (const a of snap.accounts) accounts.set(a.account_id, a);
  renderAccounts();
  renderStats(snap.stats);
}

async function poll() {  // only without EventSource
  try { await snapshot(); } catch (e) { /* the API restarts: try again */ }
  setTimeout(poll, 2000);
}

$("filter").addEventListener("input", renderAccounts);
$("accounts").addEventListener("click", (e) => { const tr = e.target.closest("tr[data-account]"); if (tr) pickAccount(tr.dataset.account); });
$("account-pick").addEventListener("change", (e) => pickAccount(e.target.value.trim()));
renderAccountChart().catch(() => {});
snapshot().then(connect, () => { $("conn-status").textContent = "API unreachable"; $("conn-status").className = "pill bad"; setTimeout(() => location.reload(), 3000); });
