// The gateway's page: Chat, Playground and Status over /api/*. Vanilla JS, no build step.
"use strict";

const KEY_STORAGE = "vllmmlxd.apiKey";
const STATUS_EVERY_MS = 2000;
const MODELS_EVERY_MS = 10000;

const $ = (id) => document.getElementById(id);
const state = {
  tab: "chat",
  history: [], // [{role, content}] of the chat so far
  chatRun: null, // {controller} while a chat answer streams
  pgRun: null, // same for the playground
  statusTimer: null,
};

// ---------- calls ----------

function authHeaders() {
  const key = localStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: "Bearer " + key } : {};
}

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The message of an error body, whichever shape it has ({error: {message}}, {detail}, text).
async function errorMessage(response) {
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text);
    const err = body.error;
    if (err) return typeof err === "string" ? err : err.message || JSON.stringify(err);
    if (body.detail) return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch (_) { /* not JSON */ }
  return text.trim().slice(0, 300) || response.statusText || "HTTP " + response.status;
}

async function request(method, path, body, signal) {
  const headers = { ...authHeaders() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, signal, cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    const message = await errorMessage(response);
    if (response.status === 401 || response.status === 403) needKey(response.status, message);
    throw new HttpError(response.status, message);
  }
  return response;
}

async function getJson(path) {
  const response = await request("GET", path);
  return response.json();
}

// Server-sent events of one response: calls onData(json) per `data:` event, onComment() per
// keep-alive comment; returns at `data: [DONE]` or at the end of the stream.
async function readEvents(response, onData, onComment) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data = [];
  const dispatch = () => {
    if (!data.length) return false;
    const payload = data.join("\n");
    data = [];
    if (payload.trim() === "[DONE]") return true;
    try {
      onData(JSON.parse(payload));
    } catch (err) {
      if (err instanceof SyntaxError) return false; // not JSON: ignore
      throw err;
    }
    return false;
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = done ? "" : lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (dispatch()) return;
        } else if (line.startsWith(":")) {
          onComment(line.slice(1).trim());
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        }
      }
      if (done) { dispatch(); return; }
    }
  } finally {
    reader.cancel().catch(() => {}); // a no-op once the stream ended; otherwise it closes the connection
  }
}

// ---------- notices, auth, health ----------

function notice(text) {
  const el = $("notice");
  el.textContent = text || "";
  el.hidden = !text;
}

function needKey(status, message) {
  const has = Boolean(localStorage.getItem(KEY_STORAGE));
  notice((status === 401 ? (has ? "The API key was refused" : "This gateway needs an API key")
    : "This API key may not do that") + ": " + message + ". Set the key under Settings.");
  $("settings").open = true;
}

function setupSettings() {
  const input = $("api-key");
  input.value = localStorage.getItem(KEY_STORAGE) || "";
  input.addEventListener("change", () => {
    const key = input.value.trim();
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
    notice("");
    refreshModels();
    refreshHealth();
    if (state.tab === "status") refreshStatus();
    updateCode();
  });
}

async function refreshHealth() {
  const badge = $("health");
  try {
    // 503 ("down") still carries the per-model lines.
    const response = await fetch("/api/health", { headers: authHeaders(), cache: "no-store" });
    if (!response.ok && response.status !== 503) throw new HttpError(response.status, await errorMessage(response));
    const health = await response.json();
    const models = Object.values(health.models || {});
    const ok = models.filter((m) => m.ok).length;
    badge.textContent = (health.status || "?") + (models.length ? " · " + ok + "/" + models.length + " up" : "");
    badge.dataset.state = { ok: "ok", degraded: "warn" }[health.status] || "bad";
    badge.title = models.map((m) => (m.model || "?") + ": " + (m.state || "?")).join("\n") || "Gateway health";
  } catch (err) {
    badge.textContent = err.status ? "HTTP " + err.status : "offline";
    badge.dataset.state = "bad";
    badge.title = err.message;
  }
}

// ---------- models and parameters ----------

// /api/models: {data: [{id (the entry), name (the served name), state}]}; an OpenAI card list works too.
function modelList(body) {
  const items = Array.isArray(body) ? body : body.data || body.models || [];
  return items.map((m) => {
    const id = m.id || m.name;
    return { id, served: m.name || m.served_model_name || id, state: m.state || m.status || "" };
  }).filter((m) => m.id);
}

