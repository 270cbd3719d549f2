// The operator page: asks for the operator token (kept in this tab's sessionStorage), then reads
// the /admin JSON API with it and draws what it says. Every value reaches the DOM as text
// (textContent, SVG attributes), never as HTML. No library, nothing fetched but this server's API.
"use strict";

const TOKEN_KEY = "paywire.adminToken";
const REFRESH_MS = 30000;
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
let refreshTimer = null;

class Unauthorized extends Error {}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) throw new Unauthorized("enter the operator token");
  const response = await fetch(path, {
    headers: { Authorization: "Bearer " + token },
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new Unauthorized("the server refused this token (it is not PAYWIRE_ADMIN_TOKEN)");
  }
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try {
      message = (await response.json()).error.message;
    } catch (_) { /* not our JSON error */ }
    throw new Error(path + ": " + message);
  }
  return path.endsWith(".csv") || path.includes(".csv?") ? response.blob() : response.json();
}

// -- small DOM helpers (text only) ------------------------------------------------------------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function usd(text) {
  return text && text.startsWith("-") ? "-$" + text.slice(1) : "$" + (text || "0");
}

// Chain fees in USD, plus the native amounts of the tokens that have no USD price (they are not
// in the USD figure, nor in the margin).
function fees(figures) {
  const unpriced = figures.chain_fees_unpriced.map((f) => " + " + f.amount + " " + f.unit);
  return usd(figures.chain_fees_usd) + unpriced.join("");
}

// A long hex id as its head and tail (`0x1234…abcd`); the cell's title keeps the whole of it.
function short(id) {
  return id && id.length > 14 ? id.slice(0, 6) + "…" + id.slice(-4) : id || "-";
}

function when(iso) {
  return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("Z", "") : "-";
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 120) return Math.round(seconds) + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

// columns: [heading, (row) => text, className?, (row) => title?]
function table(node, columns, rows, empty) {
  node.replaceChildren();
  const head = el("tr");
  for (const [heading, , className] of columns) head.append(el("th", heading, className));
  node.append(el("thead"));
  node.tHead.append(head);
  const body = el("tbody");
  if (!rows.length) {
    const cell = el("td", empty, "empty");
    cell.colSpan = columns.length;
    body.append(el("tr"));
    body.lastChild.append(cell);
  }
  for (const row of rows) {
    const line = el("tr", null, row.stuck ? "stuck" : "");
    for (const [, value, className, title] of columns) {
      const cell = el("td", value(row), className);
      // a clipped cell (a Solana signature, a network id) keeps its whole value in its title
      if (className && className.split(" ").includes("clip")) cell.title = cell.textContent;
      if (title) cell.title = title(row);  // a shortened value: the whole of it
      line.append(cell);
    }
    body.append(line);
  }
  node.append(body);
}

// -- the parts of the page ---------------------------------------------------------------------

function cards(summary) {
  const t = summary.totals;
  const items = [
    ["revenue (" + summary.days + " d)", usd(t.revenue_usd)],
    ["upstream cost", usd(t.upstream_cost_usd)],
    ["unbilled cost", usd(t.unbilled_cost_usd)],
    ["chain fees (" + t.chain_fee_transactions + " tx)", fees(t)],
    ["margin", usd(t.margin_usd), t.margin_usd.startsWith("-") ? "bad" : ""],
    ["settled calls", t.calls],
    ["revenue (24 h)", usd(summary.last_24h.revenue_usd)],
    ["failures (24 h)", summary.failures_24h, summary.failures_24h ? "warn" : ""],
    ["pending settlements", summary.pending.count + (summary.pending.stuck ? " (" +
      summary.pending.stuck + " stuck)" : ""), summary.pending.stuck ? "bad" : ""],
  ];
  $("cards").replaceChildren(...items.map(([label, value, className]) => {
    const card = el("div", null, "card " + (className || ""));
    card.append(el("div", label, "label"), el("div", value, "value"));
    card.dataset.label = label;
    return card;
  }));
}

function days(since, until) {
  const out = [];
  const day = new Date(since.slice(0, 10) + "T00:00:00Z");
  const end = new Date(until);
  while (day < end && out.length < 400) {
    out.push(day.toISOString().slice(0, 10));
    day.setUTCDate(day.getUTCDate() + 1);
  }
  return out;
}

