// airlock's web page: the live monitor, the approval dialog, the allowlist
// manager, the sessions, the previews, the Docker members (their logs and
// workspace downloads) and the settings of a sandbox. Plain JavaScript, no dependencies;
// every value from the server goes into the page as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  sandbox: null, csrf: sessionStorage.getItem("airlock.csrf") || "", events: null,
  rows: [], sources: new Map(), counts: { total: 0, allow: 0, deny: 0 },
  queue: [], current: null, timer: null, follow: true, samples: [],
  editing: false, settings: null, returnFocus: null, armedAt: 0, armTimer: null, pressed: null,
  pinned: new Set(), sessionsTimer: null, previewsTimer: null, logs: null,
};
const MAX_ROWS = 2000;

// api calls the REST API with the session cookie; mutations carry the CSRF
// value from the login.
async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    opts.body = JSON.stringify(body);
    opts.headers["Content-Type"] = "application/json";
  }
  if (method !== "GET") opts.headers["X-Airlock-CSRF"] = state.csrf;
  const res = await fetch("/api/v1" + path, opts);
  if (res.status === 401) { showLogin(); throw new Error("signed out"); }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) { const err = new Error((data.error || res.statusText) + (data.hint ? " (" + data.hint + ")" : "")); err.status = res.status; throw err; }
  return data;
}
const sb = (rest) => "/sandboxes/" + encodeURIComponent(state.sandbox) + rest;

// visibleText is internal/visible.String for the page: every character
// that could hide, reorder or rewrite what is around it (controls, line and
// paragraph separators, bidi controls, zero-width and other invisible
// characters, private-use and unassigned code points) becomes a visible
// escape, and a backslash is doubled. Text a sandbox member controls is
// shown only through it (design §8, invariant 16).
const unsafeChars = /[\\\p{C}\p{Zl}\p{Zp}\p{Zs}\u115f\u1160\u3164\uffa0\u034f\u180e\u2800\ufffc\ufffd\ufe00-\ufe0f\u{e0100}-\u{e01ef}]/gu;
function visibleText(s) {
  return String(s == null ? "" : s).replace(unsafeChars, (c) => {
    if (c === " ") return c;
    if (c === "\\") return "\\\\";
    const n = c.codePointAt(0);
    return n < 0x80 ? "\\x" + n.toString(16).padStart(2, "0") : "\\u{" + n.toString(16) + "}";
  });
}

// el builds an element; its text children, its title and its aria-label
// go through visibleText. Attributes are set through the DOM, never parsed
// as HTML.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, k === "title" || k === "aria-label" ? visibleText(v) : v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(visibleText(k)));
  return e;
}

// patternBox is the field a pattern is edited in: a textarea that grows with
// its text and wraps it, so a long host in it is read whole (an input
// scrolls it out of sight). It stays one line of text: Enter calls enter
// (if given) instead of breaking the line, and pasted line breaks go.
function patternBox(attrs, value, enter) {
  const t = el("textarea", { rows: "1", spellcheck: "false", ...attrs, class: "pattern" + (attrs.class ? " " + attrs.class : "") });
  t.value = value;
  oneLine(t, enter);
  return t;
}
function oneLine(t, enter) {
  t.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); if (enter) enter(); } });
  t.addEventListener("input", () => { if (/[\r\n]/.test(t.value)) t.value = t.value.replace(/[\r\n]+/g, ""); });
}

// ---- login ----
function showLogin() { if (!$("login").open) $("login").showModal(); $("token").focus(); }
$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const res = await fetch("/api/v1/login", { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token: $("token").value.trim() }) });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) { $("login-error").textContent = data.error || "sign-in failed"; return; }
  state.csrf = data.csrf; sessionStorage.setItem("airlock.csrf", data.csrf);
  $("token").value = ""; $("login").close(); start();
});

// ---- theme and tabs ----
if (localStorage.getItem("airlock.theme") === "dark" || (!localStorage.getItem("airlock.theme") && matchMedia("(prefers-color-scheme: dark)").matches)) document.documentElement.classList.add("dark");
$("theme").addEventListener("click", () => {
  const dark = document.documentElement.classList.toggle("dark");
  localStorage.setItem("airlock.theme", dark ? "dark" : "light");
});
const tabs = [...document.querySelectorAll(".tabs button")];
function selectTab(b) {
  for (const o of tabs) { o.setAttribute("aria-selected", o === b); o.tabIndex = o === b ? 0 : -1; }
  for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== "tab-" + b.dataset.tab;
  if (b.dataset.tab === "rules") loadRules();
  if (b.dataset.tab === "settings") loadSettings();
  if (b.dataset.tab === "proposal" && !$("proposal-rows").children.length) loadProposal();
  if (b.dataset.tab === "sessions") loadSessions();
  if (b.dataset.tab === "previews") loadPreviews();
  if (b.dataset.tab === "members") loadMembers();
}
for (const b of tabs) {
  b.addEventListener("click", () => selectTab(b));
  // Arrow keys move between tabs, as in every tab list.
  b.addEventListener("keydown", (ev) => {
    const step = ev.key === "ArrowRight" ? 1 : ev.key === "ArrowLeft" ? -1 : 0;
    if (!step) return;
    const next = tabs[(tabs.indexOf(b) + step + tabs.length) % tabs.length];
    selectTab(next); next.focus();
  });
}

// ---- sandboxes ----
async function start() {
  let list;
  try { list = await api("GET", "/sandboxes"); } catch { return; }
  const sel = $("sandbox");
  sel.replaceChildren(...list.map((s) => el("option", { value: s.name }, s.name)));
  const last = localStorage.getItem("airlock.sandbox");
  state.sandbox = list.some((s) => s.name === last) ? last : (list[0] && list[0].name);
  sel.value = state.sandbox || "";
  if (state.sandbox) openSandbox();
}
$("sandbox").addEventListener("change", () => { state.sandbox = $("sandbox").value; localStorage.setItem("airlock.sandbox", state.sandbox); openSandbox(); });

