// BoxOffice ops dashboard: polls the admin API's history of the chosen event,
// charts it with uPlot and drives the rate, the cap and pause from forms.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("boxoffice-admin-token") || "";
let eventId = null;
let lastT = 0;
let sampleMs = 1000;
let poller = null;
let paused = false;
let charts = [];
const WINDOW_S = 600;

function say(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.className = kind || "";
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: Object.assign(
      { Authorization: "Bearer " + token },
      body ? { "Content-Type": "application/json" } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = new Error((data && (data.detail || data.title)) || response.statusText);
    error.status = response.status;
    throw error;
  }
  return data;
}

// ---- tiles -----------------------------------------------------------------

const fmt = (v, digits) => v === null || v === undefined ? "—"
  : typeof v === "number" ? (v + 0).toLocaleString(undefined, { maximumFractionDigits: digits ?? 0 }) : String(v);

function inProgress(orders) {
  let n = 0;
  for (const [status, count] of Object.entries(orders || {})) {
    if (status !== "confirmed" && status !== "failed") n += count;
  }
  return n;
}

function renderTiles(s) {
  const tiles = [
    ["state", "State", s.paused && s.state !== "paused" ? s.state + " (paused)" : s.state],
    ["queue", "In line", fmt(s.queue_length)],
    ["oldest-wait", "Oldest wait (s)", fmt(s.oldest_wait_s, 1)],
    ["rate-set", "Rate set (fans/s)", fmt(s.rate_set, 1)],
    ["rate-actual", "Rate actual (fans/s)", fmt(s.rate_actual, 1)],
    ["active", "Active / cap", fmt(s.active) + " / " + fmt(s.max_active)],
    ["sold", "Seats sold", fmt(s.sold)],
    ["remaining", "Seats left", fmt(s.remaining)],
    ["confirmed", "Orders confirmed", fmt((s.orders || {}).confirmed || 0)],
    ["failed", "Orders failed", fmt((s.orders || {}).failed || 0)],
    ["outbox", "Outbox backlog", fmt(s.outbox_backlog)],
    ["outbox-age", "Outbox oldest (s)", fmt(s.outbox_oldest_age_s, 1), s.outbox_oldest_age_s > 30],
    ["lag", "Consumer lag", fmt(s.consumer_lag), s.consumer_lag > 1000],
    ["dlq", "DLQ messages", fmt(s.dlq_messages), s.dlq_messages > 0],
  ];
  $("tiles").replaceChildren(...tiles.map(([id, label, value, bad]) => {
    const tile = document.createElement("div");
    tile.className = "card tile" + (bad ? " bad" : "");
    tile.id = "tile-" + id;
    const l = document.createElement("div");
    l.className = "label";
    l.textContent = label;
    const v = document.createElement("div");
    v.className = "value";
    v.textContent = value;
    tile.append(l, v);
    return tile;
  }));
  paused = s.paused;
  $("pause").textContent = paused ? "Resume admission" : "Pause admission";
  $("pause").setAttribute("aria-pressed", String(paused));
}

// ---- charts ----------------------------------------------------------------

const CHARTS = [
  { id: "queue", title: "Queue length", series: [
    ["in line", "#0b57d0", (s) => s.queue_length],
    ["oldest wait s", "#b3261e", (s) => s.oldest_wait_s, "s"]] },
  { id: "rate", title: "Admission rate (fans/s): set vs actual", series: [
    ["set", "#555", (s) => s.rate_set],
    ["actual", "#0b57d0", (s) => s.rate_actual]] },
  { id: "active", title: "Active fans", series: [
    ["active", "#0b57d0", (s) => s.active],
    ["cap", "#555", (s) => s.max_active]] },
  { id: "seats", title: "Seats", series: [
    ["sold", "#146c2e", (s) => s.sold],
    ["remaining", "#0b57d0", (s) => s.remaining]] },
  { id: "orders", title: "Order outcomes", series: [
    ["confirmed", "#146c2e", (s) => (s.orders || {}).confirmed || 0],
    ["failed", "#b3261e", (s) => (s.orders || {}).failed || 0],
    ["in progress", "#f9ab00", (s) => inProgress(s.orders)]] },
  { id: "outbox", title: "Outbox", series: [
    ["backlog", "#0b57d0", (s) => s.outbox_backlog],
    ["oldest age s", "#b3261e", (s) => s.outbox_oldest_age_s, "s"]] },
  { id: "workers", title: "Ticket workers", series: [
    ["consumer lag", "#0b57d0", (s) => s.consumer_lag],
    ["DLQ messages", "#b3261e", (s) => s.dlq_messages]] },
];

function buildCharts() {
  charts.forEach((c) => c.plot.destroy());
  const container = $("charts");
  container.replaceChildren();
  charts = CHARTS.map((spec) => {
    const card = document.createElement("section");
    card.className = "card chart";
    card.id = "chart-" + spec.id;
    card.dataset.points = "0";
    const h = document.createElement("h2");
    h.textContent = spec.title;
    const figure = document.createElement("div");
    figure.setAttribute("role", "img");
    figure.setAttribute("aria-label", spec.title + " over the last minutes");
    card.append(h, figure);
    container.append(card);
    const secondScale = spec.series.some((s) => s[3]);
    const opts = {
      width: Math.max(360, card.clientWidth - 32),
      height: 200,
      series: [{}].concat(spec.series.map(([label, stroke, , scale]) =>
        ({ label, stroke, width: 2, scale: scale || "y", spanGaps: false }))),
      axes: [{}, { scale: "y" }].concat(secondScale ? [{ scale: "s", side: 1, grid: { show: false } }] : []),
      scales: { x: { time: true } },
    };
    const data = [[]].concat(spec.series.map(() => []));
    const plot = new uPlot(opts, data, figure);
    return { spec, plot, data, card };
  });
}

