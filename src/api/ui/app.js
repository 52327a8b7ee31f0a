// xinf's Web UI: running models, a launch form and a streaming chat, over the REST API the
// server itself serves (no framework, no build step).
"use strict";

const $ = (sel) => document.querySelector(sel);
let apiKey = localStorage.getItem("xinf-api-key") || "";

// ---- Texts ----
// The page's texts in the reader's language (`/ui/strings.json`, asked in the browser's
// `Accept-Language`); until they arrive, and for any missing, the English written here.
let texts = {};
function t(key, english, values) {
  let s = texts[key] || english;
  for (const [k, v] of Object.entries(values || {})) s = s.split("{" + k + "}").join(String(v));
  return s;
}
// Elements name their text by `data-i18n` (text) and `data-i18n-placeholder`.
function translate(root) {
  root.querySelectorAll("[data-i18n]").forEach((e) => { e.textContent = t(e.dataset.i18n, e.textContent); });
  root.querySelectorAll("[data-i18n-placeholder]").forEach((e) => {
    e.placeholder = t(e.dataset.i18nPlaceholder, e.placeholder);
  });
}
async function loadTexts() {
  try {
    const res = await fetch("/ui/strings.json");
    if (!res.ok) return;
    const j = await res.json();
    texts = j.strings || {};
    document.documentElement.lang = j.lang || "en";
    translate(document);
  } catch (_) { /* English stays */ }
}

// A REST call; on 401 asks for the API key once and retries. Errors carry the server's
// message and the field it names (`param`).
async function api(method, path, body, retried) {
  const headers = { "Content-Type": "application/json" };
  if (apiKey) headers.Authorization = "Bearer " + apiKey;
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (res.status === 401 && !retried) {
    apiKey = window.prompt(t("ui-api-key", "API key")) || "";
    localStorage.setItem("xinf-api-key", apiKey);
    return api(method, path, body, true);
  }
  const text = await res.text();
  let json = {};
  try { json = text ? JSON.parse(text) : {}; } catch (_) { json = { error: { message: text } }; }
  if (!res.ok) {
    const err = new Error((json.error && json.error.message) || json.detail || res.statusText);
    err.param = json.error && json.error.param;
    throw err;
  }
  return json;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

// ---- Tabs ----
function show(tab) {
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", b.dataset.tab === tab));
  document.querySelectorAll(".tab").forEach((s) => s.classList.toggle("active", s.id === tab));
  if (tab === "chat") loadChatModels();
}
document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => show(b.dataset.tab)));

// ---- Running models ----
function bytes(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
  return n + " B";
}

// Each replica row has two buttons: another replica like this one (a scale-up of its role),
// and this one removed once its running requests end (a scale-down). Both calls answer when
// done; the table redraws meanwhile and shows the replica loading or draining.
function replicaTable(uid, details) {
  const rows = (details || []).map((r) =>
    el("tr", { "data-replica": r.replica_uid },
      el("td", {}, r.replica_uid), el("td", { class: "role" }, r.role || "hybrid"), el("td", {}, r.worker_id),
      el("td", {}, (r.gpus || []).join(",") || "cpu"), el("td", {}, r.engine), el("td", {}, r.kv_layout || ""),
      el("td", { class: "status-" + r.status }, r.status),
      el("td", { class: "replica-actions" },
        el("button", { class: "add-replica", title: t("ui-add-replica", "Add a replica like this one"),
          onclick: () => addReplica(uid, r.role || "hybrid") }, "+"),
        el("button", { class: "remove-replica", title: t("ui-remove-replica", "Remove this replica once its requests end"),
          onclick: () => removeReplica(uid, r.replica_uid) }, "−"))));
  return el("table", { class: "replicas" },
    el("thead", {}, el("tr", {}, ...[["ui-col-replica", "Replica"], ["ui-col-role", "Role"], ["ui-col-worker", "Worker"],
      ["ui-col-gpus", "GPUs"], ["ui-col-engine", "Engine"], ["ui-col-kv-layout", "KV layout"], ["ui-col-status", "Status"]]
      .map(([k, h]) => el("th", {}, t(k, h))), el("th", {}))),
    el("tbody", {}, ...rows));
}