async function openSandbox() {
  if (state.events) state.events.close();
  state.editing = false; state.settings = null; state.rows = []; state.sources.clear(); state.counts = { total: 0, allow: 0, deny: 0 }; state.queue = []; state.samples = []; state.pinned.clear();
  $("rows").replaceChildren(); $("session-rows").replaceChildren(); $("member-rows").replaceChildren(); $("f-source").value = "";
  closeLogs();
  if (!$("tab-members").hidden) loadMembers();
  if (!$("tab-sessions").hidden) loadSessions();
  $("exposure-rows").replaceChildren(); $("preview-member-rows").replaceChildren();
  if (!$("tab-previews").hidden) loadPreviews();
  $("har").href = "/api/v1" + sb("/requests.har");
  $("s-ca").href = "/api/v1" + sb("/ca.pem");
  try {
    const past = await api("GET", sb("/requests?limit=500"));
    for (const e of past) addRecord(e);
  } catch (e) { console.warn(e); }
  state.events = new EventSource("/api/v1" + sb("/events"));
  for (const kind of ["connection", "request"]) state.events.addEventListener(kind, (m) => addRecord(JSON.parse(m.data)));
  state.events.addEventListener("approval", (m) => onApproval(JSON.parse(m.data)));
  state.events.addEventListener("exposure", () => { if (!$("tab-previews").hidden) loadPreviews(); });
  state.events.addEventListener("rule", () => { if (!$("tab-rules").hidden && !state.editing) loadRules(); });
  state.events.addEventListener("settings", () => { if (!$("tab-settings").hidden) loadSettings(); refreshLearn(); });
  state.events.addEventListener("member", () => { if (!$("tab-members").hidden) loadMembers(); });
  $("proposal-rows").replaceChildren(); $("proposal-status").textContent = ""; $("proposal-save").disabled = true;
  refreshApprovals();
  refreshLearn();
}

// ---- learn mode ----
// refreshLearn shows the banner while the sandbox learns, with the time
// left; the page asks again when the sandbox or its settings change, and
// counts down on its own in between.
async function refreshLearn() {
  let s;
  try { s = await api("GET", sb("")); } catch { return; }
  state.learnUntil = s.unknown_action === "learn" && s.learn_until ? new Date(s.learn_until) : null;
  learnTick();
}
function learnTick() {
  const until = state.learnUntil, left = until ? until - Date.now() : 0;
  $("learn-banner").hidden = left <= 0;
  if (left <= 0) return;
  const mins = Math.ceil(left / 60000);
  $("learn-text").textContent = "Unknown destinations are let through and recorded as learned until " + until.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false }) +
    " (" + (mins >= 60 ? Math.floor(mins / 60) + " h " + (mins % 60) + " min" : mins + " min") + " left); then the sandbox asks.";
}
setInterval(learnTick, 15000);
$("learn-review").addEventListener("click", () => { const b = tabs.find((x) => x.dataset.tab === "proposal"); selectTab(b); b.focus(); loadProposal(); });

// ---- proposal ----
async function loadProposal() {
  $("proposal-error").textContent = ""; $("proposal-status").textContent = "computing…";
  const since = $("proposal-since").value;
  let p;
  try { p = await api("GET", sb("/proposal" + (since ? "?since=" + encodeURIComponent(since) : ""))); } catch (e) { $("proposal-error").textContent = e.message; $("proposal-status").textContent = ""; return; }
  $("proposal-rows").replaceChildren(...p.patterns.map((x, i) => {
    const note = x.covered_by ? "covered by " + x.covered_by : (x.flags || []).join("; ");
    const tick = el("input", { type: "checkbox", "aria-label": "save " + (x.pattern || x.hosts.join(", ")), "data-i": String(i), ...(!x.covered_by && !(x.flags || []).length ? { checked: "" } : {}) });
    const input = patternBox({ class: "mono", "aria-label": "pattern for " + x.hosts.join(", "), "data-member": x.member || "" }, x.pattern);
    tick.addEventListener("change", proposalCount); input.addEventListener("input", proposalCount);
    return el("tr", { class: (x.flags || []).length ? "flagged" : x.covered_by ? "covered" : "" }, el("td", {}, tick), el("td", {}, input), el("td", {}, x.member || "all members"),
      el("td", { class: "num" }, String(x.hits)), el("td", { class: "mono" }, ...x.examples.map((u) => el("div", {}, u))), el("td", { class: (x.flags || []).length ? "bad" : "muted" }, note));
  }));
  if (!p.patterns.length) $("proposal-rows").replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "muted" }, "Nothing recorded to propose yet.")));
  $("proposal-status").textContent = p.patterns.length + " patterns from " + p.records + " records";
  proposalCount();
}
function tickedRules() {
  return [...$("proposal-rows").querySelectorAll("tr")].filter((tr) => { const c = tr.querySelector('input[type="checkbox"]'); return c && c.checked; })
    .map((tr) => { const i = tr.querySelector("textarea.mono"); return { pattern: i.value.trim(), member: i.dataset.member || undefined }; });
}
function proposalCount() {
  const n = tickedRules().length;
  $("proposal-save").disabled = n === 0;
  $("proposal-save").textContent = n ? "Save " + n + " ticked pattern" + (n === 1 ? "" : "s") : "Save ticked patterns";
}
$("proposal-load").addEventListener("click", loadProposal);
$("proposal-since").addEventListener("change", loadProposal);
$("proposal-save").addEventListener("click", async () => {
  $("proposal-error").textContent = "";
  const rules = tickedRules();
  try {
    const added = await api("POST", sb("/proposal"), { rules });
    $("proposal-status").textContent = "Saved " + added.length + " patterns to the policy file.";
    await loadProposal();
    $("proposal-status").textContent = "Saved " + added.length + " patterns to the policy file.";
  } catch (e) { $("proposal-error").textContent = e.message; }
});

