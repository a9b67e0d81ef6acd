// kvslim's web page: chat, compressed contexts, KV inspector and server
// status over the server's own API. Plain JavaScript, no library: a small Markdown
// renderer and code highlighter are below (a chat page needs little of
// either, and this keeps the page one offline bundle with nothing to pin).
"use strict";

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

// ---------------------------------------------------------------- API key

const KEY = "kvslim.api_key";
let apiKey = (typeof localStorage !== "undefined" && localStorage.getItem(KEY)) || "";

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

/** Shows the key form (after a 401), with the server's message. */
function askKey(message) {
  $("keybox").classList.remove("hidden");
  $("key-error").textContent = message || "";
  $("key-input").focus();
}

/** A request to the API: GET without a body, POST with one (or `method`);
 *  a non-2xx answer throws an ApiError with the server's message. */
async function api(path, body, signal, method) {
  const opts = { method: method || (body === undefined ? "GET" : "POST"), headers: headers(body !== undefined), signal };
  if (body !== undefined) opts.body = JSON.stringify(body);
  const r = await fetch(path, opts);
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try {
      const j = await r.json();
      if (j.error && j.error.message) msg = j.error.message;
    } catch (_) { /* not JSON */ }
    if (r.status === 401) askKey(msg);
    throw new ApiError(r.status, msg);
  }
  return r;
}

// ------------------------------------------------------------- formatting

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(n < 10 ? 2 : 1)) + " " + u[i];
}

function pct(a, b) {
  return b > 0 ? (100 * a / b).toFixed(1) + "%" : "–";
}

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// -------------------------------------------------------------- highlight

const KEYWORDS = new Set((
  "fn let mut pub use mod struct enum impl trait where match if else for while loop return break continue " +
  "const static async await move ref self Self crate super type as in dyn unsafe extern " +
  "def class import from lambda yield with try except finally raise pass global nonlocal is not and or None True False elif del assert " +
  "function var new this typeof instanceof delete void null undefined true false catch throw switch case default do export " +
  "int long short char float double bool void unsigned signed struct union typedef sizeof include define auto " +
  "public private protected static final abstract interface extends implements package namespace template typename " +
  "echo then fi esac done local readonly"
).split(" "));

const HASH_COMMENTS = new Set(["python", "py", "sh", "bash", "shell", "ruby", "rb", "yaml", "yml", "toml", "r", "perl", "make", "makefile", "dockerfile", ""]);

/** Code → HTML with spans for comments, strings, numbers, keywords and
 *  called names; unknown languages get a C-and-Python-like lexer. */
function highlight(code, lang) {
  const hash = HASH_COMMENTS.has((lang || "").toLowerCase());
  const re = new RegExp(
    "(\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/" + (hash ? "|#[^\\n]*" : "") + ")" +
    "|(\"\"\"[\\s\\S]*?(?:\"\"\"|$)|'''[\\s\\S]*?(?:'''|$)|\"(?:[^\"\\\\\\n]|\\\\.)*\"|'(?:[^'\\\\\\n]|\\\\.)*'|`(?:[^`\\\\]|\\\\.)*`)" +
    "|(\\b\\d[\\d_]*(?:\\.\\d+)?(?:[eE][+-]?\\d+)?\\w*\\b)" +
    "|([A-Za-z_][A-Za-z0-9_]*)(?=(\\s*\\()?)", "g");
  let out = "";
  let last = 0;
  let m;
  while ((m = re.exec(code)) !== null) {
    if (m[0] === "") { re.lastIndex++; continue; }
    out += escapeHtml(code.slice(last, m.index));
    const t = escapeHtml(m[0]);
    if (m[1]) out += '<span class="hl-com">' + t + "</span>";
    else if (m[2]) out += '<span class="hl-str">' + t + "</span>";
    else if (m[3]) out += '<span class="hl-num">' + t + "</span>";
    else if (KEYWORDS.has(m[4])) out += '<span class="hl-kw">' + t + "</span>";
    else if (m[5]) out += '<span class="hl-fn">' + t + "</span>";
    else out += t;
    last = m.index + m[0].length;
  }
  return out + escapeHtml(code.slice(last));
}

// --------------------------------------------------------------- markdown