async function addReplica(uid, role) {
  try { await api("POST", `/v1/models/${encodeURIComponent(uid)}/replicas`, { role }); } catch (e) { window.alert(e.message); }
  refreshModels();
}

async function removeReplica(uid, replica) {
  const path = `/v1/models/${encodeURIComponent(uid)}/replicas/${encodeURIComponent(replica)}`;
  try { await api("DELETE", path); } catch (e) { window.alert(e.message); }
  refreshModels();
}

async function refreshModels() {
  let models;
  try { models = (await api("GET", "/v1/models")).data || []; } catch (e) { return; }
  const body = $("#model-table tbody");
  const rows = [];
  for (const m of models) {
    const x = m.xinf || {};
    let handoff = "";
    try {
      const h = (await api("GET", `/v1/models/${encodeURIComponent(m.id)}/stats`)).handoff || {};
      const moves = (h.in_process_transfers || 0) + (h.tcp_transfers || 0) + (h.nixl_transfers || 0) +
        (h.gpu_in_process_transfers || 0) + (h.cuda_ipc_transfers || 0) + (h.nixl_vram_transfers || 0);
      handoff = el("span", { class: "handoff", "data-pages": h.pages_transferred || 0 },
        t("ui-handoff-counts", "{pages} pages, {bytes}, {moves} handoffs",
          { pages: h.pages_transferred || 0, bytes: bytes(h.bytes_transferred || 0), moves }));
    } catch (_) { /* a model that is not ready has no stats yet */ }
    const weights = [x.model_format, x.model_size_in_billions && x.model_size_in_billions + "B", x.quantization].filter(Boolean).join(" / ");
    rows.push(el("tr", { "data-uid": m.id },
      el("td", {}, el("b", {}, m.id)), el("td", {}, x.model_name || m.model_name || ""), el("td", {}, weights),
      el("td", {}, x.engine || ""), el("td", { class: "status-" + (x.status || "") }, x.status || ""),
      el("td", {}, replicaTable(m.id, x.replica_details)), el("td", {}, handoff),
      el("td", {}, el("button", { class: "terminate", onclick: () => terminate(m.id) }, t("ui-terminate", "Terminate")))));
  }
  body.replaceChildren(...rows);
  $("#models-empty").style.display = models.length ? "none" : "block";
}

async function terminate(uid) {
  try { await api("DELETE", `/v1/models/${encodeURIComponent(uid)}`); } catch (e) { window.alert(e.message); }
  refreshModels();
}

// ---- Launch form ----
let engines = {}; // engine name → [{model_format, model_size_in_billions, quantizations}]

function fill(select, values, keep) {
  const old = keep ? select.value : null;
  select.replaceChildren(...values.map((v) => el("option", { value: v }, v)));
  if (old && values.includes(old)) select.value = old;
}

async function loadRegistrations() {
  try {
    const regs = await api("GET", "/v1/model_registrations/LLM");
    fill($("#f-model_name"), regs.map((r) => r.model_name));
    await loadEngines();
  } catch (e) { $("#launch-error").textContent = e.message; }
}

async function loadEngines() {
  const name = $("#f-model_name").value;
  if (!name) return;
  engines = await api("GET", `/v1/engines/${encodeURIComponent(name)}`);
  fill($("#f-model_engine"), Object.keys(engines), true);
  specChanged();
}

// Format, size and quantization offered for the chosen engine, each narrowing the next.
function specChanged() {
  const specs = engines[$("#f-model_engine").value] || [];
  fill($("#f-model_format"), [...new Set(specs.map((s) => s.model_format))], true);
  const byFormat = specs.filter((s) => s.model_format === $("#f-model_format").value);
  fill($("#f-model_size_in_billions"), [...new Set(byFormat.map((s) => s.model_size_in_billions))], true);
  const bySize = byFormat.filter((s) => s.model_size_in_billions === $("#f-model_size_in_billions").value);
  fill($("#f-quantization"), [...new Set(bySize.flatMap((s) => s.quantizations))], true);
}