// ---- monitor ----
function recordURL(e) { return e.url || (e.host ? e.host + (e.port ? ":" + e.port : "") : ""); }
function sizeText(n) { return n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MB" : n >= 1024 ? (n / 1024).toFixed(1) + " kB" : (n || 0) + " B"; }
function statusOf(e) {
  if (e.pending) return { cls: "status-pending", text: "pending" };
  if (e.verdict === "deny") return { cls: "status-deny", text: e.status ? "denied " + e.status : "denied" };
  if (e.status >= 500) return { cls: "status-error", text: "error " + e.status };
  if (e.verdict === "learned") return { cls: "status-allow", text: "learned" + (e.status ? " " + e.status : "") };
  if (e.kind === "request") return { cls: "status-allow", text: String(e.status || "") };
  return { cls: "status-allow", text: e.close && e.close.startsWith("intercepted") ? "intercepted" : "completed" };
}

// durationText shows milliseconds as a person reads them: 850 µs, 12 ms,
// 3.4 s; nothing when none was recorded.
function durationText(ms) {
  if (!ms) return "";
  if (ms < 1) return Math.round(ms * 1000) + " µs";
  if (ms < 1000) return (ms < 10 ? ms.toFixed(1) : Math.round(ms)) + " ms";
  return (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + " s";
}

function rowFor(e) {
  const st = statusOf(e);
  const status = el("td", { class: st.cls }, st.text);
  if (e.pending) status.prepend(el("span", { class: "spinner", "aria-hidden": "true" }));
  const tr = el("tr", { title: (e.rule ? "rule: " + e.rule : "no rule") + (e.reason ? " — " + e.reason : "") },
    el("td", {}, new Date(e.time).toLocaleTimeString([], { hour12: false })), el("td", {}, e.source || ""), el("td", {}, e.method || (e.kind === "connection" ? "TCP" : "")),
    el("td", { class: "mono" }, recordURL(e)), status, el("td", { class: "num", title: e.ttfb_ms ? "first byte after " + durationText(e.ttfb_ms) : "" }, e.pending ? "" : durationText(e.duration_ms)),
    el("td", { class: "num" }, e.pending ? "" : sizeText((e.bytes_down || 0) + (e.bytes_up || 0))));
  tr.dataset.verdict = e.pending ? "pending" : e.verdict || "";
  tr.dataset.source = e.source || "";
  tr.dataset.llm = e.llm ? "1" : "";
  tr.dataset.text = (recordURL(e) + " " + (e.rule || "") + " " + (e.source || "")).toLowerCase();
  return tr;
}

function visible(tr) {
  if ($("hide-llm").checked && tr.dataset.llm) return false;
  const src = $("f-source").value, ver = $("f-verdict").value, text = $("f-text").value.trim().toLowerCase();
  return (!src || tr.dataset.source === src) && (!ver || tr.dataset.verdict === ver) && (!text || tr.dataset.text.includes(text));
}

function addRecord(e) {
  if (e.kind === "connection" && e.close && e.close.startsWith("intercepted")) return; // its requests are listed
  state.counts.total++;
  if (e.verdict === "allow" || e.verdict === "learned") state.counts.allow++; else if (e.verdict === "deny") state.counts.deny++;
  const src = e.source || "?";
  state.sources.set(src, (state.sources.get(src) || 0) + 1);
  if (e.url && state.samples.length < 50 && !state.samples.includes(e.method + " " + e.url)) state.samples.push((e.method ? e.method + " " : "") + e.url);
  else if (e.host && e.port && state.samples.length < 50) { const u = (e.port === 80 ? "http://" : "https://") + e.host + "/"; if (!state.samples.includes(u)) state.samples.push(u); }
  const tr = rowFor(e);
  tr.hidden = !visible(tr);
  // An approval's row stays: markDecided turns it into the decision, and the
  // traffic the decision let through follows as rows of its own.
  $("rows").append(tr);
  while ($("rows").children.length > MAX_ROWS) $("rows").firstChild.remove();
  if (state.follow) $("scroller").scrollTop = $("scroller").scrollHeight;
  renderCounters();
}

function applyFilters() { for (const tr of $("rows").children) tr.hidden = !visible(tr); }
function renderCounters() {
  $("c-total").textContent = state.counts.total; $("c-allow").textContent = state.counts.allow;
  $("c-deny").textContent = state.counts.deny; $("c-pending").textContent = state.queue.length;
  // The sources seen, and those the Sessions view asked for before their
  // first record.
  const fs = $("f-source"), cur = fs.value, names = [...new Set([...state.sources.keys(), ...state.pinned])].sort();
  if (fs.options.length - 1 !== names.length) {
    fs.replaceChildren(el("option", { value: "" }, "all"), ...names.map((s) => el("option", { value: s }, s)));
    fs.value = cur;
  }
  $("per-source").textContent = [...state.sources].map(([s, n]) => visibleText(s) + " " + n).join(" · ");
}
for (const id of ["hide-llm", "f-source", "f-verdict", "f-text"]) $(id).addEventListener("input", applyFilters);
$("scroller").addEventListener("scroll", () => {
  const s = $("scroller");
  state.follow = s.scrollTop + s.clientHeight >= s.scrollHeight - 4;
  $("paused").hidden = state.follow;
});
$("resume").addEventListener("click", () => { state.follow = true; $("scroller").scrollTop = $("scroller").scrollHeight; $("paused").hidden = true; });

// ---- approvals ----
async function refreshApprovals() {
  let list;
  try { list = await api("GET", sb("/approvals")); } catch { return; }
  const ids = new Set(list.map((p) => p.id));
  const now = Date.now();
  for (const p of list) p.shownAt = now; // seconds_left is as of this fetch
  state.queue = list;
  for (const p of list) {
    if (![...$("rows").children].some((r) => r.dataset.approval === p.id)) {
      const tr = rowFor({ time: p.created, source: p.source, method: p.method, url: approvalWhat(p), pending: true, verdict: "" });
      tr.dataset.approval = p.id; tr.dataset.host = p.host; tr.hidden = !visible(tr);
      $("rows").append(tr);
    }
  }
  renderCounters();
  if (state.current && !ids.has(state.current.id)) closeAsk();
  if (!state.current && list.length) openAsk(list[0]);
}

// approvalWhat says what an approval asks for, in the monitor's URL column:
// the URL of traffic, or what a member asked for through the member API.
function approvalWhat(p) {
  if (p.kind === "port") return "port " + p.port + " (preview from the host)";
  if (p.kind === "resources") return resourcesText(p);
  return p.url;
}
// portText says where an allowed port request is reached from: the
// address airlockd listens on (expose_listen), which the approval carries.
function portText(p) {
  if (!p.listen) return "port " + p.port + " (this airlockd cannot open ports)";
  const local = p.listen === "127.0.0.1" || p.listen === "::1";
  return "port " + p.port + " (airlockd listens on " + p.listen + " and forwards to it" + (local ? ": this host only)" : ": open to everyone who reaches that address)");
}
function resourcesText(p) {
  const parts = [];
  if (p.memory_mb) parts.push("memory " + p.memory_mb + " MB");
  if (p.cpus) parts.push(p.cpus + " CPUs");
  if (p.pids) parts.push(p.pids + " processes");
  return parts.join(", ");
}

function onApproval(e) {
  if (e.action === "opened") alertPerson(e);
  else markDecided(e.approval_id, e.action);
  refreshApprovals();
}

// markDecided turns a pending row into what the person (or the clock)
// decided.
function markDecided(id, action, why) {
  const r = [...$("rows").children].find((x) => x.dataset.approval === id);
  if (!r) return;
  if (why) r.title = visibleText(why);
  if (r.dataset.verdict !== "pending") return; // decided already (the event, then the answer)
  const allowed = action === "allow_once" || action === "allow_pattern" || action === "allow";
  const td = r.querySelector("td:nth-child(5)");
  r.dataset.verdict = allowed ? "allow" : "deny";
  td.className = allowed ? "status-allow" : action === "failed" ? "status-error" : "status-deny";
  td.textContent = action === "allow" ? "allowed" : allowed ? "allowed (" + action.replace("_", " ") + ")" : action === "timeout" ? "denied (no decision)" : action === "gone" ? "gone (the member hung up)" : action === "failed" ? "allowed, but failed" : "denied";
  if (!allowed) { state.counts.deny++; renderCounters(); }
}

function alertPerson(e) {
  try {
    const ctx = new (window.AudioContext || window.webkitAudioContext)();
    const o = ctx.createOscillator(), g = ctx.createGain();
    o.frequency.value = 880; g.gain.value = 0.08; o.connect(g); g.connect(ctx.destination);
    o.start(); o.stop(ctx.currentTime + 0.15);
  } catch { /* no audio */ }
  if (document.hidden && "Notification" in window) {
    if (Notification.permission === "granted") new Notification("airlock: " + visibleText(e.source || "a member") + " asks for " + visibleText(e.url || e.host));
    else if (Notification.permission === "default") Notification.requestPermission();
  }
}

function openAsk(p) {
  if (!$("ask").open) state.returnFocus = document.activeElement;
  state.current = p;
  // What is decided stays in the fixed place at the top: the host, the
  // member's port, or the limits asked for.
  const kind = p.kind || "network", actions = p.actions || ["deny", "allow_once", "allow_pattern"];
  $("ask-title").textContent = kind === "port" ? "Open a port for a preview?" : kind === "resources" ? "Change this member's limits?" : p.requested ? "Allow this destination?" : "Allow this connection?";
  $("ask-host-label").textContent = kind === "port" ? "Port" : kind === "resources" ? "Limits" : "Host";
  $("ask-host").textContent = kind === "port" ? String(p.port) : kind === "resources" ? resourcesText(p) : visibleText(p.host) + (p.port && p.port !== 80 && p.port !== 443 ? ":" + p.port : "");
  $("ask-source").textContent = visibleText(p.source || "a member") + (p.agent ? " (driven by " + visibleText(p.agent) + ")" : "");
  $("ask-wants").textContent = kind === "port" ? "asks to be reached from this host on" : kind === "resources" ? "asks for" : p.requested ? "asks in advance for" : "wants";
  $("ask-url").textContent = kind === "network" ? visibleText((p.method ? p.method + " " : "") + p.url) : kind === "port" ? portText(p) : resourcesText(p);
  $("ask-reason").textContent = visibleText(p.reason || ""); $("ask-reason-box").hidden = !p.reason;
  $("ask-patterns").hidden = !actions.includes("allow_pattern"); $("ask-save-box").hidden = kind !== "network";
  $("b-once").hidden = !actions.includes("allow_once"); $("b-pattern").hidden = !actions.includes("allow_pattern"); $("b-allow").hidden = !actions.includes("allow");
  const others = (p.sources || []).filter((s) => s !== p.source);
  $("ask-via").textContent = others.length ? "Also waiting for it: " + others.map(visibleText).join(", ") : ""; $("ask-via").hidden = !others.length;
  $("ask-queue").textContent = (p.waiting > 1 && !p.requested ? p.waiting + " connections wait for this. " : "") + (state.queue.length > 1 ? (state.queue.length - 1) + " more after this." : "");
  const hdr = p.headers ? Object.entries(p.headers).map(([k, v]) => visibleText(k) + ": " + v.map(visibleText).join(", ")).join("\n") : "";
  $("ask-headers").textContent = hdr; $("ask-headers-box").hidden = !hdr;
  $("choices").replaceChildren(...p.suggestions.map((s, i) => el("label", {}, el("input", { type: "radio", name: "pattern", value: s.pattern, ...(i === 0 ? { checked: "" } : {}) }), " ", el("code", {}, s.pattern), " ", el("span", { class: "muted" }, s.label))));
  $("custom").hidden = true; $("broad").hidden = true; $("ask-error").textContent = "";
  $("custom-pattern").value = p.suggestions.length > 2 ? p.suggestions[2].pattern : (p.suggestions[0] || {}).pattern || "";
  tick();
  clearInterval(state.timer); state.timer = setInterval(tick, 250);
  if (!$("ask").open) $("ask").showModal();
  // Focus starts on the first pattern choice: the keys work from there and
  // nothing is decided by a stray Enter.
  const first = document.querySelector('#choices input[name="pattern"]');
  (first || $("b-deny")).focus();
  armAsk();
}

// A dialog that has just opened, or turned to another approval, decides
// nothing for a moment: a click or key meant for the one before (a member
// can time its requests to a person's habits) does not decide this one.
// #ask carries data-armed once it takes decisions.
const ARM_MS = 800;
function armAsk() {
  state.armedAt = Date.now() + ARM_MS; state.pressed = null;
  delete $("ask").dataset.armed;
  clearTimeout(state.armTimer);
  state.armTimer = setTimeout(() => { $("ask").dataset.armed = "1"; }, ARM_MS);
}

function tick() {
  const p = state.current;
  if (!p) return;
  const left = Math.max(0, Math.ceil(p.seconds_left - (Date.now() - p.shownAt) / 1000));
  $("countdown").textContent = left + " s";
  if (left <= 0) { closeAsk(); setTimeout(refreshApprovals, 500); }
}

function closeAsk() {
  clearInterval(state.timer); state.current = null;
  if ($("ask").open) $("ask").close();
  const back = state.returnFocus; state.returnFocus = null;
  if (back && back.isConnected && typeof back.focus === "function") back.focus();
}

document.addEventListener("change", (ev) => {
  if (ev.target.name === "pattern") { $("custom").hidden = ev.target.value !== "__custom"; if (!$("custom").hidden) liveTest(); else checkBroad(); }
});

function chosenPattern() {
  const r = document.querySelector('input[name="pattern"]:checked');
  if (!r) return "";
  if (r.value !== "__custom") return r.value;
  const v = $("custom-pattern").value.trim();
  return $("custom-regex").checked && !/^regex:/i.test(v) ? "regex:" + v : v;
}

let testSeq = 0;
async function liveTest() {
  const pattern = chosenPattern(), seq = ++testSeq;
  const urls = [...new Set([...(state.current ? [(state.current.method ? state.current.method + " " : "") + state.current.url.replace(/^([^:/]+):(\d+)$/, (m, h, port) => (port === "80" ? "http://" : "https://") + h + (port === "80" || port === "443" ? "" : ":" + port) + "/")] : []), ...state.samples, ...$("custom-samples").value.split("\n").map((s) => s.trim()).filter(Boolean)])].slice(0, 100);
  if (!pattern) { $("custom-results").replaceChildren(); return; }
  let out;
  try { out = await api("POST", sb("/allowlist/test"), { pattern, urls }); } catch (e) { $("custom-results").replaceChildren(el("li", { class: "error" }, e.message)); return; }
  if (seq !== testSeq) return; // a newer keystroke won
  $("broad").hidden = !out.broad;
  if (out.error && !out.broad) { $("custom-results").replaceChildren(el("li", { class: "error" }, out.error)); return; }
  $("custom-results").replaceChildren(...out.results.map((r) => el("li", {}, el("span", { class: "m " + (r.matches ? "yes" : "no") }, r.error ? "ERROR" : r.matches ? "MATCHES" : "NO MATCH"), el("span", { class: "mono" }, r.url))),
    el("li", { class: "muted" }, out.recorded_matches + " recorded requests match"));
}
async function checkBroad() {
  const pattern = chosenPattern();
  if (!pattern) return;
  try { const out = await api("POST", sb("/allowlist/test"), { pattern, urls: [] }); $("broad").hidden = !out.broad; } catch { /* shown on submit */ }
}
oneLine($("custom-pattern"));
for (const id of ["custom-pattern", "custom-samples"]) $(id).addEventListener("input", liveTest);
$("custom-regex").addEventListener("change", liveTest);

async function decide(action) {
  const p = state.current;
  if (!p || Date.now() < state.armedAt) return;
  const body = { action };
  if (action === "allow_pattern") { body.pattern = chosenPattern(); body.persist = $("ask-save").checked; if (!$("broad").hidden) body.force = confirm("This pattern is very broad. Allow it anyway?"); }
  if (action === "deny" && (p.kind || "network") === "network") body.persist = $("ask-save").checked && confirm("Also deny " + visibleText(p.host) + " from now on (save a deny rule)?");
  try { await api("POST", sb("/approvals/" + encodeURIComponent(p.id)), body); } catch (e) {
    // 502: allowed, but what was allowed could not be done; the approval
    // is decided, and its row says why.
    if (e.status === 502) { closeAsk(); markDecided(p.id, "failed", e.message); refreshApprovals(); return; }
    $("ask-error").textContent = e.message; return;
  }
  closeAsk(); refreshApprovals();
}
$("b-deny").addEventListener("click", () => decide("deny"));
$("b-once").addEventListener("click", () => decide("allow_once"));
$("b-pattern").addEventListener("click", () => decide("allow_pattern"));
$("b-allow").addEventListener("click", () => decide("allow"));
// A key decides when it comes up, and only if it went down on this
// approval once the dialog took decisions: a key held from the approval
// before, or repeating, decides nothing here.
function shortcut(ev) {
  if (ev.target.tagName === "INPUT" && ev.target.type !== "radio" && ev.target.type !== "checkbox" || ev.target.tagName === "TEXTAREA") return "";
  const k = ev.key.toLowerCase();
  const acts = (state.current && state.current.actions) || [];
  if (k === "a" && (acts.includes("allow") || acts.includes("allow_once"))) return acts.includes("allow") ? "allow" : "allow_once";
  if (k === "p" && acts.includes("allow_pattern")) return "allow_pattern";
  if (k === "d") return "deny";
  return "";
}
$("ask").addEventListener("keydown", (ev) => {
  const action = shortcut(ev);
  if (!action) return;
  ev.preventDefault();
  if (ev.repeat || !state.current || Date.now() < state.armedAt) return;
  state.pressed = { key: ev.key.toLowerCase(), id: state.current.id };
});
$("ask").addEventListener("keyup", (ev) => {
  const action = shortcut(ev), pressed = state.pressed;
  state.pressed = null;
  if (!action || !pressed || pressed.key !== ev.key.toLowerCase() || !state.current || pressed.id !== state.current.id) return;
  ev.preventDefault();
  decide(action);
});
// Escape does not silently dismiss a held request: it says what to do.
// The keydown is cancelled so no close request starts; should the browser
// close the dialog anyway (a cancel event it does not let the page
// cancel), the dialog opens again while the request is held.
const escapeHint = () => {
  const acts = (state.current && state.current.actions) || [];
  const keys = [["deny", "Deny (D)"], ["allow_once", "Allow once (A)"], ["allow", "Allow (A)"], ["allow_pattern", "Allow pattern (P)"]].filter(([a]) => acts.includes(a)).map(([, t]) => t);
  $("ask-error").textContent = "The request waits for your decision: " + keys.join(", ").replace(/, ([^,]*)$/, " or $1") + ".";
};
$("ask").addEventListener("keydown", (ev) => { if (ev.key === "Escape") { ev.preventDefault(); escapeHint(); } }, true);
$("ask").addEventListener("cancel", (ev) => { ev.preventDefault(); escapeHint(); });
$("ask").addEventListener("input", () => { if ($("ask-error").textContent.startsWith("The request waits")) $("ask-error").textContent = ""; });
$("ask").addEventListener("close", () => {
  if (state.current) { $("ask").showModal(); escapeHint(); const f = document.querySelector('input[name="pattern"]:checked') || $("b-deny"); f.focus(); }
});

// ---- rules ----
async function matchedCount(pattern) {
  try { return (await api("POST", sb("/allowlist/test"), { pattern, urls: [], force: true })).recorded_matches; } catch { return "?"; }
}
async function loadRules() {
  for (const [list, body] of [["allowlist", "allow-rows"], ["denylist", "deny-rows"]]) {
    let rules;
    try { rules = await api("GET", sb("/" + list)); } catch { continue; }
    const rows = await Promise.all(rules.map(async (r) => {
      let actions;
      if (r.tier === "auto") actions = el("td", { class: "muted" }, "managed");
      else if (r.tier === "preset") actions = el("td", { class: "muted" }, "from " + r.source + " (turn it off in Settings)");
      else {
        actions = el("td", { class: "actions" },
          el("button", { "aria-label": "edit " + r.pattern, onclick: (ev) => editRule(ev.target.closest("tr"), list, r) }, "edit"),
          el("button", { class: "danger", "aria-label": "delete " + r.pattern, onclick: async () => {
            try { await api("DELETE", sb("/" + list + "/" + r.id)); loadRules(); } catch (e) { $("add-error").textContent = e.message; }
          } }, "delete"));
      }
      return el("tr", { "data-id": r.id }, el("td", { class: "mono", title: r.pattern }, r.pattern), el("td", {}, r.type), el("td", {}, r.tier),
        el("td", {}, (r.llm ? "LLM API; " : "") + (r.member ? "only " + r.member + "; " : "") + (r.source || "")), el("td", {}, r.added ? new Date(r.added).toLocaleString() : ""),
        el("td", { class: "num" }, await matchedCount(r.pattern)), actions);
    }));
    if (state.editing && $(body).querySelector(".editing")) continue; // an editor opened while the counts loaded
    $(body).replaceChildren(...rows);
  }
}
// editRule turns a rule's row into an editor. Saving replaces the rule in
// its place through PUT; a pattern the server refuses changes nothing and
// the editor stays open with the reason.
function editRule(tr, list, r) {
  if (state.editing) return;
  state.editing = true;
  const cell = tr.children[0], actions = tr.lastChild;
  const input = patternBox({ "aria-label": "new pattern for " + r.pattern }, r.pattern, () => save());
  const err = el("div", { class: "row-error", role: "alert" });
  const done = () => { state.editing = false; loadRules(); };
  const save = async (force) => {
    const pattern = input.value.trim();
    if (pattern === r.pattern) { done(); return; }
    err.textContent = "";
    try { await api("PUT", sb("/" + list + "/" + r.id), force === true ? { pattern, force } : { pattern }); done(); } catch (e) {
      // A broad allow pattern is saved only when the person insists.
      if (force !== true && e.message.includes("too broad") && confirm("“" + pattern + "” covers a whole public suffix or everything; allowing it defeats the sandbox. Save it anyway?")) { save(true); return; }
      err.textContent = e.message; input.focus();
    }
  };
  input.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { ev.preventDefault(); done(); } });
  cell.className = "editing"; cell.replaceChildren(input, err);
  actions.replaceChildren(el("button", { class: "primary", "aria-label": "save pattern " + r.pattern, onclick: save }, "save"),
    el("button", { "aria-label": "cancel editing " + r.pattern, onclick: done }, "cancel"));
  input.focus(); input.select();
}
$("add-rule").addEventListener("submit", async (ev) => {
  ev.preventDefault(); $("add-error").textContent = "";
  try {
    await api("POST", sb("/" + $("new-list").value), { pattern: $("new-pattern").value.trim(), persist: $("new-save").checked });
    $("new-pattern").value = ""; loadRules();
  } catch (e) { $("add-error").textContent = e.message; }
});

