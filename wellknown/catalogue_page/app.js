// The catalogue page: reads this server's JSON (the marketplace catalogue API, searched, filtered
// and paged on the server; the models; one skill's snippets when opened) and draws it. Everything
// a skill's author wrote reaches the DOM as text (textContent), never as HTML. No library, nothing
// fetched from anywhere but this server.
"use strict";

const PAGE_SIZE = 20;
const SEARCH_DELAY_MS = 250;
const SNIPPET_LABELS = {
  curl: "Ask the price: an unpaid call answers HTTP 402 with the quote",
  pay: "Pay with paywire pay (prints the result and the receipt)",
  python: "Python: pays with an x402 client",
  mcp: "MCP client config (paywire's MCP server, streamable HTTP)",
  mcp_stdio: "MCP client config via paywire mcp (a local server paying from your key, with caps)",
};
// Why a skill cannot be bought here now (the server's `reason`), as a badge; its full text on hover.
const UNAVAILABLE = "unavailable";

const $ = (id) => document.getElementById(id);
const state = { q: "", category: "", page: 1 };
let skillsRequest = 0;
let models = [];

// -- small helpers (text only) ----------------------------------------------------------------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

async function getJson(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "omit" });
  let body = null;
  try {
    body = await response.json();
  } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const message = body && body.error && body.error.message;
    throw new Error(message || response.status + " " + response.statusText);
  }
  return body;
}

function priceText(price) {
  if (!price) return "";
  if (price.pricing === "free") return "free";
  if (price.pricing === "fixed") return "$" + price.price.usd + " per call";
  const low = price.min ? "$" + price.min.usd : null;
  const high = price.max ? "$" + price.max.usd : null;
  if (low && high) return low + " to " + high + " per call";
  if (low) return "from " + low + " per call";
  return "priced per request";
}

function priceNode(price) {
  const node = el("span", priceText(price), "price");
  if (price) {
    node.title = price.summary || "";
    node.dataset.pricing = price.pricing;
    if (price.price) {
      node.dataset.usd = price.price.usd;
      node.dataset.atomic = price.price.atomic;
    }
    if (price.min) node.dataset.minUsd = price.min.usd;
    if (price.max) node.dataset.maxUsd = price.max.usd;
  }
  return node;
}