function modelLabel(m) {
  const name = m.served && m.served !== m.id ? m.id + " — " + m.served : m.id;
  return m.state ? name + " (" + m.state + ")" : name;
}

async function refreshModels() {
  const select = $("model");
  try {
    const models = modelList(await getJson("/api/models"));
    const current = select.value || localStorage.getItem("vllmmlxd.model");
    select.replaceChildren(...models.map((m) => {
      const option = new Option(modelLabel(m), m.id);
      option.dataset.state = m.state;
      option.dataset.served = m.served;
      return option;
    }));
    if (!models.length) select.append(new Option("no models", ""));
    if (models.some((m) => m.id === current)) select.value = current;
    updateCode();
  } catch (err) {
    // 401/403: every model needs a key this page lacks (request() has said so and opened Settings).
    if (err.status === 401 || err.status === 403) select.replaceChildren(new Option("API key needed", ""));
    else if (!select.options.length) select.append(new Option("models unavailable", ""));
  }
}

function num(id, fallback) {
  const v = parseFloat($(id).value);
  return Number.isFinite(v) ? v : fallback;
}

function params() {
  const seed = parseInt($("seed").value, 10); // set: the same answer again, for the same settings
  return {
    model: $("model").value,
    max_tokens: Math.max(1, Math.round(num("max-tokens", 512))),
    temperature: num("temperature", 0.7),
    top_p: num("top-p", 1),
    ...(Number.isFinite(seed) ? { seed } : {}),
  };
}

// ---------- tabs ----------

const TABS = ["chat", "playground", "status"];

function showTab(name, focus) {
  state.tab = name;
  for (const t of TABS) {
    const tab = $("tab-" + t);
    const selected = t === name;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $("panel-" + t).hidden = !selected;
    if (selected && focus) tab.focus();
  }
  $("params").hidden = name === "status";
  $("system-wrap").hidden = name !== "chat";
  document.body.dataset.tab = name;
  if (name === "status") refreshStatus();
  else clearTimeout(state.statusTimer);
  if (name === "playground") updateCode();
}

function setupTabs() {
  TABS.forEach((t, i) => {
    const tab = $("tab-" + t);
    tab.addEventListener("click", () => showTab(t));
    tab.addEventListener("keydown", (e) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (step) showTab(TABS[(i + step + TABS.length) % TABS.length], true);
      else if (e.key === "Home") showTab(TABS[0], true);
      else if (e.key === "End") showTab(TABS[TABS.length - 1], true);
      else return;
      e.preventDefault();
    });
  });
}

// ---------- chat ----------

function addMessage(role, text) {
  $("chat-empty").hidden = true;
  const box = document.createElement("article");
  box.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "You" : role === "assistant" ? "Assistant" : "Error";
  const body = document.createElement("div");
  body.className = "body";
  if (role === "user") body.textContent = text;
  box.append(who, body);
  $("chat-log").append(box);
  scrollChat();
  return box;
}

function scrollChat() {
  const log = $("chat-log");
  log.scrollTop = log.scrollHeight;
}

// What one streamed answer shows, re-rendered at most once per frame.
function answerView(box) {
  const view = { box, text: "", reasoning: "", pending: false, details: null };
  view.render = () => {
    if (view.pending) return;
    view.pending = true;
    requestAnimationFrame(() => {
      view.pending = false;
      if (view.reasoning) {
        if (!view.details) {
          view.details = document.createElement("details");
          view.details.className = "reasoning";
          view.details.innerHTML = "<summary>Reasoning</summary><div class=\"reasoning-text\"></div>";
          box.querySelector(".who").after(view.details);
        }
        view.details.querySelector(".reasoning-text").textContent = view.reasoning;
      }
      box.querySelector(".body").innerHTML = Markdown.render(view.text);
      scrollChat();
    });
  };
  return view;
}

function setMeta(box, text) {
  let meta = box.querySelector(".meta");
  if (!meta) {
    meta = document.createElement("p");
    meta.className = "meta";
    box.append(meta);
  }
  meta.textContent = text;
}