// ---- previews ----
// loadPreviews shows the sandbox's exposures and its live members, again
// every 2 s while the tab is open (members come and go without events).
// Member names are the member's to choose: they go in as text through el.
async function loadPreviews() {
  clearTimeout(state.previewsTimer);
  if ($("tab-previews").hidden || !state.sandbox) return;
  const sandbox = state.sandbox;
  try {
    const [exposures, members] = await Promise.all([api("GET", sb("/exposures")), api("GET", sb("/members"))]);
    if (sandbox !== state.sandbox) return;
    renderExposures(exposures);
    renderMembers(members);
  } catch (e) { $("previews-error").textContent = e.message; }
  clearTimeout(state.previewsTimer);
  if (!$("tab-previews").hidden) state.previewsTimer = setTimeout(loadPreviews, 2000);
}

function renderExposures(list) {
  $("previews-status").textContent = list.length === 1 ? "1 exposure" : list.length + " exposures";
  if (!list.length) {
    $("exposure-rows").replaceChildren(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "Nothing exposed. Expose a member's port below, or run airlock expose SANDBOX MEMBER PORT.")));
    return;
  }
  $("exposure-rows").replaceChildren(...list.map((x) => {
    const href = exposureHref(x.url);
    const link = href ? el("a", { href, target: "_blank", rel: "noopener noreferrer", "aria-label": "open " + x.member + " port " + x.port }, "open") : el("span", {}, "");
    return el("tr", { "data-exposure": x.id },
      el("td", { title: x.addr }, x.member),
      el("td", { class: "num" }, String(x.port)),
      el("td", { class: "mono" }, x.host_addr),
      el("td", { title: new Date(x.created).toLocaleString() }, new Date(x.created).toLocaleTimeString([], { hour12: false })),
      el("td", { class: "actions" }, link, " ",
        el("button", { class: "danger", "aria-label": "close " + x.member + " port " + x.port, onclick: (ev) => closeExposure(ev.target, x) }, "close")));
  }));
}