function replicaRows() {
  const n = Math.max(1, Math.min(16, parseInt($("#f-replica").value, 10) || 1));
  const body = $("#replica-table tbody");
  while (body.children.length < n) {
    const i = body.children.length;
    body.append(el("tr", { "data-index": i },
      el("td", {}, i),
      el("td", {}, el("select", { name: "role" }, ...["", "prefill", "decode"].map((r) => r ? el("option", { value: r }, r)
        : el("option", { value: r, "data-i18n": "ui-role-ordinary" }, t("ui-role-ordinary", "(ordinary)"))))),
      el("td", {}, el("input", { name: "worker_ip", placeholder: t("ui-placeholder-worker", "any"), "data-i18n-placeholder": "ui-placeholder-worker" })),
      el("td", {}, el("input", { name: "gpu_idx", placeholder: t("ui-placeholder-gpus", "e.g. 0 or 0,1"), "data-i18n-placeholder": "ui-placeholder-gpus" })),
      el("td", {}, el("select", { name: "model_engine" }, ...["", "native", "vllm", "sglang"].map((e) => e ? el("option", { value: e }, e)
        : el("option", { value: e, "data-i18n": "ui-engine-default" }, t("ui-engine-default", "(the model's)"))))),
      el("td", {}, el("textarea", { name: "engine_config", rows: 1, placeholder: "{}" }))));
  }
  while (body.children.length > n) body.lastChild.remove();
}

function clearErrors() {
  document.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
  document.querySelectorAll(".field-error").forEach((e) => e.remove());
  $("#launch-error").textContent = "";
}

// The keys of the "more launch keys" object of the last launch.
let launchKeyNames = new Set();

// Marks the input the server's `param` names: `model_uid`, `replica`, `engine_config…`,
// `replica_config[i].field…` (or `replica_config` as a whole).
function markField(param, message) {
  if (!param) return;
  let target = null;
  const m = /^replica_config(?:\[(\d+)\])?(?:\.(\w+))?/.exec(param);
  if (m) {
    const row = m[1] !== undefined ? $(`#replica-table tbody tr[data-index="${m[1]}"]`) : null;
    if (row) target = row.querySelector(`[name="${m[2] === "devices" ? "gpu_idx" : (m[2] || "role")}"]`) || row.querySelector("select");
    else target = $("#f-replica");
  } else {
    const key = param.split(".")[0];
    // A key of the "more launch keys" object is marked there.
    target = document.getElementById("f-" + key) || (launchKeyNames.has(key) ? $("#f-launch_keys") : null);
  }
  if (target) {
    target.classList.add("invalid");
    target.after(el("span", { class: "field-error" }, message));
  }
}

async function launch(ev) {
  ev.preventDefault();
  clearErrors();
  // By id: the replica rows have fields of the same names.
  const field = (n) => $("#f-" + n).value.trim();
  const replica = parseInt(field("replica"), 10) || 1;
  const body = { replica };
  for (const n of ["model_name", "model_engine", "model_format", "model_size_in_billions", "quantization", "model_uid"]) {
    if (field(n)) body[n] = field(n);
  }
  // Any other top-level key of the launch request (request_limits, max_local_prefill_tokens,
  // prefill_fallback, ...); the form's own fields win.
  launchKeyNames = new Set();
  if (field("launch_keys")) {
    let keys = null;
    try { keys = JSON.parse(field("launch_keys")); } catch (e) {
      markField("launch_keys", t("ui-not-json", "not JSON: {reason}", { reason: e.message }));
      return;
    }
    if (!keys || typeof keys !== "object" || Array.isArray(keys)) {
      markField("launch_keys", t("ui-not-object", "not a JSON object"));
      return;
    }
    launchKeyNames = new Set(Object.keys(keys));
    for (const [k, v] of Object.entries(keys)) if (!(k in body) && k !== "replica_config") body[k] = v;
  }
  const configs = [];
  let anySet = false;
  for (const row of $("#replica-table tbody").children) {
    const c = {};
    const get = (n) => row.querySelector(`[name="${n}"]`).value.trim();
    if (get("role")) c.role = get("role");
    if (get("model_engine")) c.model_engine = get("model_engine");
    if (get("worker_ip") || get("gpu_idx")) {
      const d = {};
      if (get("worker_ip")) d.worker_ip = get("worker_ip");
      if (get("gpu_idx")) d.gpu_idx = get("gpu_idx").split(",").map((s) => Number(s.trim()));
      c.devices = [d];
    }
    if (get("engine_config")) {
      try { c.engine_config = JSON.parse(get("engine_config")); } catch (e) {
        markField(`replica_config[${row.dataset.index}].engine_config`, t("ui-not-json", "not JSON: {reason}", { reason: e.message }));
        return;
      }
    }
    if (Object.keys(c).length) anySet = true;
    configs.push(c);
  }
  if (anySet) body.replica_config = configs;
  $("#launch-status").textContent = t("ui-launching", "Launching…");
  $("#launch-button").disabled = true;
  try {
    await api("POST", "/v1/models", body);
    $("#launch-status").textContent = t("ui-launched", "Launched {model}.", { model: body.model_uid || body.model_name });
    refreshModels();
  } catch (e) {
    $("#launch-status").textContent = "";
    $("#launch-error").textContent = e.message;
    markField(e.param, e.message);
  } finally {
    $("#launch-button").disabled = false;
  }
}