// Timing of one generation: time to first token, tokens per second after it.
function meter() {
  const m = { start: performance.now(), first: null, chunks: 0, usage: null };
  m.token = () => { if (m.first === null) m.first = performance.now(); m.chunks++; };
  m.summary = (stopped) => {
    const end = performance.now();
    const tokens = (m.usage && m.usage.completion_tokens) || m.chunks;
    const parts = [];
    if (m.first !== null) {
      parts.push("first token " + ((m.first - m.start) / 1000).toFixed(2) + " s");
      const secs = (end - m.first) / 1000;
      if (tokens > 1 && secs > 0) parts.push((tokens / secs).toFixed(1) + " tok/s");
    }
    parts.push(tokens + " tokens");
    if (stopped) parts.push("stopped");
    return parts.join(" · ");
  };
  return m;
}

function setRunning(prefix, running) {
  $(prefix + "-stop").disabled = !running;
  $(prefix === "chat" ? "chat-send" : "pg-run").disabled = running;
}

async function sendChat() {
  const input = $("chat-input");
  const text = input.value.trim();
  const p = params();
  if (!text || state.chatRun) return;
  if (!p.model) { notice("No model to talk to yet."); return; }
  notice("");
  input.value = "";
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const box = addMessage("assistant");
  const view = answerView(box);
  const m = meter();
  const controller = new AbortController();
  state.chatRun = { controller };
  setRunning("chat", true);
  setMeta(box, "waiting…");
  const body = { ...p, messages: state.history.slice() };
  const system = $("system").value.trim();
  if (system) body.system = system;
  let stopped = false;
  try {
    const response = await request("POST", "/api/chat", body, controller.signal);
    await readEvents(response, (event) => {
      if (event.error) throw new Error(event.error.message || JSON.stringify(event.error));
      if (event.usage) m.usage = event.usage;
      const delta = (event.choices && event.choices[0] && event.choices[0].delta) || {};
      const reasoning = delta.reasoning_content || delta.reasoning || "";
      if (delta.content || reasoning) {
        m.token();
        view.text += delta.content || "";
        view.reasoning += reasoning;
        view.render();
        setMeta(box, "generating…");
      }
    }, () => { if (m.first === null) setMeta(box, "loading model…"); });
  } catch (err) {
    if (err.name === "AbortError") stopped = true;
    else showError(box, err);
  } finally {
    state.chatRun = null;
    setRunning("chat", false);
  }
  view.render();
  if (view.text) state.history.push({ role: "assistant", content: view.text });
  else if (!stopped && !box.classList.contains("failed")) view.text = "*(empty answer)*";
  setMeta(box, m.summary(stopped));
  box.dataset.done = stopped ? "stopped" : "done";
}

function showError(box, err) {
  box.classList.add("failed");
  const p = document.createElement("p");
  p.className = "error";
  p.textContent = (err.status ? "HTTP " + err.status + ": " : "") + err.message;
  box.append(p);
}

function stopChat() {
  if (state.chatRun) state.chatRun.controller.abort();
}

function setupChat() {
  $("chat-form").addEventListener("submit", sendChat);
  $("chat-stop").addEventListener("click", stopChat);
  $("chat-clear").addEventListener("click", () => {
    stopChat();
    state.history = [];
    $("chat-log").querySelectorAll(".msg").forEach((el) => el.remove());
    $("chat-empty").hidden = false;
    $("chat-input").focus();
  });
  $("chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      sendChat();
    }
  });
}

// ---------- playground ----------

function completionBody() {
  return { ...params(), prompt: $("pg-prompt").value, stream: true };
}

async function runCompletion() {
  if (state.pgRun) return;
  const body = completionBody();
  if (!body.model) { notice("No model to run yet."); return; }
  notice("");
  const out = $("pg-output");
  out.textContent = "";
  out.classList.remove("error");
  const m = meter();
  const controller = new AbortController();
  state.pgRun = { controller };
  setRunning("pg", true);
  $("pg-meta").textContent = "waiting…";
  let stopped = false;
  try {
    const response = await request("POST", "/api/complete", body, controller.signal);
    await readEvents(response, (event) => {
      if (event.error) throw new Error(event.error.message || JSON.stringify(event.error));
      if (event.usage) m.usage = event.usage;
      const text = event.choices && event.choices[0] && event.choices[0].text;
      if (text) {
        m.token();
        out.textContent += text;
        $("pg-meta").textContent = "generating…";
      }
    }, () => { if (m.first === null) $("pg-meta").textContent = "loading model…"; });
  } catch (err) {
    if (err.name === "AbortError") stopped = true;
    else {
      out.classList.add("error");
      out.textContent += (out.textContent ? "\n\n" : "") + (err.status ? "HTTP " + err.status + ": " : "") + err.message;
    }
  } finally {
    state.pgRun = null;
    setRunning("pg", false);
  }
  $("pg-meta").textContent = m.summary(stopped);
}