// exposureHref is the link to an exposure's URL (airlockd's own listener;
// only http links are made) under a host name other than this page's. A
// browser sends a host's cookies to every port of it: the page's session
// cookie must not go to the member's server. Both names are the host's
// loopback.
function exposureHref(url) {
  if (!/^http:\/\/[0-9.:[\]a-f]+\/$/.test(url)) return "";
  const u = new URL(url);
  if (u.hostname === location.hostname) u.hostname = u.hostname === "127.0.0.1" ? "localhost" : "127.0.0.1";
  return u.href;
}

function renderMembers(list) {
  // A port being typed survives the refresh.
  const typed = new Map([...$("preview-member-rows").querySelectorAll("input[data-addr]")].map((i) => [i.dataset.addr, i.value]));
  if (!list.length) {
    $("preview-member-rows").replaceChildren(el("tr", {}, el("td", { colspan: "4", class: "muted" }, "No live members in this sandbox.")));
    return;
  }
  $("preview-member-rows").replaceChildren(...list.map((m) => {
    const port = el("input", { type: "number", min: "1", max: "65535", step: "1", inputmode: "numeric", placeholder: "port", "data-addr": m.addr, "aria-label": "port of " + m.name + " to expose" });
    port.value = typed.get(m.addr) || "";
    return el("tr", { "data-member": m.addr },
      el("td", {}, m.name), el("td", { class: "mono" }, m.addr), el("td", {}, m.kind),
      el("td", { class: "actions" }, port, " ", el("button", { "aria-label": "expose a port of " + m.name, onclick: (ev) => exposePort(ev.target, m, port) }, "expose port")));
  }));
}