function skillPath(id) {
  return "/catalogue/skills/" + id.split("/").map(encodeURIComponent).join("/");
}

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (_) {
    button.textContent = "Select and copy";  // no clipboard outside a secure context
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

function snippetBlock(name, label, text) {
  const block = el("div", null, "snippet");
  const head = el("div", null, "snippet-head");
  head.append(el("span", label, "snippet-label"));
  const button = el("button", "Copy", "copy");
  button.type = "button";
  button.addEventListener("click", () => copy(text, button));
  head.append(button);
  const pre = el("pre");
  pre.dataset.snippet = name;
  pre.append(el("code", text));
  block.append(head, pre);
  return block;
}

// -- one skill's details: example and snippets ---------------------------------------------------

async function showDetails(id, container, button) {
  if (!container.hidden) {
    container.hidden = true;
    button.setAttribute("aria-expanded", "false");
    return;
  }
  container.hidden = false;
  button.setAttribute("aria-expanded", "true");
  if (container.dataset.loaded === "true") return;
  container.replaceChildren(el("p", "Loading…", "muted"));
  try {
    const detail = await getJson(skillPath(id));
    container.replaceChildren();
    container.append(el("p", detail.price.summary, "summary"));
    const endpoint = el("p", null, "endpoint");
    endpoint.append(el("span", detail.method + " "), el("code", detail.endpoint));
    container.append(endpoint);
    const tool = el("p", null, "tool");
    if (detail.mcp_tool) {
      tool.append(el("span", "MCP tool "), el("code", detail.mcp_tool));
      if (detail.kind === "model") {
        tool.append(el("span", " with "), el("code", JSON.stringify({ model: detail.id })),
          el("span", " (the tool offers the models available on this gateway)"));
      }
    } else {
      tool.textContent = "REST only: a file upload (multipart), not an MCP tool";
    }
    container.append(tool);
    container.append(el("h4", "Example input"));
    const example = el("pre", null, "example");
    example.append(el("code", JSON.stringify(detail.example, null, 2)));
    container.append(example);
    const snippets = el("div", null, "snippets");
    for (const [name, text] of Object.entries(detail.snippets)) {
      let label = SNIPPET_LABELS[name] || name;
      if (name === "python" && detail.kind === "model") label = "Python: the openai package, paying with x402";
      snippets.append(snippetBlock(name, label, text));
    }
    container.append(snippets);
    container.dataset.loaded = "true";
  } catch (error) {
    container.replaceChildren(el("p", "Could not load: " + error.message, "error"));
  }
}

function detailsButton(id, container) {
  const button = el("button", "How to call", "details");
  button.type = "button";
  button.setAttribute("aria-expanded", "false");
  button.addEventListener("click", () => showDetails(id, container, button));
  return button;
}

// -- skills: searched, filtered and paged by the server -----------------------------------------

function skillItem(item) {
  const li = el("li", null, "skill");
  li.dataset.id = item.resource_id;
  const head = el("div", null, "skill-head");
  head.append(el("h3", item.name), el("code", item.resource_id, "id"), priceNode(item.price));
  const tags = el("span", null, "tags");
  for (const category of item.categories || []) tags.append(el("span", category, "tag"));
  head.append(tags);
  if (!item.available) {
    const badge = el("span", UNAVAILABLE, "badge off");
    badge.title = item.reason || "";
    head.append(badge);
  }
  li.dataset.available = String(Boolean(item.available));
  const container = el("div", null, "detail");
  container.hidden = true;
  head.append(detailsButton(item.resource_id, container));
  li.append(head, el("p", item.description, "description"));
  if (!item.available && item.reason) li.append(el("p", item.reason, "reason"));
  li.append(container);
  return li;
}

function fillCategories(categories) {
  const select = $("category");
  const options = [el("option", "all categories")];
  options[0].value = "";
  const listed = [...categories];
  if (state.category && !listed.some((c) => c.category.toLowerCase() === state.category.toLowerCase())) {
    listed.push({ category: state.category, count: 0 });  // keep the chosen one when a search leaves none
  }
  const names = listed.map((c) => c.category);
  for (const category of listed) {
    const option = el("option", category.category + " (" + category.count + ")");
    option.value = category.category;
    options.push(option);
  }
  select.replaceChildren(...options);
  select.value = names.find((n) => n.toLowerCase() === state.category.toLowerCase()) || "";
}

function query() {
  const params = new URLSearchParams();
  if (state.q) params.set("q", state.q);
  if (state.category) params.set("category", state.category);
  params.set("page", String(state.page));
  params.set("page_size", String(PAGE_SIZE));
  return params;
}

async function loadSkills() {
  const ticket = ++skillsRequest;
  const params = query();
  $("skills-status").textContent = "Loading…";
  let data;
  try {
    data = (await getJson("/api/marketplace/apis?" + params.toString())).data;
  } catch (error) {
    if (ticket === skillsRequest) $("skills-status").textContent = "Could not load the skills: " + error.message;
    return;
  }
  if (ticket !== skillsRequest) return;  // a newer search answered first or is on its way
  const pages = Math.max(1, Math.ceil(data.total / data.page_size));
  $("skill-list").replaceChildren(...data.items.map(skillItem));
  fillCategories(data.categories);
  const first = data.total ? (data.page - 1) * data.page_size + 1 : 0;
  const last = Math.min(data.total, data.page * data.page_size);
  $("skills-status").textContent = data.total
    ? data.total + " skills" + (state.q || state.category ? " found" : "") + ", showing " + first + "–" + last
    : "No skill matches.";
  $("pager").hidden = pages <= 1;
  $("page-info").textContent = "page " + data.page + " of " + pages;
  $("prev").disabled = data.page <= 1;
  $("next").disabled = data.page >= pages;
  const shown = new URLSearchParams(params);
  shown.delete("page_size");
  if (state.page === 1) shown.delete("page");
  const search = shown.toString();
  history.replaceState(null, "", search ? "?" + search : location.pathname);
  document.body.dataset.skillsQuery = params.toString();  // what is on screen (tests wait on it)
}

let searchTimer = null;

function search(immediately) {
  clearTimeout(searchTimer);
  const run = () => {
    state.q = $("q").value.trim();
    state.category = $("category").value;
    state.page = 1;
    loadSkills();
  };
  if (immediately) run();
  else searchTimer = setTimeout(run, SEARCH_DELAY_MS);
}

// -- models: ~100 rows, filtered here ------------------------------------------------------------

function perMtok(pricing, name) {
  return pricing && pricing[name] !== undefined ? "$" + pricing[name] : "–";
}

function availability(model) {
  if (model.available) return el("span", "available", "badge on");
  const configured = !(model.enable_with && model.enable_with.length);
  const badge = el("span", configured ? UNAVAILABLE : "needs " + model.enable_with.join(" or "), "badge off");
  badge.title = model.reason || "";
  return badge;
}

function modelRows(model) {
  const row = el("tr", null, "model");
  row.dataset.id = model.id;
  row.dataset.available = String(Boolean(model.available));
  const name = el("td", null, "model-id");
  name.append(el("code", model.id));
  const price = el("td");
  price.append(priceNode(model.price));
  const status = el("td", null, "availability");
  status.append(availability(model));
  const container = el("div", null, "detail");
  container.hidden = true;
  const action = el("td");
  action.append(detailsButton(model.id, container));
  row.append(name, el("td", model.family || ""), el("td", model.endpoint || ""), price,
    el("td", perMtok(model.pricing, "input_per_mtok"), "num"),
    el("td", perMtok(model.pricing, "output_per_mtok"), "num"),
    el("td", model.context_window ? model.context_window.toLocaleString("en-US") : "–", "num"),
    status, action);
  const detailRow = el("tr", null, "model-detail");
  const cell = el("td");
  cell.colSpan = 9;
  cell.append(container);
  detailRow.append(cell);
  return [row, detailRow];
}

function drawModels() {
  const needle = $("model-filter").value.trim().toLowerCase();
  const onlyAvailable = $("available-only").checked;
  const shown = models.filter((m) => (!onlyAvailable || m.available) && (!needle || [
    m.id, m.name, m.family, ...(m.operations || [])].some((v) => v && String(v).toLowerCase().includes(needle))));
  $("model-table").tBodies[0].replaceChildren(...shown.flatMap(modelRows));
  const available = models.filter((m) => m.available).length;
  $("models-status").textContent = shown.length + " of " + models.length + " models shown; " +
    available + " available on this gateway";
}

async function loadModels() {
  try {
    models = (await getJson("/catalogue/models")).data;
  } catch (error) {
    $("models-status").textContent = "Could not load the models: " + error.message;
    return;
  }
  drawModels();
  document.body.dataset.modelsLoaded = "true";
}

// -- connect: the MCP configurations, and what payments are on this gateway ---------------------

async function loadConnect() {
  try {
    const about = await getJson("/");
    $("mcp-url").textContent = about.links.mcp;
    $("payments-note").textContent = about.payments.note;
    $("connect-snippets").replaceChildren(
      snippetBlock("connect-mcp", SNIPPET_LABELS.mcp, about.mcp_config.http),
      snippetBlock("connect-mcp-stdio", SNIPPET_LABELS.mcp_stdio, about.mcp_config.stdio),
      snippetBlock("connect-stdio", "Or run it yourself: paywire mcp pays from your key", about.mcp_stdio));
  } catch (_) { /* the section keeps its text */ }
}

// -- start ----------------------------------------------------------------------------------------

function start() {
  const given = new URLSearchParams(location.search);
  state.q = (given.get("q") || "").slice(0, 200);
  state.category = (given.get("category") || "").slice(0, 200);
  const page = Number.parseInt(given.get("page") || "1", 10);
  state.page = Number.isFinite(page) && page > 0 ? page : 1;
  $("q").value = state.q;

  $("search").addEventListener("submit", (event) => { event.preventDefault(); search(true); });
  $("q").addEventListener("input", () => search(false));
  $("category").addEventListener("change", () => search(true));
  $("prev").addEventListener("click", () => { state.page -= 1; loadSkills(); });
  $("next").addEventListener("click", () => { state.page += 1; loadSkills(); });
  $("model-search").addEventListener("submit", (event) => event.preventDefault());
  $("model-filter").addEventListener("input", drawModels);
  $("available-only").addEventListener("change", drawModels);

  Promise.all([loadSkills(), loadModels(), loadConnect()]).then(() => {
    document.body.dataset.loaded = "true";
  });
}

document.addEventListener("DOMContentLoaded", start);