function stopCompletion() {
  if (state.pgRun) state.pgRun.controller.abort();
}

function shellQuote(text) {
  return "'" + text.replace(/'/g, "'\\''") + "'";
}

// The playground's request as curl and as Python, against the OpenAI API this origin serves.
function updateCode() {
  const option = $("model").selectedOptions[0];
  // The OpenAI API knows the model by its served name (the entry's key works too).
  const body = { ...completionBody(), model: (option && option.dataset.served) || $("model").value };
  const base = location.origin + "/v1";
  const key = Boolean(localStorage.getItem(KEY_STORAGE));
  $("pg-curl").textContent = [
    "curl " + base + "/completions \\",
    "  -H 'Content-Type: application/json' \\",
    ...(key ? ['  -H "Authorization: Bearer $VLLMMLXD_API_KEY" \\'] : []),
    "  -d " + shellQuote(JSON.stringify(body, null, 2)),
  ].join("\n");
  $("pg-python").textContent = [
    ...(key ? ["import os", ""] : []),
    "from openai import OpenAI",
    "",
    "client = OpenAI(base_url=" + JSON.stringify(base) + ", api_key="
      + (key ? 'os.environ["VLLMMLXD_API_KEY"]' : '"none"') + ")",
    "stream = client.completions.create(",
    "    model=" + JSON.stringify(body.model) + ",",
    "    prompt=" + JSON.stringify(body.prompt) + ",",
    "    max_tokens=" + body.max_tokens + ",",
    "    temperature=" + body.temperature + ",",
    "    top_p=" + body.top_p + ",",
    ...(body.seed !== undefined ? ["    seed=" + body.seed + ","] : []),
    "    stream=True,",
    ")",
    "for chunk in stream:",
    '    print(chunk.choices[0].text, end="", flush=True)',
  ].join("\n");
}

async function copyText(button) {
  const text = $(button.dataset.copy).textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) { // no clipboard API outside secure contexts: select and copy
    const area = document.createElement("textarea");
    area.value = text;
    area.className = "sr-only";
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

function setupPlayground() {
  $("pg-form").addEventListener("submit", runCompletion);
  $("pg-stop").addEventListener("click", stopCompletion);
  $("pg-prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      runCompletion();
    }
  });
  for (const id of ["pg-prompt", "model", "temperature", "top-p", "max-tokens", "seed"]) $(id).addEventListener("input", updateCode);
  $("model").addEventListener("change", () => localStorage.setItem("vllmmlxd.model", $("model").value));
  document.querySelectorAll("button.copy").forEach((b) => b.addEventListener("click", () => copyText(b)));
}

// ---------- status ----------

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
}

const dash = (v) => (v === null || v === undefined ? "-" : String(v));