function appendSamples(samples) {
  for (const chart of charts) {
    for (const s of samples) {
      chart.data[0].push(s.t_ms / 1000);
      chart.spec.series.forEach(([, , pick], i) => {
        const v = pick(s);
        chart.data[i + 1].push(v === undefined ? null : v);
      });
    }
    const cut = chart.data[0].findIndex((t) => t >= chart.data[0][chart.data[0].length - 1] - WINDOW_S);
    if (cut > 0) chart.data.forEach((column) => column.splice(0, cut));
    chart.plot.setData(chart.data);
    chart.card.dataset.points = String(chart.data[0].length);
  }
}

// ---- polling ---------------------------------------------------------------

async function poll() {
  if (!eventId) return;
  const asked = eventId;
  try {
    const history = await api("GET", `/admin/v1/events/${encodeURIComponent(asked)}/history?since_ms=${lastT}`);
    if (asked !== eventId) return; // the event was switched while asking
    sampleMs = history.sample_ms || sampleMs;
    if (history.samples.length) {
      lastT = history.samples[history.samples.length - 1].t_ms;
      appendSamples(history.samples);
      renderTiles(history.samples[history.samples.length - 1]);
    }
  } catch (error) {
    if (error.status === 401 || error.status === 429) {
      // A token that stopped working (rotated): stop asking, each refusal
      // counts against this address's admin lockout.
      clearInterval(poller);
      say("The admin token was refused; enter it again.", "error");
      $("login").hidden = false;
      return;
    }
    say("Cannot read the event: " + error.message, "error");
  }
}

function startPolling() {
  clearInterval(poller);
  poll();
  poller = setInterval(poll, sampleMs);
}

async function chooseEvent(id) {
  eventId = id;
  lastT = 0;
  buildCharts();
  const view = await api("GET", `/admin/v1/events/${encodeURIComponent(id)}`);
  $("rate").value = view.admission_rate_per_s;
  $("max-active").value = view.max_active;
  $("lambda").value = Math.max(1, view.admission_rate_per_s);
  startPolling();
}

async function connect() {
  try {
    const events = await api("GET", "/admin/v1/events");
    sessionStorage.setItem("boxoffice-admin-token", token);
    const select = $("event");
    select.replaceChildren(...events.map((e) => {
      const option = document.createElement("option");
      option.value = e.event_id;
      option.textContent = `${e.name} (${e.event_id}) — ${e.state}`;
      return option;
    }));
    $("login").hidden = true;
    $("event-label").hidden = false;
    if (!events.length) {
      say("No events yet: create one with PUT /admin/v1/events/{id}.");
      return;
    }
    $("board").hidden = false;
    const wanted = new URLSearchParams(location.search).get("event");
    const first = events.some((e) => e.event_id === wanted) ? wanted : events[0].event_id;
    select.value = first;
    say("");
    await chooseEvent(first);
  } catch (error) {
    say(error.status === 401 ? "That admin token was refused." : "Cannot reach the admin API: " + error.message, "error");
    $("login").hidden = false;
  }
}

// ---- controls --------------------------------------------------------------

async function tune(change, done) {
  try {
    const view = await api("PATCH", `/admin/v1/events/${encodeURIComponent(eventId)}`, change);
    say(done(view), "ok");
    poll();
  } catch (error) {
    say("Not applied: " + error.message, "error");
  }
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("token").value;
  connect();
});

$("event").addEventListener("change", (e) => chooseEvent(e.target.value));

$("rate-form").addEventListener("submit", (e) => {
  e.preventDefault();
  tune({ admission_rate_per_s: Number($("rate").value) },
    (v) => `Admission rate set to ${v.admission_rate_per_s} fans/s.`);
});

$("active-form").addEventListener("submit", (e) => {
  e.preventDefault();
  tune({ max_active: Number($("max-active").value) },
    (v) => `At most ${v.max_active} fans active at once.`);
});

$("pause").addEventListener("click", () => {
  tune({ paused: !paused }, (v) => {
    paused = v.paused;
    $("pause").textContent = paused ? "Resume admission" : "Pause admission";
    return v.paused ? "Admission paused." : "Admission resumed.";
  });
});

$("planner").addEventListener("submit", async (e) => {
  e.preventDefault();
  const q = new URLSearchParams({
    arrival_rate: $("lambda").value,
    service_time_ms: $("service").value,
    utilization: $("rho").value,
  });
  if ($("partition-rate").value) q.set("per_partition_rate", $("partition-rate").value);
  if ($("spike-rate").value) q.set("spike_rate", $("spike-rate").value);
  if ($("spike-s").value) q.set("spike_s", $("spike-s").value);
  try {
    const plan = await api("GET", "/admin/v1/capacity?" + q);
    const rows = [
      ["Busy workers L = λ·S", fmt(plan.busy_workers, 2)],
      ["Workers at ρ", fmt(plan.workers)],
      ["Throughput (msg/s)", fmt(plan.throughput, 1)],
      ["Partitions", fmt(plan.partitions)],
      ["Spike backlog", fmt(plan.spike_backlog, 0)],
      ["Drain time (s)", plan.drain_s === null ? "never drains" : fmt(plan.drain_s, 1)],
    ];
    $("plan").replaceChildren(...rows.flatMap(([k, v]) => {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      return [dt, dd];
    }));
  } catch (error) {
    $("plan").replaceChildren();
    say("Planner: " + error.message, "error");
  }
});

window.addEventListener("resize", () => {
  for (const chart of charts) {
    chart.plot.setSize({ width: Math.max(360, chart.card.clientWidth - 32), height: 200 });
  }
});

if (token) {
  $("token").value = token;
  connect();
}