async function exposePort(button, m, input) {
  const port = Number(input.value);
  $("previews-error").textContent = "";
  if (!Number.isInteger(port) || port < 1 || port > 65535) { $("previews-error").textContent = "port must be 1 to 65535"; input.focus(); return; }
  button.disabled = true;
  try {
    // By address: two members may share a name.
    await api("POST", sb("/exposures"), { member: m.addr, port });
    input.value = "";
    await loadPreviews();
  } catch (e) { $("previews-error").textContent = e.message; } finally { button.disabled = false; }
}

async function closeExposure(button, x) {
  button.disabled = true; $("previews-error").textContent = "";
  try {
    await api("DELETE", sb("/exposures/" + encodeURIComponent(x.id)));
    await loadPreviews();
  } catch (e) { $("previews-error").textContent = e.message; button.disabled = false; }
}

// ---- sessions ----
// ageText shows seconds as a person reads them: 40 s, 12 min, 3 h 5 min,
// 2 d 4 h.
function ageText(sec) {
  sec = Math.max(0, Math.round(sec || 0));
  if (sec < 60) return sec + " s";
  if (sec < 3600) return Math.floor(sec / 60) + " min";
  if (sec < 86400) return Math.floor(sec / 3600) + " h " + Math.floor(sec % 3600 / 60) + " min";
  return Math.floor(sec / 86400) + " d " + Math.floor(sec % 86400 / 3600) + " h";
}

// loadSessions shows the sandbox's sessions, again every 2 s while the
// view is open: their status, age and idle time change on the server.
async function loadSessions() {
  clearTimeout(state.sessionsTimer);
  if ($("tab-sessions").hidden || !state.sandbox) return;
  const sandbox = state.sandbox;
  try {
    const res = await api("GET", sb("/sessions"));
    if (sandbox !== state.sandbox) return; // another sandbox opened meanwhile
    renderSessions(res.sessions || []);
    $("sessions-error").textContent = "";
  } catch (e) { $("sessions-error").textContent = e.message; }
  clearTimeout(state.sessionsTimer);
  if (!$("tab-sessions").hidden) state.sessionsTimer = setTimeout(loadSessions, 2000);
}