$("#f-model_name").addEventListener("change", loadEngines);
$("#f-model_engine").addEventListener("change", specChanged);
$("#f-model_format").addEventListener("change", specChanged);
$("#f-model_size_in_billions").addEventListener("change", specChanged);
$("#f-replica").addEventListener("input", replicaRows);
$("#launch-form").addEventListener("submit", launch);

// ---- Chat ----
let conversation = [];
let aborter = null;

async function loadChatModels() {
  try {
    const models = (await api("GET", "/v1/models")).data || [];
    fill($("#chat-model"), models.map((m) => m.id), true);
  } catch (e) { $("#chat-error").textContent = e.message; }
}

function addMessage(role, text) {
  const m = el("div", { class: "msg " + role }, text);
  $("#chat-log").append(m);
  $("#chat-log").scrollTop = $("#chat-log").scrollHeight;
  return m;
}

// Streams the answer to the conversation into a new message as the deltas arrive.
async function send(ev) {
  ev.preventDefault();
  const text = $("#chat-input").value.trim();
  const model = $("#chat-model").value;
  if (!text || !model || aborter) return;
  $("#chat-error").textContent = "";
  $("#chat-input").value = "";
  addMessage("user", text);
  conversation.push({ role: "user", content: text });
  const out = addMessage("assistant", "");
  aborter = new AbortController();
  $("#chat-stop").disabled = false;
  $("#chat-send").disabled = true;
  let answer = "", thinking = "", thought = null;
  // A reasoning model's thinking goes into a foldable box above its answer.
  const think = (piece) => {
    if (!thought) {
      const box = document.createElement("details");
      box.className = "thinking";
      box.open = true;
      const summary = document.createElement("summary");
      summary.textContent = t("ui-thinking", "Thinking");
      thought = document.createElement("div");
      box.append(summary, thought);
      out.before(box);
    }
    thinking += piece;
    thought.textContent = thinking;
  };
  try {
    const headers = { "Content-Type": "application/json" };
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers, signal: aborter.signal,
      body: JSON.stringify({
        model, messages: conversation, stream: true,
        temperature: Number($("#chat-temperature").value || 0.7),
        max_tokens: parseInt($("#chat-max-tokens").value, 10) || 512,
      }),
    });
    if (!res.ok) {
      const j = await res.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || res.statusText);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const ev = JSON.parse(data);
        if (ev.error) throw new Error(ev.error.message);
        const delta = (ev.choices && ev.choices[0] && ev.choices[0].delta) || {};
        if (delta.reasoning_content) think(delta.reasoning_content);
        if (delta.content) { answer += delta.content; out.textContent = answer; }
        $("#chat-log").scrollTop = $("#chat-log").scrollHeight;
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") $("#chat-error").textContent = e.message;
  } finally {
    conversation.push({ role: "assistant", content: answer });
    out.dataset.done = "1";
    aborter = null;
    $("#chat-stop").disabled = true;
    $("#chat-send").disabled = false;
  }
}

$("#chat-form").addEventListener("submit", send);
$("#chat-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#chat-form").requestSubmit(); }
});
$("#chat-stop").addEventListener("click", () => aborter && aborter.abort());
$("#chat-clear").addEventListener("click", () => { conversation = []; $("#chat-log").replaceChildren(); });

// ---- Start ----
replicaRows();
loadTexts();
loadRegistrations();
refreshModels();
setInterval(refreshModels, 2000);
const hash = location.hash.slice(1);
if (["models", "launch", "chat"].includes(hash)) show(hash);