/** Inline Markdown of one escaped line: code spans, bold, italics, links. */
function inline(text) {
  const parts = text.split(/(`[^`]+`)/);
  return parts.map((p) => {
    if (p.length > 1 && p.startsWith("`") && p.endsWith("`")) return "<code>" + escapeHtml(p.slice(1, -1)) + "</code>";
    let s = escapeHtml(p);
    s = s.replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>");
    s = s.replace(/\[([^\]]+)\]\(((?:https?:|mailto:)[^)\s]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
    return s;
  }).join("");
}

/** A chat reply's Markdown → HTML: fenced code (highlighted; an unclosed
 *  fence while streaming runs to the end), headings, lists, paragraphs. */
function markdown(src) {
  const lines = src.split("\n");
  let html = "";
  let para = [];
  let list = null; // "ul" | "ol"
  const flushPara = () => {
    if (para.length) html += "<p>" + para.map(inline).join("<br>") + "</p>";
    para = [];
  };
  const closeList = () => {
    if (list) html += "</" + list + ">";
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+#.-]*)/);
    if (fence) {
      flushPara(); closeList();
      const code = [];
      i++;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) code.push(lines[i++]);
      const lang = fence[1] || "";
      html += '<pre><code data-lang="' + escapeHtml(lang) + '">' + highlight(code.join("\n"), lang) + "</code></pre>";
      continue;
    }
    const h = line.match(/^(#{1,4})\s+(.*)$/);
    const li = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (h) {
      flushPara(); closeList();
      html += "<h" + h[1].length + ">" + inline(h[2]) + "</h" + h[1].length + ">";
    } else if (li) {
      flushPara();
      const kind = /\d/.test(li[1]) ? "ol" : "ul";
      if (list !== kind) { closeList(); html += "<" + kind + ">"; list = kind; }
      html += "<li>" + inline(li[2]) + "</li>";
    } else if (line.trim() === "") {
      flushPara(); closeList();
    } else {
      closeList();
      para.push(line);
    }
  }
  flushPara(); closeList();
  return html;
}

// ---------------------------------------------------------- policy picker

const PRESETS = [
  ["", "server default"],
  ["full", "full (no eviction)"],
  ["h2o:heavy=32,recent=32", "H2O, 64 slots"],
  ["h2o:heavy=128,recent=128", "H2O, 256 slots"],
  ["h2o:heavy=32,recent=32,prefill=snap:16", "SnapKV prefill + H2O, 64 slots"],
  ["h2o:heavy=32,recent=32,score=tova", "TOVA, 64 slots"],
  ["h2o:heavy=32,recent=32,prefill=expect", "Expected Attention prefill + H2O, 64 slots"],
  ["h2o:heavy=32,recent=32,prefill=kvzip", "KVzip-style repeat prefill + H2O, 64 slots"],
  ["auto:budget=64", "auto: measured best for this model, 64 slots"],
  ["sink:sink=4,recent=60", "StreamingLLM, 64 slots"],
  ["window:recent=64", "window, 64 slots"],
  ["h2o:heavy=32,recent=32,page=16,page_score=sum", "H2O paged, page eviction"],
];

/** A policy field: a preset list (`presets`, PRESETS by default) plus
 *  "custom…", a free spec checked by the server as one types (the grammar's
 *  message shown under it). */
class PolicyPicker {
  constructor(root, initial, presets) {
    this.root = root;
    this.presets = presets || PRESETS;
    this.select = el("select");
    this.select.id = root.id + "-select";
    for (const [v, label] of this.presets) {
      const o = el("option", null, label);
      o.value = v;
      this.select.appendChild(o);
    }
    const custom = el("option", null, "custom spec…");
    custom.value = "custom";
    this.select.appendChild(custom);
    this.input = el("input");
    this.input.id = root.id + "-spec";
    this.input.placeholder = "e.g. h2o:heavy=16,recent=16";
    this.input.spellcheck = false;
    this.canon = el("div", "canon");
    this.error = el("div", "error");
    this.error.id = root.id + "-error";
    root.append(this.select, this.input, this.canon, this.error);
    this.valid = true;
    this.timer = null;
    this.select.addEventListener("change", () => {
      if (this.select.value !== "custom") this.input.value = this.select.value;
      this.input.classList.toggle("hidden", this.select.value !== "custom");
      this.check();
    });
    this.input.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.check(), 250);
    });
    this.set(initial);
  }

  set(spec) {
    const preset = this.presets.find((p) => p[0] === spec);
    this.select.value = preset ? spec : "custom";
    this.input.value = spec;
    this.input.classList.toggle("hidden", !!preset);
    this.check();
  }

  /** The spec to send (`undefined`: the server's default). */
  value() {
    const v = this.input.value.trim();
    return v === "" ? undefined : v;
  }

  async check() {
    const spec = this.value();
    this.error.textContent = "";
    this.canon.textContent = "";
    if (spec === undefined) { this.valid = true; return; }
    try {
      const r = await (await api("/v1/kv/policy", { kv_policy: spec })).json();
      if (this.value() !== spec) return;
      this.valid = true;
      this.canon.textContent = r.policy + (r.budget_slots ? " · " + r.budget_slots + " slots per head" : "");
    } catch (e) {
      if (this.value() !== spec) return;
      this.valid = e.status === 401;
      this.error.textContent = e.status === 401 ? "" : e.message;
    }
  }
}

// ------------------------------------------------------------------- chat

const chat = { messages: [], abort: null, picker: null };

function optionalNumber(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

/** A message bubble appended to `list` (the chat's by default). */
function addMessage(role, text, list) {
  const m = el("div", "msg " + role);
  const body = el("div", "body");
  if (role === "user") body.textContent = text;
  m.appendChild(body);
  (list || $("messages")).appendChild(m);
  m.scrollIntoView({ block: "end" });
  return m;
}

/** Reads an SSE response, calling `onData` with each parsed `data:` object. */
async function readSse(response, onData) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, at);
      buf = buf.slice(at + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const d = line.slice(5).trim();
        if (d === "[DONE]") return;
        onData(JSON.parse(d));
      }
    }
  }
}

/** Streams `/v1/chat/completions` (`req` with `stream: true`) into the
 *  `.body` of message `m`, drawn as Markdown as the deltas arrive. Returns
 *  { content, usage, finish, first, total }: the times in ms measured here
 *  from sending the request (to the first token, to the end). A failure
 *  throws, the part that came drawn and kept in the error's `content`. */
async function streamChat(req, m, signal) {
  const body = m.querySelector(".body");
  let content = "";
  let usage = null;
  let finish = null;
  let first = null;
  const t0 = performance.now();
  let pending = false;
  const draw = () => {
    pending = false;
    body.innerHTML = markdown(content);
    m.scrollIntoView({ block: "end" });
  };
  try {
    const r = await api("/v1/chat/completions", req, signal);
    await readSse(r, (d) => {
      if (d.error) throw new Error(d.error.message);
      const c = d.choices && d.choices[0];
      if (c && c.delta && c.delta.content) {
        if (first === null) first = performance.now();
        content += c.delta.content;
        if (!pending) { pending = true; requestAnimationFrame(draw); }
      }
      if (c && c.finish_reason) finish = c.finish_reason;
      if (d.usage) usage = d.usage;
    });
  } catch (e) {
    draw();
    e.content = content;
    throw e;
  }
  draw();
  const t1 = performance.now();
  return { content, usage, finish, first: (first || t1) - t0, total: t1 - t0 };
}

/** Starts a turn of `state`'s conversation in `list`: the user's `text`
 *  joins `state.messages` and the page, under it an empty reply with its
 *  stats line. */
function startTurn(state, text, list) {
  state.messages.push({ role: "user", content: text });
  addMessage("user", text, list);
  const m = addMessage("assistant", "", list);
  const stats = el("div", "stats", "waiting…");
  m.appendChild(stats);
  return { m, stats };
}

/** Streams the reply to `req` into `turn` while the `<prefix>-send` button
 *  reads "Stop" (then `idle` again). While `current()`, the reply joins
 *  `state.messages`: a failed one with what arrived of it, or else the
 *  question leaves them. Resolves to the stream's result, or to null after
 *  a failure, shown under the reply ("stopped" after an abort). */
async function streamTurn(state, prefix, idle, req, turn, current) {
  state.abort = new AbortController();
  $(prefix + "-send").textContent = "Stop";
  try {
    const r = await streamChat(req, turn.m, state.abort.signal);
    if (current()) state.messages.push({ role: "assistant", content: r.content });
    return r;
  } catch (e) {
    if (current()) {
      if (e.content) state.messages.push({ role: "assistant", content: e.content });
      else state.messages.pop();
    }
    turn.stats.textContent = e.name === "AbortError" ? "stopped" : "";
    if (e.name !== "AbortError") turn.m.appendChild(el("div", "error", e.message));
    turn.m.dataset.done = "error";
    return null;
  } finally {
    state.abort = null;
    $(prefix + "-send").textContent = idle;
  }
}

async function send(text) {
  if (!chat.picker.valid) {
    chat.picker.error.scrollIntoView();
    return;
  }
  const turn = startTurn(chat, text);
  const system = $("system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(chat.messages);
  const req = {
    messages,
    stream: true,
    temperature: optionalNumber("temperature"),
    top_p: optionalNumber("top-p"),
    max_tokens: optionalNumber("max-tokens"),
    seed: optionalNumber("seed"),
    kv_policy: chat.picker.value(),
  };
  const policy = req.kv_policy || "server default";
  const r = await streamTurn(chat, "chat", "Send", req, turn, () => true);
  if (!r) return;
  const usage = r.usage;
  if (usage) {
    // over the whole request (prefill included): a reply that arrives
    // in one piece still gets an honest rate
    const n = usage.completion_tokens;
    const secs = r.total / 1000;
    const rate = secs > 0 ? (n / secs).toFixed(1) : "–";
    turn.stats.textContent =
      n + " tokens in " + secs.toFixed(2) + " s · " + rate + " tok/s · first token after " +
      (r.first / 1000).toFixed(2) + " s · " +
      "KV held " + fmtBytes(usage.kv_bytes_final) + " vs " + fmtBytes(usage.kv_bytes_full) + " for a full cache (" +
      pct(usage.kv_bytes_final, usage.kv_bytes_full) + ") · " + policy + " · " + (r.finish || "");
  } else {
    turn.stats.textContent = "ended without usage";
  }
  turn.m.dataset.done = "1";
}

/** The message box `<prefix>-form` / `<prefix>-input`: Enter (without
 *  Shift) submits; a submit stops `state`'s reply in flight, or else, when
 *  `ready()`, takes the input's text (trimmed, not empty), clears the box
 *  and hands the text to `go`. */
function setupMessageForm(prefix, state, ready, go) {
  $(prefix + "-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (state.abort) { state.abort.abort(); return; }
    const text = $(prefix + "-input").value.trim();
    if (!text || !ready()) return;
    $(prefix + "-input").value = "";
    go(text);
  });
  $(prefix + "-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $(prefix + "-form").requestSubmit();
    }
  });
}

function setupChat() {
  chat.picker = new PolicyPicker($("chat-policy"), "");
  setupMessageForm("chat", chat, () => true, send);
  $("chat-clear").addEventListener("click", () => {
    if (chat.abort) chat.abort.abort();
    chat.messages = [];
    $("messages").textContent = "";
  });
}

// --------------------------------------------------------------- contexts

// A document compressed once (`POST /v1/contexts`), then asked on forks of
// it (`"context": id`): only the question's tokens are prefilled.
const CONTEXT_PRESETS = [
  ["h2o:heavy=6.25%,recent=6.25%,prefill=kvzip", "KVzip-style + H2O, 12.5% kept (query-agnostic: best for many questions)"],
  ["h2o:heavy=6.25%,recent=6.25%,prefill=snap:32", "SnapKV prefill + H2O, 12.5% kept"],
  ["h2o:heavy=6.25%,recent=6.25%", "H2O, 12.5% kept"],
  ["full", "full (no eviction)"],
];

const ctxv = { picker: null, list: [], selected: null, messages: [], abort: null, compressing: false };

function fmtSeconds(s) {
  return s < 10 ? s.toFixed(2) + " s" : s < 100 ? s.toFixed(1) + " s" : Math.round(s) + " s";
}

/** One context's facts: tokens, kept vs full K/V bytes, compression time. */
function contextFacts(c) {
  if (c.in_memory === false && c.tokens === undefined) return "on disk only: loaded when first asked";
  const parts = [
    c.tokens + " tokens",
    fmtBytes(c.kv_bytes) + " of " + fmtBytes(c.kv_bytes_full) + " (" + pct(c.kv_bytes, c.kv_bytes_full) + ")",
    c.seconds > 0 ? "compressed in " + fmtSeconds(c.seconds) : "loaded from a file",
  ];
  if (c.in_use) parts.push(c.in_use + " in use");
  return parts.join(" · ");
}

function drawContexts() {
  const list = $("ctx-list");
  list.textContent = "";
  if (!ctxv.list.length) list.appendChild(el("div", "muted", "no context yet: compress a text above"));
  for (const c of ctxv.list) {
    const item = el("div", "ctx-item" + (c.id === ctxv.selected ? " selected" : ""));
    item.dataset.id = c.id;
    item.tabIndex = 0;
    const top = el("div", "row");
    top.appendChild(el("span", "id", c.id));
    const del = el("button", "ghost small danger", "Delete");
    del.type = "button";
    del.title = "forget this context (memory and --contexts-dir file)";
    del.addEventListener("click", (e) => { e.stopPropagation(); deleteContext(c.id); });
    top.appendChild(del);
    item.appendChild(top);
    if (c.policy) item.appendChild(el("div", "policy", c.policy));
    item.appendChild(el("div", "facts", contextFacts(c)));
    item.addEventListener("click", () => openContext(c.id));
    item.addEventListener("keydown", (e) => { if (e.key === "Enter" && e.target === item) openContext(c.id); });
    list.appendChild(item);
  }
  list.dataset.count = ctxv.list.length;
}

async function refreshContexts() {
  try {
    const j = await (await api("/v1/contexts")).json();
    ctxv.list = j.data || [];
    $("ctx-list-error").textContent = "";
    drawContexts();
    drawContextHead();
  } catch (e) {
    $("ctx-list-error").textContent = e.message;
  }
}

async function compressContext() {
  const text = $("ctx-text").value;
  const err = $("ctx-error");
  const progress = $("ctx-progress");
  err.textContent = "";
  if (ctxv.compressing) return;
  if (!text.trim()) { err.textContent = "paste a text or choose a file first"; return; }
  if (!ctxv.picker.valid) { err.textContent = "fix the policy first"; return; }
  const body = { kv_policy: ctxv.picker.value() };
  if ($("ctx-as-chat").checked) body.messages = [{ role: "user", content: text }];
  else body.text = text;
  const what = text.length.toLocaleString() + " characters" + (body.messages ? " as a chat message" : "");
  const policy = body.kv_policy || "the server's default policy";
  ctxv.compressing = true;
  $("ctx-compress").disabled = true;
  $("ctx-compress").textContent = "Compressing…";
  progress.dataset.done = "";
  const t0 = performance.now();
  const tick = () => {
    progress.textContent = "prefilling " + what + " under " + policy + " · " + Math.floor((performance.now() - t0) / 1000) + " s";
  };
  tick();
  const timer = setInterval(tick, 500);
  try {
    const c = await (await api("/v1/contexts", body)).json();
    progress.textContent =
      c.id + ": " + c.tokens + " tokens, " + fmtBytes(c.kv_bytes) + " of " + fmtBytes(c.kv_bytes_full) +
      " kept, in " + fmtSeconds(c.seconds) + " (" + fmtSeconds((performance.now() - t0) / 1000) + " here)";
    progress.dataset.done = "1";
    await refreshContexts();
    openContext(c.id);
  } catch (e) {
    progress.textContent = "";
    progress.dataset.done = "error";
    let msg = e.message;
    // a body over --max-body-bytes is refused before it is read, and the
    // browser then sees the connection closed rather than the 413
    if (!(e instanceof ApiError)) {
      msg += " (the request, " + fmtBytes(JSON.stringify(body).length) + ", failed before an answer came: " +
        "the server may refuse bodies over its --max-body-bytes, 1 MiB by default, by closing the connection)";
    }
    err.textContent = msg;
  } finally {
    clearInterval(timer);
    ctxv.compressing = false;
    $("ctx-compress").disabled = false;
    $("ctx-compress").textContent = "Compress";
  }
}

async function deleteContext(id) {
  const err = $("ctx-list-error");
  err.textContent = "";
  try {
    await api("/v1/contexts/" + encodeURIComponent(id), undefined, undefined, "DELETE");
    if (ctxv.selected === id) closeContext("context " + id + " deleted");
  } catch (e) {
    err.textContent = "delete " + id + ": " + e.message;
  }
  await refreshContexts();
}

function selectedContext() {
  return ctxv.list.find((c) => c.id === ctxv.selected);
}

/** The line above the conversation: the context asked, and its facts. */
function drawContextHead() {
  const head = $("ctx-head");
  if (!ctxv.selected) return;
  const c = selectedContext();
  head.textContent = "";
  head.appendChild(el("strong", "mono", ctxv.selected));
  if (c && c.policy) head.appendChild(el("span", "muted", " · " + c.policy));
  head.appendChild(el("div", "muted", c ? contextFacts(c) : "not on the server any more"));
}

/** Stops a reply in flight and selects context `id` with no questions
 *  asked yet: its conversation shown, or (`null`) the placeholder. */
function selectContext(id) {
  if (ctxv.abort) ctxv.abort.abort();
  ctxv.selected = id;
  ctxv.messages = [];
  $("ctx-messages").textContent = "";
  $("ctx-chat").classList.toggle("hidden", id === null);
  $("ctx-empty").classList.toggle("hidden", id !== null);
}

function openContext(id) {
  selectContext(id);
  drawContexts();
  drawContextHead();
  $("ctx-input").focus();
}

function closeContext(why) {
  selectContext(null);
  $("ctx-empty").textContent = why;
}

/** A question on the selected context: `messages` are the turns after it. */
async function askContext(text) {
  const id = ctxv.selected;
  const c = selectedContext();
  const turn = startTurn(ctxv, text, $("ctx-messages"));
  const req = {
    context: id,
    messages: ctxv.messages.slice(),
    stream: true,
    temperature: optionalNumber("ctx-temperature"),
    max_tokens: optionalNumber("ctx-max-tokens"),
  };
  const r = await streamTurn(ctxv, "ctx", "Ask", req, turn, () => ctxv.selected === id);
  if (r) {
    const u = r.usage;
    const prefill = c && c.seconds > 0
      ? " (the document's prefill took " + fmtSeconds(c.seconds) + " once)"
      : c && c.tokens !== undefined ? " (the document was loaded from a file: no prefill here)" : "";
    const parts = ["first token " + fmtSeconds(r.first / 1000) + prefill, "total " + fmtSeconds(r.total / 1000)];
    if (u) {
      parts.push(u.completion_tokens + " tokens, " + (r.total > 0 ? (1000 * u.completion_tokens / r.total).toFixed(1) : "–") + " tok/s");
      parts.push(u.prompt_tokens + " question tokens on " + (u.prompt_tokens_reused || 0) + " of the context");
      parts.push("KV held " + fmtBytes(u.kv_bytes_final) + " vs " + fmtBytes(u.kv_bytes_full) + " for a full cache (" +
        pct(u.kv_bytes_final, u.kv_bytes_full) + ")");
    } else {
      parts.push("ended without usage");
    }
    if (r.finish) parts.push(r.finish);
    turn.stats.textContent = parts.join(" · ");
    turn.m.dataset.done = "1";
  }
  // a context loaded from disk by this question now has its facts
  if (c && c.tokens === undefined) refreshContexts();
}

function setupContexts() {
  ctxv.picker = new PolicyPicker($("ctx-policy"), CONTEXT_PRESETS[0][0], CONTEXT_PRESETS);
  $("ctx-compress").addEventListener("click", compressContext);
  $("ctx-refresh").addEventListener("click", refreshContexts);
  $("ctx-text").addEventListener("input", () => {
    $("ctx-file-info").textContent = $("ctx-text").value.length.toLocaleString() + " characters";
  });
  $("ctx-file").addEventListener("change", () => {
    const f = $("ctx-file").files[0];
    if (!f) return;
    const reader = new FileReader();
    reader.onload = () => {
      $("ctx-text").value = reader.result;
      $("ctx-file-info").textContent = f.name + ": " + reader.result.length.toLocaleString() + " characters";
      $("ctx-error").textContent = "";
    };
    reader.onerror = () => { $("ctx-error").textContent = f.name + ": " + (reader.error ? reader.error.message : "not readable"); };
    reader.readAsText(f);
  });
  setupMessageForm("ctx", ctxv, () => ctxv.selected, askContext);
  $("ctx-clear").addEventListener("click", () => {
    if (ctxv.selected) openContext(ctxv.selected);
  });
}

// -------------------------------------------------------------- inspector

const insp = { pickers: [], results: [null, null], evict: [null, null], messages: null, ownText: "" };

/** Per (layer, head) of a result: each position's eviction step
 *  (Infinity: never evicted), to replay the kept set at any step: what the
 *  prefill chunk dropped counts as dropped at its last position, then the
 *  trace's decode-step evictions. */
function evictionSteps(r) {
  const n = r.token_ids.length;
  const steps = [];
  for (let l = 0; l < r.n_layers; l++) {
    steps.push([]);
    for (let h = 0; h < r.n_kv_heads; h++) {
      const a = new Float64Array(n).fill(Infinity);
      if (r.prefill_kept) {
        const kept = new Set(r.prefill_kept.layers[l].kv_heads[h]);
        for (let p = 0; p < r.prefill; p++) if (!kept.has(p)) a[p] = r.prefill - 1;
      }
      steps[l].push(a);
    }
  }
  for (const [step, l, h, pos] of r.trace || []) {
    const a = steps[l][h];
    if (step < a[pos]) a[pos] = step;
  }
  return steps;
}

/** Whether replaying the trace to the last step gives the final kept set
 *  (not where a window or page eviction drops tokens the trace does not list). */
function replayExact(r, steps, l, h) {
  const last = r.fed - 1;
  const kept = new Set(r.kept.layers[l].kv_heads[h]);
  const a = steps[l][h];
  for (let p = 0; p <= last; p++) if ((a[p] > last) !== kept.has(p)) return false;
  return true;
}

function selection() {
  return { layer: $("inspect-layer").value, head: $("inspect-head").value, step: Number($("inspect-step").value) };
}

/** (kept-in count, of how many heads, score of the one selected head) of
 *  position p under result r at step s. */
function keptCount(r, steps, sel, p) {
  const last = r.fed - 1;
  const layers = sel.layer === "all" ? [...Array(r.n_layers).keys()] : [Number(sel.layer)];
  const heads = sel.head === "all" ? [...Array(r.n_kv_heads).keys()] : [Number(sel.head)];
  let k = 0;
  let of = 0;
  for (const l of layers) {
    for (const h of heads) {
      of++;
      if (p > sel.step) continue;
      if (sel.step >= last) {
        if (r.keptSets[l][h].has(p)) k++;
      } else if (steps[l][h][p] > sel.step) {
        k++;
      }
    }
  }
  return [k, of];
}

function drawPanel(i) {
  const r = insp.results[i];
  const panel = $(i === 0 ? "panel-a" : "panel-b");
  panel.textContent = "";
  if (!r) return;
  const sel = selection();
  const steps = insp.evict[i];
  panel.dataset.policy = r.policy;
  panel.appendChild(el("h4", null, r.policy));
  const facts = [
    "KV " + fmtBytes(r.kv_bytes) + " of " + fmtBytes(r.kv_bytes_full) + " full (" + pct(r.kv_bytes, r.kv_bytes_full) + ")",
    r.budget_slots ? r.budget_slots + " slots per head" : "no budget",
    r.token_ids.length + " tokens (" + r.fed + " fed)",
    "ppl " + r.ppl.toFixed(2),
    r.seconds.toFixed(2) + " s",
  ];
  panel.appendChild(el("div", "facts", facts.join(" · ")));
  if (r.retained_mass) {
    const mass = el("div", "mass");
    r.retained_mass.per_layer.forEach((v, l) => {
      const b = el("div", String(l) === sel.layer ? "sel" : "");
      b.style.height = Math.max(2, 100 * v) + "%";
      b.title = "layer " + l + ": retained attention mass " + v.toFixed(4);
      mass.appendChild(b);
    });
    panel.appendChild(el("div", "muted", "retained attention mass per layer (mean " + r.retained_mass.mean.toFixed(3) + ")"));
    panel.appendChild(mass);
  } else {
    panel.appendChild(el("div", "muted", "retained attention mass: not computed (tick the box; it runs the full cache alongside)"));
  }
  if (sel.layer !== "all" && sel.head !== "all" && !replayExact(r, steps, Number(sel.layer), Number(sel.head))) {
    panel.appendChild(el("div", "muted", "this layer drops tokens the eviction trace does not list (a sliding window or page eviction): steps before the last are approximate"));
  }
  const strip = el("div", "strip");
  strip.dataset.layer = sel.layer;
  strip.dataset.head = sel.head;
  strip.dataset.step = sel.step;
  const l = sel.layer === "all" ? null : Number(sel.layer);
  const h = sel.head === "all" ? null : Number(sel.head);
  r.tokens.forEach((t, p) => {
    const [k, of] = keptCount(r, steps, sel, p);
    const s = el("span", "tok", t === "" ? "∅" : t.replace(/\n/g, "↵\n"));
    s.dataset.pos = p;
    s.dataset.kept = k;
    if (p > sel.step) s.classList.add("future");
    else if (k === of) s.classList.add("kept");
    else if (k === 0) s.classList.add("evicted");
    else {
      s.classList.add("partial");
      s.style.background = "rgba(22,163,74," + (0.2 + 0.8 * k / of).toFixed(2) + ")";
    }
    let tip = "position " + p + " · id " + r.token_ids[p] + " · " + JSON.stringify(t);
    if (p > sel.step) tip += "\nnot fed yet at step " + sel.step;
    else tip += "\nkept in " + k + " of " + of + (of === 1 ? " head" : " heads");
    if (l !== null && h !== null) {
      const at = r.kept.layers[l].kv_heads[h].indexOf(p);
      if (at >= 0) tip += "\naccumulated score at the end: " + r.scores.layers[l].kv_heads[h][at].toPrecision(4);
      const e = steps[l][h][p];
      if (e !== Infinity) tip += "\nevicted at step " + e;
    } else if (l !== null) {
      const sc = [];
      r.kept.layers[l].kv_heads.forEach((ps, hh) => {
        const at = ps.indexOf(p);
        if (at >= 0) sc.push("h" + hh + " " + r.scores.layers[l].kv_heads[hh][at].toPrecision(3));
      });
      if (sc.length) tip += "\nscores at the end: " + sc.join(", ");
    }
    if (p === r.token_ids.length - 1) tip += "\n(the last token is not fed: it predicts nothing)";
    s.title = tip;
    strip.appendChild(s);
  });
  panel.appendChild(strip);
}

function drawInspector() {
  const sel = selection();
  const r = insp.results[0];
  if (!r) return;
  $("inspect-step-label").textContent =
    sel.step >= r.fed - 1 ? "after the last token (" + (r.fed - 1) + ")" : "after position " + sel.step;
  drawPanel(0);
  drawPanel(1);
}

async function runInspector() {
  const text = $("inspect-text").value;
  const err = $("inspect-error");
  err.textContent = "";
  if (!insp.pickers.every((p) => p.valid)) { err.textContent = "fix the policy first"; return; }
  const prefill = Number($("inspect-prefill").value) || 0;
  const mass = $("inspect-mass").checked;
  $("inspect-run").disabled = true;
  $("inspect-run").textContent = "Running…";
  try {
    const results = [];
    for (const p of insp.pickers) {
      const body = { kv_policy: p.value(), prefill, trace: true, retained_mass: mass };
      if (insp.messages) body.messages = insp.messages;
      else body.prompt = text;
      results.push(await (await api("/v1/kv/inspect", body)).json());
    }
    insp.results = results;
    insp.evict = results.map(evictionSteps);
    for (const r of results) r.keptSets = r.kept.layers.map((L) => L.kv_heads.map((ps) => new Set(ps)));
    const r = results[0];
    const layer = $("inspect-layer");
    const head = $("inspect-head");
    const keep = [layer.value, head.value];
    layer.textContent = "";
    head.textContent = "";
    layer.appendChild(Object.assign(el("option", null, "all layers"), { value: "all" }));
    for (let l = 0; l < r.n_layers; l++) {
      const kind = r.layer_kinds ? " (" + r.layer_kinds[l] + ")" : "";
      layer.appendChild(Object.assign(el("option", null, String(l) + kind), { value: String(l) }));
    }
    head.appendChild(Object.assign(el("option", null, "all KV heads"), { value: "all" }));
    for (let h = 0; h < r.n_kv_heads; h++) head.appendChild(Object.assign(el("option", null, String(h)), { value: String(h) }));
    layer.value = keep[0] && keep[0] !== "" && Number(keep[0]) < r.n_layers ? keep[0] : "0";
    head.value = keep[1] && keep[1] !== "" && Number(keep[1]) < r.n_kv_heads ? keep[1] : "0";
    if (!layer.value) layer.value = "0";
    if (!head.value) head.value = "0";
    const step = $("inspect-step");
    step.min = prefill > 1 ? prefill - 1 : 0;
    step.max = r.fed - 1;
    step.value = r.fed - 1;
    $("inspect-view").classList.remove("hidden");
    drawInspector();
    $("inspect-view").dataset.ready = "1";
  } catch (e) {
    err.textContent = e.message;
  } finally {
    $("inspect-run").disabled = false;
    $("inspect-run").textContent = "Inspect";
  }
}

function setupInspector() {
  insp.pickers = [
    new PolicyPicker($("inspect-policy-a"), "h2o:heavy=32,recent=32"),
    new PolicyPicker($("inspect-policy-b"), "sink:sink=4,recent=60"),
  ];
  $("inspect-run").addEventListener("click", runInspector);
  for (const id of ["inspect-layer", "inspect-head", "inspect-step"]) {
    for (const ev of ["input", "change"]) $(id).addEventListener(ev, drawInspector);
  }
  // the conversation is sent as `messages`, so the server renders it with
  // the chat template, exactly the prompt a reply would start from
  $("inspect-from-chat").addEventListener("click", () => {
    const text = $("inspect-text");
    if (insp.messages) {
      insp.messages = null;
      text.readOnly = false;
      text.value = insp.ownText;
      $("inspect-from-chat").textContent = "Use the conversation";
      return;
    }
    if (!chat.messages.length) {
      $("inspect-error").textContent = "the conversation is empty: chat first";
      return;
    }
    const system = $("system").value.trim();
    insp.messages = (system ? [{ role: "system", content: system }] : []).concat(chat.messages);
    insp.ownText = text.value;
    text.value = insp.messages.map((m) => m.role + ": " + m.content).join("\n");
    text.readOnly = true;
    $("inspect-error").textContent = "";
    $("inspect-from-chat").textContent = "Use my own text";
  });
}

// ----------------------------------------------------------------- status

const status = { timer: null, tps: [] };

function parseMetrics(text) {
  const m = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const [k, v] = line.split(" ");
    m[k] = Number(v);
  }
  return m;
}

function card(label, value, sub, frac) {
  const c = el("div", "card");
  c.append(el("div", "muted", label), el("div", "v", value));
  if (sub) c.appendChild(el("div", "muted", sub));
  if (frac !== undefined) {
    const bar = el("div", "bar");
    const fill = el("div");
    fill.style.width = Math.min(100, 100 * frac) + "%";
    bar.appendChild(fill);
    c.appendChild(bar);
  }
  return c;
}

async function refreshStatus() {
  try {
    const m = parseMetrics(await (await api("/metrics")).text());
    const cards = $("status-cards");
    cards.textContent = "";
    const used = m.kvslim_kv_bytes_in_use;
    const limit = m.kvslim_kv_bytes_limit;
    cards.append(
      card("running", String(m.kvslim_running_requests), "sequences in the batch"),
      card("queued", String(m.kvslim_queue_length), "waiting for admission"),
      card("KV pool in use", fmtBytes(used), "of " + fmtBytes(limit) + " (" + pct(used, limit) + ")", limit ? used / limit : 0),
      card("KV pages", String(m.kvslim_kv_pages_in_use), m.kvslim_kv_cow_copies_total + " copy-on-write copies"),
      card("tokens/s", m.kvslim_tokens_per_second.toFixed(1), "batch of " + m.kvslim_batch_size),
      card("requests", String(m.kvslim_requests_total), m.kvslim_requests_rejected_total + " rejected · " + m.kvslim_requests_timed_out_total + " timed out · " + m.kvslim_requests_cancelled_total + " cancelled"),
      card("tokens generated", String(m.kvslim_generated_tokens_total), m.kvslim_prompt_tokens_total + " prompt tokens prefilled"),
      card("slots evicted", String(m.kvslim_evicted_slots_total), "by the policies, over layers and heads"),
      card("prefix cache", String(m.kvslim_prefix_hits_total) + " hits", m.kvslim_prefix_tokens_reused_total + " tokens reused"),
    );
    status.tps.push(m.kvslim_tokens_per_second);
    if (status.tps.length > 60) status.tps.shift();
    const chart = $("tps-chart");
    chart.textContent = "";
    const max = Math.max(1, ...status.tps);
    for (const v of status.tps) {
      const b = el("div");
      b.style.height = (100 * v / max) + "%";
      b.title = v.toFixed(1) + " tok/s";
      chart.appendChild(b);
    }
    $("status-updated").textContent = "updated " + new Date().toLocaleTimeString() + " · every second while this tab is open · peak in view " + max.toFixed(1) + " tok/s";
  } catch (e) {
    $("status-updated").textContent = e.message;
  }
}

// ------------------------------------------------------------------- tabs

const VIEWS = ["chat", "contexts", "inspect", "status"];

function show(view) {
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.view === view);
  for (const v of VIEWS) $("view-" + v).classList.toggle("hidden", v !== view);
  clearInterval(status.timer);
  if (view === "contexts") refreshContexts();
  if (view === "status") {
    refreshStatus();
    status.timer = setInterval(refreshStatus, 1000);
  }
  if (location.hash !== "#" + view) history.replaceState(null, "", "#" + view);
}

async function loadModel() {
  try {
    const j = await (await api("/v1/models")).json();
    const m = j.data[0];
    $("model").textContent = m.id.split("/").pop() + " · context " + m.context_length;
    $("model").title = m.id;
    $("keybox").classList.add("hidden");
    return true;
  } catch (e) {
    $("model").textContent = e.status === 401 ? "" : e.message;
    return false;
  }
}

function setup() {
  for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => show(b.dataset.view));
  $("key-button").addEventListener("click", () => askKey(""));
  $("keybox").addEventListener("submit", async (e) => {
    e.preventDefault();
    apiKey = $("key-input").value.trim();
    localStorage.setItem(KEY, apiKey);
    if (await loadModel()) {
      for (const p of [chat.picker, ctxv.picker, ...insp.pickers]) p.check();
      if (!$("view-contexts").classList.contains("hidden")) refreshContexts();
    }
  });
  setupChat();
  setupContexts();
  setupInspector();
  loadModel();
  const view = location.hash.slice(1);
  show(VIEWS.includes(view) ? view : "chat");
}

if (typeof document !== "undefined") document.addEventListener("DOMContentLoaded", setup);
// for a quick check of the renderers outside a browser (node)
if (typeof module !== "undefined") module.exports = { markdown, highlight };