// renderSessions lists sessions; user IDs, file names and hosts come from
// the platform and the member, and go in as text through el.
function renderSessions(list) {
  $("sessions-status").textContent = list.length === 1 ? "1 session" : list.length + " sessions";
  if (!list.length) {
    $("session-rows").replaceChildren(el("tr", {}, el("td", { colspan: "10", class: "muted" }, "No sessions in this sandbox. A platform starts one with execute_task (MCP) or POST …/sessions.")));
    return;
  }
  $("session-rows").replaceChildren(...list.map((s) => {
    const n = s.network || { allowed: 0, denied: 0, held: 0, hosts: [] }, files = s.files_created || [], hosts = n.hosts || [];
    const status = s.status === "busy" ? "running a task" : s.last_status ? "idle · last " + s.last_status : "idle";
    const cls = s.status === "busy" ? "warn" : s.last_status === "completed" ? "ok" : s.last_status ? "bad" : "";
    const tr = el("tr", { "data-session": s.session_id },
      el("td", { class: "mono", title: s.member }, s.session_id.slice(0, 8) + "…"),
      el("td", { title: s.user_id }, s.user_id),
      el("td", { class: cls }, status),
      el("td", { class: "num", title: "started " + new Date(s.created).toLocaleString() }, ageText(s.age_seconds)),
      el("td", { class: "num", title: new Date(s.last_used).toLocaleString() }, ageText(s.idle_seconds) + " ago"),
      el("td", { class: "num", title: s.tasks + (s.tasks === 1 ? " task" : " tasks") }, s.tasks ? durationText(s.last_duration_seconds * 1000) || "0 s" : ""),
      el("td", { class: "mono wrap", title: files.join(", ") }, files.length ? files.join(", ") : "none"),
      el("td", { title: n.allowed + " allowed, " + n.denied + " denied, " + n.held + " held for approval" },
        el("span", { class: "ok" }, n.allowed + " allowed"), " · ", el("span", { class: n.denied ? "bad" : "" }, n.denied + " denied"), " · ", el("span", { class: n.held ? "warn" : "" }, n.held + " held")),
      el("td", { class: "mono wrap", title: hosts.join(", ") }, hosts.join(", ")),
      el("td", { class: "actions" },
        el("button", { "aria-label": "traffic of " + s.member, onclick: () => showTraffic(s.member) }, "traffic"),
        el("button", { class: "danger", "aria-label": "clean up " + s.member, onclick: (ev) => cleanupSession(ev.target, s) }, "clean up")));
    return tr;
  }));
}

// showTraffic opens the monitor filtered by a session's member.
function showTraffic(member) {
  state.pinned.add(member);
  renderCounters();
  $("f-source").value = member;
  applyFilters();
  const b = $("tabbtn-monitor");
  selectTab(b); b.focus();
}

// cleanupSession ends a session through the API: a running task is
// stopped, the workspace removed.
async function cleanupSession(button, s) {
  button.disabled = true; $("sessions-error").textContent = "";
  try {
    await api("DELETE", sb("/sessions/" + encodeURIComponent(s.session_id)));
  } catch (e) { $("sessions-error").textContent = e.message; button.disabled = false; return; }
  await loadSessions();
  $("sessions-status").textContent = "Cleaned up " + s.member + ".";
}

// ---- Docker members ----
// workspacePathError mirrors the archive route's check (ui.CheckWorkspacePath),
// to say at once what is wrong with a path; the server checks it again.
function workspacePathError(p) {
  if (!p.startsWith("/")) return "write an absolute path under /workspace, such as /workspace/dist";
  if (/[\u0000-\u001f\u007f-\u009f]/.test(p)) return "the path holds a control character";
  const segs = p.split("/").slice(1);
  if (segs.includes("..")) return "no .. segments: downloads come only from under /workspace";
  if (segs.some((s, i) => s === "" || s === ".") ) return "write the path plainly: no empty or . segments, no slash at the end";
  if (p !== "/workspace" && !p.startsWith("/workspace/")) return "downloads come only from under /workspace";
  return "";
}

// loadMembers lists the sandbox's Docker members; a path typed into a row
// survives the reload.
async function loadMembers() {
  if ($("tab-members").hidden || !state.sandbox) return;
  const sandbox = state.sandbox;
  let list;
  try { list = await api("GET", sb("/containers")); } catch (e) { $("members-error").textContent = e.message; $("member-rows").replaceChildren(); return; }
  if (sandbox !== state.sandbox) return;
  $("members-error").textContent = "";
  $("members-status").textContent = list.length === 1 ? "1 member" : list.length + " members";
  const typed = new Map([...$("member-rows").querySelectorAll("tr[data-id]")].map((tr) => [tr.dataset.id, tr.querySelector("input").value]));
  if (!list.length) {
    $("member-rows").replaceChildren(el("tr", {}, el("td", { colspan: "7", class: "muted" }, "No Docker members in this sandbox. Start one with airlock docker run, or docker run --network airlock-" + state.sandbox + ".")));
    return;
  }
  $("member-rows").replaceChildren(...list.map((m) => {
    const input = el("input", { class: "mono", value: typed.get(m.id) || "/workspace", "aria-label": "workspace path to download from " + m.name, spellcheck: "false" });
    const err = el("div", { class: "row-error", role: "alert" });
    return el("tr", { "data-id": m.id },
      el("td", { title: m.name + " (" + m.id.slice(0, 12) + ")" }, m.name),
      el("td", { title: m.agent ? "driven by " + m.agent : "" }, m.source),
      el("td", {}, m.trust || ""),
      el("td", { class: "mono" }, m.addr || ""),
      el("td", {}, m.managed ? "airlock (" + m.managed + ")" : "docker"),
      el("td", {}, input, err),
      el("td", { class: "actions" },
        el("button", { "aria-label": "logs of " + m.name, onclick: () => openLogs(m) }, "logs"),
        el("button", { "aria-label": "download from " + m.name, onclick: (ev) => downloadArchive(ev.target, m, input, err) }, "download")));
  }));
}
$("members-refresh").addEventListener("click", loadMembers);

// downloadArchive fetches the archive of the row's path and saves it; a
// refusal (a path outside /workspace, a member gone) shows in the row.
async function downloadArchive(button, m, input, err) {
  const p = input.value.trim();
  err.textContent = workspacePathError(p);
  if (err.textContent) { input.focus(); return; }
  button.disabled = true;
  try {
    const res = await fetch("/api/v1" + sb("/containers/" + encodeURIComponent(m.id) + "/archive?path=" + encodeURIComponent(p)), { credentials: "same-origin" });
    if (res.status === 401) { showLogin(); return; }
    if (!res.ok) {
      const data = await res.json().catch(() => ({}));
      err.textContent = (data.error || res.statusText) + (data.hint ? " (" + data.hint + ")" : "");
      return;
    }
    const url = URL.createObjectURL(await res.blob());
    const name = (/filename="([^"]+)"/.exec(res.headers.get("Content-Disposition") || "") || [, "workspace.tar.gz"])[1];
    const a = el("a", { href: url, download: name, hidden: "" });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    $("members-status").textContent = "Downloaded " + p + " of " + visibleText(m.name) + " as " + name + ".";
  } catch (e) { err.textContent = e.message; } finally { button.disabled = false; }
}