// Decimal units, as the hub and vllmmlxctl show sizes.
function size(n) {
  if (n === null || n === undefined) return "?";
  for (const [unit, k] of [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) {
    if (n >= k) return (n / k).toFixed(n / k < 10 ? 2 : 1) + " " + unit;
  }
  return Math.floor(n) + " B";
}

// A pull's progress: "37% of 4.27 GB · 12.5 MB/s · 2m48s left", or its step.
function pullProgress(p) {
  if (p.state !== "downloading" || p.percent == null) return p.state;
  const parts = [p.percent + "% of " + size(p.total_bytes)];
  if (p.bytes_per_s) parts.push(size(p.bytes_per_s) + "/s");
  if (p.eta_s != null) parts.push(duration(p.eta_s) + " left");
  return parts.join(" · ");
}

function stateText(m) {
  const d = m.download;
  return m.state === "downloading" && d && d.percent != null ? "downloading " + d.percent + "%" : m.state;
}

function statusRow(m) {
  const keys = m.keys === null || m.keys === undefined ? "open" : m.keys.join(",") || "none";
  const cache = m.cache_mb == null || m.cache_budget_mb == null ? "-" : m.cache_mb + "/" + m.cache_budget_mb + " MB";
  const cells = [m.name, stateText(m), dash(m.pid), m.host ? m.host + ":" + m.port : dash(m.port), keys, duration(m.uptime_s),
    dash(m.restarts), dash(m.running), dash(m.waiting), m.tokens_per_s == null ? "-" : String(m.tokens_per_s), cache];
  const tr = document.createElement("tr");
  tr.dataset.model = m.name;
  cells.forEach((text, i) => {
    const td = document.createElement(i === 0 ? "th" : "td");
    if (i === 0) td.scope = "row";
    td.textContent = text;
    if (i === 0 && m.served_model_name && m.served_model_name !== m.name) td.title = "served as " + m.served_model_name;
    if (i === 1) td.className = "state state-" + String(m.state).replace(/\W/g, "");
    tr.append(td);
  });
  const rows = [tr];
  if (m.last_error && m.state !== "ready") {
    const err = document.createElement("tr");
    err.className = "row-error";
    const td = document.createElement("td");
    td.colSpan = cells.length;
    td.textContent = m.last_error;
    err.append(td);
    rows.push(err);
  }
  return rows;
}

function daemonLine(d) {
  if (!d) return "";
  // Pids, the config's path and error output are the operator's (vllmmlxctl status): the gateway leaves them out.
  const parts = [d.pid ? "daemon pid " + d.pid : "daemon", "up " + duration(d.uptime_s)];
  if (d.version) parts.push("version " + d.version);
  if (d.config_path) parts.push("config " + d.config_path + (d.config_missing ? " (missing)" : ""));
  const r = d.last_reload;
  if (r) parts.push("last reload " + new Date(r.at * 1000).toLocaleTimeString() + (r.ok ? " ok" : " failed: " + (r.error || "?")));
  return parts.join(" · ");
}

function gatewayLine(g) {
  if (!g) return "";
  const parts = ["gateway " + g.state, ...(g.pid ? ["pid " + g.pid] : []), g.host + ":" + g.port,
    "up " + duration(g.uptime_s)];
  if (g.restarts) parts.push(g.restarts + " restarts");
  if (g.last_error && g.state !== "ready") parts.push(g.last_error);
  return parts.join(" · ");
}

async function refreshStatus() {
  clearTimeout(state.statusTimer);
  try {
    const status = await getJson("/api/status");
    const pulls = (status.pulls || []).map((p) => "pulling " + p.repo + ": " + pullProgress(p));
    $("daemon-info").textContent = [daemonLine(status.daemon), gatewayLine(status.gateway), ...pulls]
      .filter(Boolean).join("\n");
    $("status-table").tBodies[0].replaceChildren(...(status.models || []).flatMap(statusRow));
    $("status-updated").textContent = "updated " + new Date().toLocaleTimeString();
    refreshHealth();
  } catch (err) {
    $("status-updated").textContent = "could not read the status: " + (err.status ? "HTTP " + err.status + ": " : "") + err.message;
  }
  if (state.tab === "status" && document.visibilityState === "visible") {
    state.statusTimer = setTimeout(refreshStatus, STATUS_EVERY_MS);
  }
}

// ---------- start ----------

function setupKeys() {
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if (state.chatRun || state.pgRun) {
      stopChat();
      stopCompletion();
      e.preventDefault();
    } else if ($("settings").open && $("settings").contains(document.activeElement)) {
      $("settings").open = false;
      $("settings").querySelector("summary").focus();
    }
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.tab === "status") refreshStatus();
  });
}

function start() {
  setupSettings();
  setupTabs();
  setupChat();
  setupPlayground();
  setupKeys();
  showTab("chat");
  refreshModels();
  refreshHealth();
  setInterval(() => {
    if (document.visibilityState === "visible") { refreshModels(); refreshHealth(); }
  }, MODELS_EVERY_MS);
  $("chat-input").focus();
}

start();