function chart(report) {
  const byDay = new Map(report.lines.map((line) => [line.day, line]));
  const series = days(report.period.since, report.period.until || new Date().toISOString()).map((day) => {
    const line = byDay.get(day);
    return { day, revenue: line ? Number(line.revenue_atomic) / 1e6 : 0,
             revenueText: line ? line.revenue_usd : "0", calls: line ? line.calls : 0 };
  });
  const width = 760, height = 260, left = 64, right = 48, top = 16, bottom = 32;
  const plotW = width - left - right, plotH = height - top - bottom;
  const maxRevenue = Math.max(...series.map((p) => p.revenue), 0) || 1;
  const maxCalls = Math.max(...series.map((p) => p.calls), 0) || 1;
  const step = plotW / Math.max(series.length, 1);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "revenue and settled calls per day" });
  root.append(svg("line", { x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis" }));
  root.append(svg("text", { x: left - 6, y: top + 10, "text-anchor": "end" },
    "$" + maxRevenue.toFixed(maxRevenue < 1 ? 6 : 2).replace(/\.?0+$/, "")));
  root.append(svg("text", { x: left - 6, y: top + plotH, "text-anchor": "end" }, "$0"));
  root.append(svg("text", { x: left + plotW + 6, y: top + 10 }, maxCalls + " calls"));
  if (series.length) {
    root.append(svg("text", { x: left, y: height - 10 }, series[0].day));
    root.append(svg("text", { x: left + plotW, y: height - 10, "text-anchor": "end" },
      series[series.length - 1].day));
  }
  const points = [];
  series.forEach((p, i) => {
    const x = left + i * step;
    const barH = (p.revenue / maxRevenue) * plotH;
    const bar = svg("rect", { x: x + step * 0.15, y: top + plotH - barH, width: step * 0.7,
      height: barH, class: "bar", "data-day": p.day, "data-revenue": p.revenueText });
    bar.append(svg("title", {}, `${p.day}: ${usd(p.revenueText)}`));
    root.append(bar);
    const cx = x + step / 2, cy = top + plotH - (p.calls / maxCalls) * plotH;
    points.push(`${cx.toFixed(1)},${cy.toFixed(1)}`);
  });
  root.append(svg("polyline", { points: points.join(" "), class: "calls" }));
  series.forEach((p, i) => {
    const [cx, cy] = points[i].split(",");
    const dot = svg("circle", { cx, cy, r: 3, class: "point", "data-day": p.day, "data-calls": p.calls });
    dot.append(svg("title", {}, `${p.day}: ${p.calls} settled calls`));
    root.append(dot);
  });
  $("chart").replaceChildren(root);
}

// The channels: totals per network and token, then the channels with the most unclaimed. The
// next claim of a channel with nothing unclaimed, or held for the operator (quarantined), is none.
function channels(report) {
  const states = (counts) => Object.entries(counts).filter(([, n]) => n)
    .map(([state, n]) => n + " " + state).join(", ");
  const since = (iso) => (iso ? age((Date.now() - Date.parse(iso)) / 1000) + " ago" : "-");
  table($("channel-totals"), [
    ["network", (r) => r.network, "clip"],
    ["token", (r) => short(r.token), "mono", (r) => r.token],
    ["channels", (r) => states(r.by_state), "wrap"],
    ["balance", (r) => usd(r.balance_usd), "num"],
    ["charged", (r) => usd(r.charged_usd), "num"],
    ["claimed", (r) => usd(r.claimed_usd), "num"],
    ["unclaimed", (r) => usd(r.unclaimed_usd), "num"],
    ["escrow", (r) => usd(r.escrow_usd), "num"],
    ["next claim (UTC)", (r) => when(r.next_claim_at)],
    ["oldest read", (r) => since(r.oldest_sync_at)],
  ], report.totals, "no channel yet");
  const due = (r) => (r.unclaimed_atomic > 0 && r.state !== "quarantined" ? when(r.claim_due_at) : "-");
  table($("channels"), [
    ["channel", (r) => short(r.channel_id), "mono", (r) => r.channel_id],
    ["payer", (r) => r.payer, "mono clip"],
    ["state", (r) => r.state],
    ["balance", (r) => usd(r.balance_usd), "num"],
    ["charged", (r) => usd(r.charged_usd), "num"],
    ["claimed", (r) => usd(r.claimed_usd), "num"],
    ["unclaimed", (r) => usd(r.unclaimed_usd), "num"],
    ["next claim (UTC)", due],
  ], report.channels.map((r) => ({ ...r, stuck: r.state === "quarantined" })), "no channel yet");
}

function render(summary, byDay, bySkill, payments, failures, pending, channelReport) {
  cards(summary);
  chart(byDay);
  table($("margin"), [
    ["skill", (r) => r.skill],
    ["calls", (r) => r.calls, "num"],
    ["revenue", (r) => usd(r.revenue_usd), "num"],
    ["upstream cost", (r) => usd(r.upstream_cost_usd), "num"],
    ["unbilled cost", (r) => usd(r.unbilled_cost_usd), "num"],
    ["chain fees", fees, "num"],
    ["margin", (r) => usd(r.margin_usd), "num"],
    ["failed", (r) => r.failed_calls, "num"],
  ], bySkill.lines.map((r) => ({ ...r, skill: r.skill || "(no skill: refunds, channels)" })),
  "no payments in this period");
  const chain = summary.chain_fees;
  table($("fees"), [
    ["day (UTC)", (r) => r.day],
    ["network", (r) => r.network, "clip"],
    ["kind", (r) => r.kind],
    ["transactions", (r) => r.transactions, "num"],
    ["gas used", (r) => (r.gas_used === null ? "-" : r.gas_used), "num"],
    ["fee", (r) => r.fee + " " + r.unit, "num"],
    ["fee (USD)", (r) => (r.fee_usd === null ? "no price" : usd(r.fee_usd)), "num"],
  ], chain.lines, "no transaction fee recorded in this period");
  $("fees-note").textContent = chain.waiting || chain.missing
    ? chain.waiting + " transactions wait to have their fee read from the chain; " +
      chain.missing + " were given up (the node never knew them)"
    : "";
  table($("payments"), [
    ["created (UTC)", (r) => when(r.created_at)],
    ["state", (r) => r.state],
    ["skill", (r) => r.skill],
    ["network", (r) => r.network, "clip"],
    ["amount", (r) => usd(r.amount_usd), "num"],
    ["transaction", (r) => r.tx_hash || "-", "mono clip"],
  ], payments.payments, "no payments yet");
  table($("failures"), [
    ["when (UTC)", (r) => when(r.updated_at)],
    ["skill", (r) => r.skill],
    ["network", (r) => r.network, "clip"],
    ["amount", (r) => usd(r.amount_usd), "num"],
    ["unbilled cost", (r) => (r.upstream_cost_usd ? usd(r.upstream_cost_usd) : "-"), "num"],
    ["error", (r) => r.error || "-", "wrap"],
  ], failures.failures, "no failures");
  table($("pending"), [
    ["created (UTC)", (r) => when(r.created_at)],
    ["age", (r) => age(r.age_seconds), "num"],
    ["state", (r) => r.state + (r.stuck ? " (stuck)" : "")],
    ["skill", (r) => r.skill],
    ["amount", (r) => usd(r.amount_usd), "num"],
    ["transaction", (r) => r.tx_hash || "unknown", "mono clip"],
    ["reason", (r) => r.error || "-", "wrap"],
  ], pending.pending, "nothing waits to settle");
  channels(channelReport);
}

// -- loading -----------------------------------------------------------------------------------

async function load() {
  const period = $("days").value;
  const since = new Date(Date.now() - period * 86400000).toISOString().slice(0, 10);
  $("status").textContent = "loading…";
  try {
    const range = "&since=" + since;
    const parts = await Promise.all([
      api("summary?days=" + period),
      api("revenue?by=day" + range),
      api("revenue?by=skill" + range),
      api("payments?limit=20"),
      api("failures?limit=20"),
      api("pending?limit=50"),
      api("channels?limit=20"),
    ]);
    render(...parts);
    show("board");
    $("status").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
    document.body.dataset.loaded = "true";
  } catch (error) {
    if (error instanceof Unauthorized) {
      ask(error.message);
    } else {
      $("status").textContent = "could not load: " + error.message;
    }
  }
}

async function exportMonth() {
  const month = new Date().toISOString().slice(0, 7);
  try {
    const blob = await api("revenue.csv?by=skill,network,day&month=" + month);
    const link = el("a");
    link.href = URL.createObjectURL(blob);
    link.download = "revenue-" + month + ".csv";
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  } catch (error) {
    if (error instanceof Unauthorized) ask(error.message);
    else $("status").textContent = "could not export: " + error.message;
  }
}

function show(which) {
  $("login").hidden = which !== "login";
  $("board").hidden = which !== "board";
  $("controls").hidden = which !== "board";
}

function ask(message) {
  clearInterval(refreshTimer);
  refreshTimer = null;
  show("login");
  $("status").textContent = "";
  $("login-error").textContent = message || "";
  $("token").value = "";
  $("token").focus();
}

function start() {
  show("board");
  clearInterval(refreshTimer);
  refreshTimer = setInterval(() => { if (!document.hidden) load(); }, REFRESH_MS);
  load();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("refresh").addEventListener("click", load);
  $("days").addEventListener("change", load);
  $("export").addEventListener("click", exportMonth);
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    ask("");
  });
  if (sessionStorage.getItem(TOKEN_KEY)) start();
  else ask("");
});