// openLogs streams a member's output into the panel, one line per event,
// as text; the stream's end closes it (an EventSource would otherwise
// reconnect and show it all again).
const MAX_LOG_LINES = 2000;
function openLogs(m) {
  closeLogs();
  $("member-logs").hidden = false;
  $("logs-name").textContent = visibleText(m.name);
  $("logs").replaceChildren();
  $("logs-status").textContent = "following…";
  // A line cut in pieces is put together per stream: a piece of stderr
  // between two of stdout is a line of its own, not part of theirs.
  const partial = { stdout: "", stderr: "" };
  const es = new EventSource("/api/v1" + sb("/containers/" + encodeURIComponent(m.id) + "/logs?follow=1&tail=500"));
  state.logs = es;
  const add = (stream) => (ev) => {
    const l = JSON.parse(ev.data), box = $("logs");
    partial[stream] += l.line;
    if (l.partial && partial[stream].length < 65536) return;
    const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    box.append(el("div", { class: stream }, partial[stream]));
    partial[stream] = "";
    while (box.children.length > MAX_LOG_LINES) box.firstChild.remove();
    if (atEnd) box.scrollTop = box.scrollHeight;
  };
  es.addEventListener("stdout", add("stdout"));
  es.addEventListener("stderr", add("stderr"));
  es.addEventListener("end", (ev) => {
    const end = JSON.parse(ev.data || "{}");
    es.close();
    $("logs-status").textContent = end.error ? "stopped: " + visibleText(end.error) : "the output ended (the member stopped)";
  });
  es.onerror = () => {
    if (state.logs !== es) return;
    es.close();
    $("logs-status").textContent = "the stream broke off; open the logs again to read on";
  };
  $("logs").focus();
}
function closeLogs() {
  if (state.logs) { state.logs.close(); state.logs = null; }
  $("member-logs").hidden = true;
}
$("logs-close").addEventListener("click", closeLogs);

// ---- settings ----
async function loadSettings() {
  let s;
  try { s = await api("GET", sb("")); } catch { return; }
  // Another tab or the CLI may have changed them; a form the user is
  // changing stays as it is.
  const dirty = state.settings && (chosenAction() !== state.settings.unknown_action || $("timeout-input").value !== String(state.settings.approval_timeout) ||
    chosenPresets().join() !== state.settings.presets.join());
  if (!state.presets) {
    try { state.presets = await api("GET", "/presets"); } catch { state.presets = []; }
    $("presets").replaceChildren(...state.presets.map((p) => el("label", { class: "preset" },
      el("input", { type: "checkbox", name: "preset", value: p.name, onchange: settingsChanged }), " ", el("b", {}, p.name), " — ", p.description,
      el("span", { class: "muted mono hosts" }, p.includes.length ? "all of " + p.includes.join(", ") : p.entries.map((e) => e.host).filter((h, i, a) => a.indexOf(h) === i).join(", ")))));
  }
  state.settings = { unknown_action: s.unknown_action, approval_timeout: s.approval_timeout, presets: s.presets || [] };
  if (!dirty) showSettings();
  $("s-inspect").textContent = s.inspect === "all" ? "all TLS intercepted" : "only hosts with path or method rules";
  $("s-policy").textContent = s.policy; $("s-subnet").textContent = s.subnet;
  if (!s.mcp_servers.length) $("mcp-rows").replaceChildren(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "No MCP servers in this sandbox's policy file.")));
  else $("mcp-rows").replaceChildren(...s.mcp_servers.map((m) => el("tr", {}, el("td", {}, m.name), el("td", {}, m.transport), el("td", {}, m.network),
    el("td", { class: "mono" }, m.domains.join(", ")), el("td", { class: m.risk === "high" ? "bad" : m.risk === "medium" ? "warn" : "" }, m.risk + (m.risk === "high" ? " — reaches any URL it is asked for" : "")))));
}

// showSettings puts the settings in force into the form.
function showSettings() {
  const s = state.settings;
  for (const r of document.querySelectorAll('input[name="unknown_action"]')) r.checked = r.value === s.unknown_action;
  $("timeout-input").value = s.approval_timeout;
  for (const c of document.querySelectorAll('input[name="preset"]')) c.checked = s.presets.includes(c.value);
  $("allow-confirm").checked = false;
  settingsForm();
}
function chosenAction() { const r = document.querySelector('input[name="unknown_action"]:checked'); return r ? r.value : ""; }
function chosenPresets() { return [...document.querySelectorAll('input[name="preset"]:checked')].map((c) => c.value); }
// settingsForm shows the warning for allow and keeps Save off until
// switching to allow is confirmed.
function settingsForm() {
  const s = state.settings || {}, action = chosenAction();
  const toAllow = action === "allow" && s.unknown_action !== "allow";
  $("allow-warning").hidden = action !== "allow";
  $("allow-confirm").parentElement.hidden = !toAllow;
  $("settings-save").disabled = toAllow && !$("allow-confirm").checked;
}
function settingsChanged() { $("settings-status").textContent = ""; $("settings-error").textContent = ""; settingsForm(); }
for (const r of document.querySelectorAll('input[name="unknown_action"]')) r.addEventListener("change", settingsChanged);
$("allow-confirm").addEventListener("change", settingsChanged);
$("timeout-input").addEventListener("input", settingsChanged);
$("settings-reset").addEventListener("click", () => { if (state.settings) { showSettings(); settingsChanged(); } });
$("settings-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const s = state.settings, body = {};
  $("settings-error").textContent = ""; $("settings-status").textContent = "";
  if (!s) return;
  const action = chosenAction(), raw = $("timeout-input").value.trim();
  if (!/^[0-9]+$/.test(raw) || +raw < 1 || +raw > 600) {
    $("settings-error").textContent = "Approval timeout: whole seconds from 1 to 600.";
    $("timeout-input").setAttribute("aria-invalid", "true"); $("timeout-input").focus(); return;
  }
  $("timeout-input").removeAttribute("aria-invalid");
  if (action !== s.unknown_action) body.unknown_action = action;
  if (+raw !== s.approval_timeout) body.approval_timeout = +raw;
  if (chosenPresets().join() !== s.presets.join()) body.presets = chosenPresets();
  if (!Object.keys(body).length) { $("settings-status").textContent = "Nothing to save."; return; }
  try {
    const out = await api("PATCH", sb("/settings"), body);
    state.settings = { unknown_action: out.unknown_action, approval_timeout: out.approval_timeout, presets: out.presets || [] }; showSettings();
    $("settings-status").textContent = "Saved: unknown destinations " + out.unknown_action + ", timeout " + out.approval_timeout + " s, presets " + (out.presets.length ? out.presets.join(", ") : "none") + ".";
    refreshLearn();
  } catch (e) { $("settings-error").textContent = e.message; }
});

start();
