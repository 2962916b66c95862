/* The web inspector (docs/inspector.md): every view is filled from the service's JSON API,
   called with the key typed into the page. The key is held in `key` below and nowhere else
   (no cookie, no localStorage or sessionStorage): a reload forgets it. Every text from the
   API is set as text (textContent), never parsed as HTML. */
"use strict";

(() => {
  let key = null; // the API key in use: this variable only
  let agent = null; // the agent the views show
  const pages = {}; // the `next` cursor of each paged list
  let searchChart = null;
  let graph = null;

  const $ = (selector, root = document) => root.querySelector(selector);
  const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));

  /** An element with attributes and children (strings become text nodes). */
  function h(tag, attrs = {}, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else if (name === "class") el.className = value;
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  class ApiError extends Error {
    constructor(status, detail) {
      super(`${status}: ${detail}`);
      this.status = status;
      this.detail = detail;
    }
  }

  /** The API's answer as JSON; an ApiError with the API's own detail on a refusal. */
  async function api(method, path, { params = {}, body } = {}) {
    const url = new URL(path, window.location.origin);
    for (const [name, value] of Object.entries(params)) {
      if (value === "" || value === null || value === undefined) continue;
      for (const one of Array.isArray(value) ? value : [value]) url.searchParams.append(name, one);
    }
    const headers = { Accept: "application/json" };
    if (key) headers.Authorization = `Bearer ${key}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const answer = await fetch(url, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit", cache: "no-store",
    });
    const text = await answer.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = text; }
    if (!answer.ok) {
      let detail = data && data.detail !== undefined ? data.detail : text;
      if (typeof detail !== "string") detail = JSON.stringify(detail);
      throw new ApiError(answer.status, detail);
    }
    return data;
  }

  // ---- small renderers ----------------------------------------------------------------

  const fmt = (value, digits = 3) => (typeof value === "number" ? (Number.isInteger(value) ? String(value)
    : value.toFixed(digits)) : value === null || value === undefined ? "" : String(value));
  const when = (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z") : "");
  const short = (text, n = 160) => (text && text.length > n ? `${text.slice(0, n - 1)}…` : text || "");

  /** Fill `table` with a header and one row per item; `columns`: [title, item => cell]. */
  function fillTable(table, columns, items, { onRow, append = false, rowId } = {}) {
    if (!append) {
      table.replaceChildren(h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {}, title)))), h("tbody"));
    }
    const body = table.tBodies[0] || table.appendChild(h("tbody"));
    for (const item of items) {
      const row = h("tr", { "data-id": rowId ? rowId(item) : null, class: onRow ? "clickable" : null },
        columns.map(([, cell]) => {
          const value = cell(item);
          const isWhen = typeof value === "string" && /^\d{4}-\d\d-\d\d \d\d:/.test(value);
          return h("td", { class: isWhen ? "when" : null }, value instanceof Node ? value : fmt(value));
        }));
      if (onRow) row.addEventListener("click", () => onRow(item, row));
      body.append(row);
    }
    if (!append && items.length === 0) {
      body.append(h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "nothing")));
    }
  }

  function keyValues(table, pairs) {
    table.replaceChildren(...pairs.map(([name, value]) => h("tr", {}, h("th", {}, name),
      h("td", {}, value instanceof Node ? value : fmt(value)))));
  }

  function showError(view, error) {
    const box = $("[data-error]", $(`#view-${view}`));
    if (!box) return;
    box.textContent = error ? (error instanceof ApiError ? `Refused: ${error.message}` : String(error)) : "";
  }

  /** Run `work` for `view`, showing its error (the API's refusal) instead of throwing. */
  async function guarded(view, work) {
    showError(view, null);
    try {
      return await work();
    } catch (error) {
      showError(view, error);
      return undefined;
    }
  }

  function formValues(form) {
    const values = {};
    for (const field of form.elements) {
      if (!field.name) continue;
      values[field.name] = field.type === "checkbox" ? field.checked : field.value.trim();
    }
    return values;
  }

  function setMore(name, next) {
    pages[name] = next || null;
    for (const button of $$(`[data-more="${name}"]`)) button.hidden = !next;
  }

  /** A dialog asking to confirm `text`; `fields` are inputs shown in it. Resolves true on Confirm. */
  function confirmAction(text, fields = []) {
    const dialog = $("#confirm");
    $("#confirm-text").textContent = text;
    $("#confirm-fields").replaceChildren(...fields);
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    });
  }

  // ---- the key and the agent --------------------------------------------------------------

  async function useKey(value) {
    key = value || null;
    $("#api-key").value = "";
    await loadAgents();
  }

  async function loadAgents(append = false) {
    const status = $("#key-status");
    try {
      const page = await api("GET", "/v1/agents", { params: { cursor: append ? pages.agents : null, limit: 100 } });
      status.textContent = key ? "key in use (this page only)" : "no key: the server is open, you act as the local operator";
      $("#notice").hidden = true;
      setMore("agents", page.next);
      fillTable($("#agents-table"), [
        ["agent", (a) => a.agent_id], ["configured", (a) => (a.configured ? "yes" : "no")],
        ["users", (a) => a.users], ["sessions", (a) => a.sessions],
      ], page.agents, { append, onRow: (a) => selectAgent(a.agent_id), rowId: (a) => a.agent_id });
      const select = $("#agent");
      if (!append) select.replaceChildren();
      for (const a of page.agents) select.append(h("option", { value: a.agent_id }, a.agent_id));
      if (!append) await selectAgent(page.agents.some((a) => a.agent_id === agent) ? agent
        : page.agents.length ? page.agents[0].agent_id : null);
    } catch (error) {
      status.textContent = key ? "this key was refused" : "no key";
      const notice = $("#notice");
      notice.hidden = false;
      notice.textContent = error instanceof ApiError && error.status === 401
        ? `This server needs an API key: type one above. (${error.detail})` : `Refused: ${error.message}`;
      fillTable($("#agents-table"), [["agent", (a) => a]], []);
    }
  }

  async function selectAgent(agentId) {
    agent = agentId;
    $("#agent").value = agentId || "";
    for (const el of $$("[data-agent-name]")) el.textContent = agentId || "(none)";
    for (const row of $$("#agents-table tbody tr")) row.classList.toggle("selected", row.dataset.id === agentId);
    if (agentId) await Promise.all([loadUsers(), loadSessions()]);
    if (current === "formation") await loadFormation();
    if (current === "events") LOADERS.events();
  }

  async function loadUsers(append = false) {
    await guarded("agents", async () => {
      const page = await api("GET", `/v1/agents/${enc(agent)}/users`, { params: { cursor: append ? pages.users : null } });
      setMore("users", page.next);
      fillTable($("#users-table"), [["user", (u) => u.user_id], ["sessions", (u) => u.sessions]], page.users, {
        append, rowId: (u) => u.user_id,
        onRow: (u) => { go("memories", { user_id: u.user_id }); },
      });
    });
  }

  async function loadSessions(append = false) {
    await guarded("agents", async () => {
      const page = await api("GET", `/v1/agents/${enc(agent)}/sessions`,
        { params: { cursor: append ? pages.sessions : null } });
      setMore("sessions", page.next);
      fillTable($("#sessions-table"), [
        ["session", (s) => s.session_id], ["messages", (s) => s.messages], ["formed", (s) => s.formed_messages],
        ["last activity", (s) => when(s.last_activity)],
      ], page.sessions, { append, rowId: (s) => s.session_id, onRow: (s) => go("memories", { session_id: s.session_id }) });
    });
  }

  const enc = encodeURIComponent;

  // ---- memories -------------------------------------------------------------------------------

  let memoryFilters = {};

  async function loadMemories(append = false) {
    if (!agent) return;
    await guarded("memories", async () => {
      const f = formValues($("#memories-form"));
      if (!append) memoryFilters = f;
      const page = await api("GET", `/v1/agents/${enc(agent)}/memories`, {
        params: {
          ...memoryFilters, kind: memoryFilters.kind || null, tag: memoryFilters.tag || null,
          cursor: append ? pages.memories : null,
        },
      });
      setMore("memories", page.next);
      fillTable($("#memories-table"), [
        ["kind", (m) => m.kind], ["content", (m) => short(m.content)], ["namespace", (m) => m.namespace],
        ["valid at", (m) => when(m.valid_at)], ["expires", (m) => expiresCell(m)], ["accesses", (m) => m.access_count],
        ["state", (m) => memoryState(m)],
      ], page.memories, { append, rowId: (m) => m.id, onRow: (m) => showMemory(m.id) });
    });
    if (!append) await showTtl();
  }

  const expired = (m) => Boolean(m.expires_at && Date.parse(m.expires_at) <= Date.now());

  /** A memory's state as the page says it: corrected (found wrong), deleted, expired or live. */
  function memoryState(m) {
    if (m.corrected_by) return h("span", { class: "badge off" }, "corrected");
    if (m.deleted_at) return h("span", { class: "badge off" }, "deleted");
    if (expired(m)) return h("span", { class: "badge off" }, "expired");
    return "live";
  }

  function expiresCell(m) {
    if (!m.expires_at) return "";
    return expired(m) ? h("span", { class: "badge off", title: m.expires_at }, `expired ${when(m.expires_at)}`)
      : when(m.expires_at);
  }

  /** A time to live in seconds as the settings may write it: 90d, 12h, 30m, 45s. */
  function ttl(seconds) {
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (seconds % size === 0) return `${seconds / size}${unit}`;
    }
    return `${seconds}s`;
  }

  // The agent's times to live (its settings' memory_ttl per kind, each shard's): a key for some
  // users may not read the agent's settings; the line then says so.
  async function showTtl() {
    const line = $("#memory-ttl");
    try {
      const [settings, shards] = await Promise.all([api("GET", `/v1/agents/${enc(agent)}`),
        api("GET", `/v1/agents/${enc(agent)}/shards`)]);
      const kinds = Object.entries(settings.memory_ttl || {}).map(([kind, s]) => `${kind} ${ttl(s)}`);
      const perShard = shards.filter((x) => x.memory_ttl).map((x) => `${x.shard_id} ${ttl(x.memory_ttl)}`);
      line.textContent = "Times to live — per kind: " + (kinds.join(", ") || "none")
        + "; per shard: " + (perShard.join(", ") || "none")
        + ". A memory written with expires_at ends then; expired memories leave search and the block at once.";
    } catch (error) {
      line.textContent = `Times to live: not readable with this key (${error.message}).`;
    }
  }

  async function showMemory(memoryId) {
    const panel = $("#memory-detail");
    await guarded("memories", async () => {
      const detail = await api("GET", `/v1/agents/${enc(agent)}/memories/${enc(memoryId)}/detail`);
      const m = detail.memory;
      for (const row of $$("#memories-table tbody tr")) row.classList.toggle("selected", row.dataset.id === m.id);
      const fields = h("table", { class: "data kv" });
      keyValues(fields, [
        ["id", m.id], ["kind", m.kind], ["namespace", m.namespace], ["title", m.title || ""],
        ["tags", (m.tags || []).join(", ")], ["confidence", m.confidence], ["valid at", when(m.valid_at)],
        ["created at", when(m.created_at)], ["updated at", when(m.updated_at)],
        ["deleted at", when(m.deleted_at)], ["purge at", when(m.purge_at)],
        ["expires at", m.expires_at ? h("span", { id: "memory-expires" }, when(m.expires_at),
          expired(m) ? h("span", { class: "badge off" }, " expired") : "") : "never"],
        ["corrected at", when(m.corrected_at)],
        ["corrected by", m.corrected_by ? memoryLink(m.corrected_by, "memory-corrected-by") : ""],
        ["corrects", m.corrects ? memoryLink(m.corrects, "memory-corrects") : ""],
        ["accesses", m.access_count], ["last accessed", when(m.last_accessed_at)],
        ["session", m.provenance && m.provenance.session_id], ["user", m.provenance && m.provenance.user_id],
        ["messages", m.provenance && (m.provenance.message_ids || []).join(", ")],
      ]);
      const messages = h("table", { class: "data", id: "memory-messages" });
      fillTable(messages, [["role", (x) => x.provenance && x.provenance.role], ["message", (x) => x.content],
        ["at", (x) => when(x.valid_at)]], detail.messages);
      const formed = detail.window;
      const history = h("table", { class: "data", id: "memory-history" });
      fillTable(history, [["at", (e) => when(e.at)], ["action", (e) => e.action],
        ["reason", (e) => (e.after && e.after.reason) || ""], ["key", (e) => e.key_id]], detail.history);
      const actions = h("div", { class: "actions" },
        m.corrected_by ? null : h("button", { type: "button", id: "memory-edit", onclick: () => editMemory(m) }, "Edit"),
        m.corrected_by || m.deleted_at || m.kind === "message" ? null
          : h("button", { type: "button", id: "memory-correct", onclick: () => correctMemory(m) }, "Correct"),
        m.corrected_by ? h("button", { type: "button", id: "memory-uncorrect", onclick: () => changeMemory(m, "uncorrect") },
          "Undo correction") : null,
        m.deleted_at
          ? h("button", { type: "button", id: "memory-undelete", onclick: () => changeMemory(m, "undelete") }, "Undelete")
          : h("button", { type: "button", id: "memory-delete", class: "danger", onclick: () => changeMemory(m, "delete") },
            "Delete"));
      panel.replaceChildren(
        h("h3", {}, "Memory"),
        ...(m.corrected_by ? [h("p", { class: "error", id: "memory-wrong" }, "Found wrong and corrected: kept as history "
          + "only, search and the memory block show its correction.")] : []),
        h("p", { class: "content", id: "memory-content" }, m.content), actions,
        h("p", { class: "error", id: "memory-action-error" }), fields,
        h("h4", {}, "Provenance"),
        formed ? h("p", { id: "memory-window" }, `Formed by window ${formed.window} (extractor ${formed.extractor}) from `
          + `messages ${formed.first_sequence}–${formed.last_sequence} (${formed.messages} messages, ${formed.memories} `
          + `memories made) at ${when(formed.formed_at)}`)
          : h("p", { class: "muted", id: "memory-window" }, "No formation window: written by a tool, a recorded message, "
            + "or formed before windows were kept."),
        messages, h("h4", {}, "History"), history,
        ...(detail.history_complete ? [] : [h("p", { class: "muted" }, "older entries may be missing (AUDIT_SCAN_LIMIT)")]));
      panel.hidden = false;
    });
  }

  async function changeMemory(m, action) {
    const question = action === "delete"
      ? `Delete this memory? Search and the memory block skip it at once; the retention job purges it later. "${short(m.content, 80)}"`
      : action === "uncorrect"
        ? `Undo the correction? This memory is shown again, its correction is deleted. "${short(m.content, 80)}"`
        : `Undelete this memory? "${short(m.content, 80)}"`;
    if (!(await confirmAction(question))) return;
    const box = $("#memory-action-error");
    try {
      const path = `/v1/agents/${enc(agent)}/memories/${enc(m.id)}`;
      if (action === "delete") await api("DELETE", path);
      else await api("POST", `${path}/${action}`);
      await loadMemories();
      await showMemory(m.id);
    } catch (error) {
      box.textContent = `Refused: ${error.message}`;
    }
  }

  /** A memory's id that opens it. */
  function memoryLink(memoryId, id) {
    return h("a", { href: "#memories", id, class: "memory-link", onclick: (event) => {
      event.preventDefault();
      showMemory(memoryId);
    } }, memoryId);
  }

  // A correction: the memory was wrong (never true), not outdated (Edit says that): a new memory
  // replaces it, this one is kept as history (POST .../correct).
  async function correctMemory(m) {
    const content = h("textarea", { name: "content", id: "correct-content", rows: 4, cols: 60 });
    content.value = m.content;
    const ok = await confirmAction("Correct this memory: it was wrong (use Edit for what changed since). The right "
      + "content replaces it; the wrong one is kept as history and its graph facts close as wrong.",
    [h("label", {}, "Right content", content)]);
    if (!ok) return;
    try {
      const done = await api("POST", `/v1/agents/${enc(agent)}/memories/${enc(m.id)}/correct`,
        { body: { content: content.value.trim() } });
      await loadMemories();
      await showMemory(done.correction.id);
    } catch (error) {
      $("#memory-action-error").textContent = `Refused: ${error.message}`;
    }
  }

  async function editMemory(m) {
    const content = h("textarea", { name: "content", id: "edit-content", rows: 4, cols: 60 });
    content.value = m.content;
    const title = h("input", { name: "title", id: "edit-title", value: m.title || "" });
    const tags = h("input", { name: "tags", id: "edit-tags", value: (m.tags || []).join(", ") });
    const ok = await confirmAction("Edit this memory (a new content is re-indexed):", [
      h("label", {}, "Content", content), h("label", {}, "Title", title), h("label", {}, "Tags (comma separated)", tags)]);
    if (!ok) return;
    const body = {};
    if (content.value.trim() !== m.content) body.content = content.value.trim();
    if ((title.value.trim() || null) !== (m.title || null)) body.title = title.value.trim() || null;
    const newTags = tags.value.split(",").map((t) => t.trim()).filter(Boolean);
    if (newTags.join("\u0000") !== (m.tags || []).join("\u0000")) body.tags = newTags;
    if (Object.keys(body).length === 0) return;
    try {
      await api("PATCH", `/v1/agents/${enc(agent)}/memories/${enc(m.id)}`, { body });
      await loadMemories();
      await showMemory(m.id);
    } catch (error) {
      $("#memory-action-error").textContent = `Refused: ${error.message}`;
    }
  }

  // ---- search ---------------------------------------------------------------------------------

  const SIGNALS = ["fulltext", "vector", "graph"];

  async function runSearch() {
    await guarded("search", async () => {
      const f = formValues($("#search-form"));
      const params = { ...f, agent_id: agent, namespaces: f.namespaces ? f.namespaces.split(",").map((n) => n.trim()) : null };
      const result = await api("GET", "/v1/search", { params });
      const rows = [...result.results.map((hit) => ({ hit, activated: true })),
        ...result.candidates.map((hit) => ({ hit, activated: false }))];
      const signals = [...new Set([...SIGNALS.filter((s) => result.signals.includes(s)), ...result.signals])];
      $("#search-summary").textContent = `${result.results.length} activated, ${result.candidates.length} candidates `
        + `below min_score; signals: ${result.signals.join(", ") || "none"}`
        + (result.degraded.length ? `; degraded: ${result.degraded.join("; ")}` : "")
        + `; scope ${result.scope}${result.namespaces === null ? "" : ` (${result.namespaces} namespaces)`}; `
        + `${fmt(result.took_ms, 1)} ms`;
      fillTable($("#search-table"), [
        ["#", (r) => rows.indexOf(r) + 1],
        ["", (r) => h("span", { class: r.activated ? "badge on" : "badge off" }, r.activated ? "activated" : "candidate")],
        ["content", (r) => short(r.hit.content, 120)], ["kind", (r) => r.hit.kind],
        ...signals.flatMap((s) => [
          [`${s} score`, (r) => (r.hit.explanation.signals[s] ? r.hit.explanation.signals[s].score : "")],
          [`${s} rank`, (r) => (r.hit.explanation.signals[s] ? r.hit.explanation.signals[s].rank : "")]]),
        ["fused", (r) => r.hit.explanation.fused], ["recency", (r) => r.hit.explanation.recency],
        ["age (days)", (r) => fmt(r.hit.explanation.age_days, 1)],
        ["structure", (r) => (r.hit.explanation.structure ? r.hit.explanation.structure.factor : "")],
        ["rerank", (r) => (r.hit.explanation.rerank ? r.hit.explanation.rerank.rank : "")],
        ["score", (r) => r.hit.explanation.score],
      ], rows, { rowId: (r) => r.hit.id });
      drawSearchChart(rows);
    });
  }

  function drawSearchChart(rows) {
    if (searchChart) searchChart.destroy();
    const labels = rows.map((r, i) => `${i + 1}. ${short(r.hit.content, 28)}`);
    const colour = (r, on, off) => (r.activated ? on : off);
    searchChart = new window.Chart($("#search-chart"), {
      type: "bar",
      data: {
        labels,
        datasets: [
          { label: "fused", data: rows.map((r) => r.hit.explanation.fused), backgroundColor: "#9bb7d4" },
          { label: "recency", data: rows.map((r) => r.hit.explanation.recency), backgroundColor: "#d8c690" },
          {
            label: "score (green: activated, grey: candidate)", data: rows.map((r) => r.hit.explanation.score),
            backgroundColor: rows.map((r) => colour(r, "#3c8d5a", "#a0a0a0")),
          },
        ],
      },
      options: {
        indexAxis: "y", animation: false, responsive: true, maintainAspectRatio: false,
        scales: { x: { min: 0, max: 1 } }, plugins: { legend: { position: "top" } },
      },
    });
    $("#search-chart").parentElement.style.height = `${Math.max(160, 60 + rows.length * 42)}px`;
  }

  // ---- the memory block -------------------------------------------------------------------------

  async function assemble() {
    await guarded("context", async () => {
      const f = formValues($("#context-form"));
      const block = await api("GET", "/v1/context", { params: { ...f, agent_id: agent } });
      $("#context-xml").textContent = block.xml;
      keyValues($("#context-stats"), [
        ["characters", block.chars], ["budget", block.budget], ["source", block.source],
        ["context type", block.context_type],
        ...Object.entries(block.sections).map(([name, n]) => [`section ${name}`, n]),
      ]);
      const why = {
        below_threshold: "under min_score, or vector-only under min_similarity", duplicate: "its content shown in another item",
        over_budget: "did not fit the budget",
      };
      fillTable($("#context-left-out"), [["why", ([name]) => name], ["how many", ([, n]) => n],
        ["meaning", ([name]) => why[name] || ""]], Object.entries(block.left_out));
      keyValues($("#context-recall"), Object.entries(block.recall || {}).map(([name, v]) => [name, v === null ? "(none)" : v]));
    });
  }

  // ---- formation -------------------------------------------------------------------------------

  let formationCounts = { pending: 0, formed: 0, failed: 0 };

  async function loadFormation(append = false) {
    if (!agent) return;
    await guarded("formation", async () => {
      const page = await api("GET", `/v1/agents/${enc(agent)}/sessions`, {
        params: { cursor: append ? pages.formation : null },
      });
      setMore("formation", page.next);
      if (!append) formationCounts = { pending: 0, formed: 0, failed: 0 };
      const statuses = await Promise.all(page.sessions.map((s) => api("GET", `/v1/sessions/${enc(s.session_id)}`)
        .catch(() => null)));
      const rows = page.sessions.map((s, i) => ({ s, status: statuses[i] }));
      for (const { s, status } of rows) {
        formationCounts.formed += s.formed_windows;
        if (s.pending_window || s.gate.pending_messages > 0) formationCounts.pending += 1;
        if (failed(status)) formationCounts.failed += 1;
      }
      if (!append) await showUsage();
      $("#formation-summary").textContent = `Windows formed: ${formationCounts.formed}; pending: ${formationCounts.pending}; `
        + `failed: ${formationCounts.failed} (sessions listed: ${rows.length}${pages.formation ? ", more below" : ""})`;
      fillTable($("#formation-table"), [
        ["session", (r) => r.s.session_id], ["messages", (r) => r.s.messages], ["cursor", (r) => r.s.cursor],
        ["windows formed", (r) => r.s.formed_windows], ["messages formed", (r) => r.s.formed_messages],
        ["gate", (r) => `${r.s.gate.open ? "open" : "closed"}: ${r.s.gate.reason}`],
        ["pending", (r) => r.s.gate.pending_messages],
        ["window", (r) => windowState(r)],
        ["last activity", (r) => when(r.s.last_activity)],
      ], rows, { append, rowId: (r) => r.s.session_id, onRow: (r) => showFormation(r.s.session_id) });
    });
    await loadOutbox();
  }

  // The agent's LLM usage against its budgets (GET /v1/agents/{id}/usage; a key for some users may not read it).
  async function showUsage() {
    const line = $("#formation-usage");
    const usage = await api("GET", `/v1/agents/${enc(agent)}/usage`).catch(() => null);
    const period = (name, p) => `${name} ${p.period}: ${p.tokens} tokens`
      + (p.limit === null ? " (no budget)" : ` of ${p.limit}${p.tokens >= p.limit ? ", spent" : ""}`)
      + `, ${p.formations} window(s) by the LLM, ${p.offline_formations} offline, ${p.waits} wait(s)`;
    line.textContent = usage ? `LLM usage — ${period("today", usage.day)}; ${period("month", usage.month)}; `
      + `when spent: ${usage.budget.when_spent}` : "";
  }

  function failed(status) {
    const job = status && status.pending_job;
    return Boolean(job && (job.success === false || job.error));
  }

  function windowState({ s, status }) {
    if (failed(status)) return h("span", { class: "badge off" }, `failed: ${status.pending_job.error || "see the job"}`);
    if (status && status.pending_job && status.pending_job.waiting) {
      return h("span", { class: "badge pending" }, `waiting for the LLM budget: ${status.pending_job.waiting}`);
    }
    if (s.pending_window) return h("span", { class: "badge pending" }, `pending: window ${s.pending_window.window} `
      + `(${s.pending_window.state}, ${s.pending_window.messages} messages)`);
    if (s.gate.pending_messages > 0) {
      return h("span", { class: "badge pending" }, `pending: ${s.gate.pending_messages} message(s) waiting for the gate`);
    }
    return s.formed_windows ? h("span", { class: "badge on" }, "formed") : "";
  }

  async function showFormation(sessionId) {
    const panel = $("#formation-session");
    await guarded("formation", async () => {
      const status = await api("GET", `/v1/sessions/${enc(sessionId)}`);
      const job = status.pending_job;
      const last = status.last_window;
      const kv = h("table", { class: "data kv" });
      keyValues(kv, [
        ["session", status.session_id], ["cursor (last formed sequence)", status.cursor],
        ["windows formed", status.formed_windows], ["messages formed", status.formed_messages],
        ["gate", `${status.gate.open ? "open" : "closed"}: ${status.gate.reason} (${status.gate.pending_messages} messages, `
          + `${fmt(status.gate.pending_tokens, 0)} tokens pending)`],
        ["pending window", job ? `window ${job.window}: ${job.state}, job ${job.status}`
          + (job.tries ? `, try ${job.tries}` : "") + (job.error ? `: ${job.error}` : "")
          + (job.waiting ? `; waiting for the LLM budget: ${job.waiting}` : "") : "none"],
      ]);
      const lastBox = last
        ? h("table", { class: "data kv", id: "last-window" })
        : h("p", { class: "muted", id: "last-window" }, "No window formed yet.");
      if (last) {
        keyValues(lastBox, [["window", last.window], ["extractor", last.extractor],
          ["messages", `${last.first_sequence}–${last.last_sequence} (${last.messages})`],
          ["memories made", last.memories], ["formed at", when(new Date(last.formed_at * 1000).toISOString())],
          ["LLM tokens", last.llm_tokens ?? "(not kept)"],
          ...(last.llm_budget ? [["formed offline because", last.llm_budget]] : [])]);
      }
      const made = h("table", { class: "data", id: "formation-memories" });
      const page = await api("GET", `/v1/agents/${enc(agent)}/memories`, { params: { limit: 20 } });
      fillTable(made, [["kind", (m) => m.kind], ["content", (m) => short(m.content)], ["valid at", (m) => when(m.valid_at)]],
        page.memories.filter((m) => m.provenance && m.provenance.session_id === sessionId && m.kind !== "message"));
      panel.replaceChildren(h("h3", {}, `Session ${sessionId}`), kv, h("h4", {}, "Last extraction"), lastBox,
        h("h4", {}, "What it made (the agent's newest memories from this session)"), made);
      panel.hidden = false;
    });
  }

  async function loadOutbox() {
    const box = $("#formation-outbox");
    try {
      const report = await api("GET", "/health", { params: { detail: "true" } });
      const rows = Object.entries(report.backends || {}).map(([name, b]) => ({ name, b }));
      const table = h("table", { class: "data", id: "outbox-table" });
      fillTable(table, [["store", (r) => r.name], ["ok", (r) => (r.b.ok ? "yes" : "no")],
        ["outbox (waiting)", (r) => (r.b.outbox ? JSON.stringify(r.b.outbox) : "no mirror: no outbox")],
        ["dead letters", (r) => (r.b.dead_letters ? JSON.stringify(r.b.dead_letters) : "")],
        ["alarms", (r) => (r.b.alarms || []).join("; ")]], rows);
      box.replaceChildren(h("p", { class: "muted" }, `job queue: ${report.queue && report.queue.ok ? "up" : "down"}`), table);
    } catch (error) {
      box.replaceChildren(h("p", { class: "muted" }, `The outbox is the deployment's: it needs an operator key (${error.message}).`));
    }
  }

  // ---- the knowledge graph ---------------------------------------------------------------------

  async function loadEntities(append = false) {
    if (!agent) return;
    await guarded("graph", async () => {
      const f = formValues($("#graph-form"));
      const page = await api("GET", `/v1/agents/${enc(agent)}/entities`, {
        params: { user_id: f.user_id, namespace: f.namespace, name: f.name, cursor: append ? pages.entities : null },
      });
      setMore("entities", page.next);
      fillTable($("#entities-table"), [["entity", (e) => e.name], ["type", (e) => e.type], ["namespace", (e) => e.namespace],
        ["aliases", (e) => e.aliases.join(", ")]], page.entities,
      { append, rowId: (e) => e.id, onRow: (e) => drawEntity(e.id) });
    });
  }

  // One page of the entity's facts at a time (the API pages them); "More" appends the next.
  let shownEntity = { id: null, superseded: false, names: {} };

  async function moreFacts() {
    if (!shownEntity.id || !pages.facts) return;
    await guarded("graph", async () => {
      const detail = await api("GET", `/v1/agents/${enc(agent)}/entities/${enc(shownEntity.id)}`,
        { params: { include_superseded: shownEntity.superseded ? "true" : null, cursor: pages.facts } });
      setMore("facts", detail.next);
      for (const e of detail.neighbours) shownEntity.names[e.id] = e.name;
      if (graph) {
        graph.add(detail.neighbours.filter((e) => graph.getElementById(e.id).empty()).map((e) => ({
          data: { id: e.id, label: `${e.name}\n(${e.type})`, centre: 0 } })));
        graph.add(detail.facts.filter((f) => !graph.getElementById(f.subject_id).empty()
          && !graph.getElementById(f.object_id).empty()).map((f) => ({
          data: { id: `fact-${f.id}`, source: f.subject_id, target: f.object_id, label: f.predicate },
          classes: f.current ? "current" : "superseded" })));
      }
      fillTable($("#facts-table"), factColumns(shownEntity.names), detail.facts, { append: true, rowId: (f) => f.id });
      showFactCount(detail);
    });
  }

  function factColumns(names) {
    return [
      ["fact", (f) => f.text], ["predicate", (f) => f.predicate],
      ["subject → object", (f) => `${names[f.subject_id] || f.subject_id} → ${names[f.object_id] || f.object_id}`],
      ["valid", (f) => `${when(f.valid_at) || "?"} – ${when(f.invalid_at) || "now"}`],
      ["state", (f) => h("span", { class: f.current ? "badge on" : "badge off" }, f.current ? "current" : "superseded")],
    ];
  }

  function showFactCount(detail) {
    const shown = $$("#facts-table tbody tr[data-id]").length;
    $("#facts-count").textContent = `${shown} of ${detail.facts_total} facts, ${detail.neighbours_total} neighbours`;
  }

  async function drawEntity(entityId) {
    await guarded("graph", async () => {
      const superseded = formValues($("#graph-form")).include_superseded;
      const detail = await api("GET", `/v1/agents/${enc(agent)}/entities/${enc(entityId)}`,
        { params: { include_superseded: superseded ? "true" : null } });
      setMore("facts", detail.next);
      for (const row of $$("#entities-table tbody tr")) row.classList.toggle("selected", row.dataset.id === entityId);
      const nodes = [detail.entity, ...detail.neighbours].map((e) => ({
        data: { id: e.id, label: `${e.name}\n(${e.type})`, centre: e.id === entityId ? 1 : 0 },
      }));
      const known = new Set(nodes.map((n) => n.data.id));
      const edges = detail.facts.filter((f) => known.has(f.subject_id) && known.has(f.object_id)).map((f) => ({
        data: { id: `fact-${f.id}`, source: f.subject_id, target: f.object_id, label: f.predicate },
        classes: f.current ? "current" : "superseded",
      }));
      if (graph) graph.destroy();
      graph = window.cytoscape({
        container: $("#graph-canvas"),
        elements: [...nodes, ...edges],
        layout: { name: "concentric", concentric: (n) => n.data("centre"), levelWidth: () => 1, minNodeSpacing: 60,
          animate: false },
        style: [
          { selector: "node", style: { label: "data(label)", "text-wrap": "wrap", "text-valign": "center",
            "background-color": "#d6e4f0", "border-color": "#4a6d8c", "border-width": 1, width: 90, height: 90,
            "font-size": 11 } },
          { selector: "node[centre = 1]", style: { "background-color": "#f3d9a4", "border-width": 2 } },
          { selector: "edge", style: { label: "data(label)", "curve-style": "bezier", "target-arrow-shape": "triangle",
            "font-size": 10, "text-background-color": "#fff", "text-background-opacity": 1, width: 2 } },
          { selector: "edge.current", style: { "line-color": "#3c8d5a", "target-arrow-color": "#3c8d5a" } },
          { selector: "edge.superseded", style: { "line-color": "#c0392b", "target-arrow-color": "#c0392b",
            "line-style": "dashed", color: "#c0392b" } },
        ],
      });
      const names = Object.fromEntries([detail.entity, ...detail.neighbours].map((e) => [e.id, e.name]));
      shownEntity = { id: entityId, superseded: Boolean(superseded), names };
      fillTable($("#facts-table"), factColumns(names), detail.facts, { rowId: (f) => f.id });
      showFactCount(detail);
      $("#graph-canvas").dataset.entity = entityId;
    });
  }

  // ---- change events ------------------------------------------------------------------------------

  // The stream is read with fetch, not EventSource: EventSource cannot send the Authorization
  // header, and the key never goes in a URL. The page parses the server-sent events itself and
  // resumes after the last id when the server ends a stream (EVENTS_SSE_MAX_SECONDS).
  let following = null; // { agent, controller, last }

  function stopEvents(status = "stopped") {
    if (following) following.controller.abort();
    following = null;
    $("#events-status").textContent = status;
    $("#view-events").dataset.following = "0";
  }

  async function followEvents() {
    if (!agent) return;
    stopEvents("connecting…");
    fillTable($("#events-table"), EVENT_COLUMNS, []);
    const mine = { agent, controller: new AbortController(), last: "0-0" };
    following = mine;
    while (following === mine) {
      try {
        await readEvents(mine);
      } catch (error) {
        if (following !== mine) return;
        if (error instanceof ApiError) {
          showError("events", error);
          stopEvents("refused");
          return;
        }
        $("#events-status").textContent = `reconnecting after: ${error.message}`;
      }
      if (following === mine) await new Promise((resolve) => { setTimeout(resolve, 1000); });
    }
  }

  async function readEvents(mine) {
    const url = new URL(`/v1/agents/${enc(mine.agent)}/events`, window.location.origin);
    url.searchParams.set("after", mine.last);
    const headers = { Accept: "text/event-stream" };
    if (key) headers.Authorization = `Bearer ${key}`;
    const answer = await fetch(url, { headers, credentials: "omit", cache: "no-store", signal: mine.controller.signal });
    if (!answer.ok) {
      const text = await answer.text();
      let detail = text;
      try { detail = JSON.parse(text).detail; } catch { /* not JSON: the text */ }
      throw new ApiError(answer.status, typeof detail === "string" ? detail : JSON.stringify(detail));
    }
    showError("events", null);
    $("#events-status").textContent = `following ${mine.agent}'s events`;
    $("#view-events").dataset.following = "1";
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((line) => line.startsWith("data: ")).map((line) => line.slice(6)).join("\n");
        if (!data) continue;
        const event = JSON.parse(data);
        mine.last = event.id;
        if (following === mine) addEvent(event);
      }
    }
  }

  const EVENT_COLUMNS = [
    ["at", (e) => when(e.at)], ["event", (e) => h("span", { class: `badge event ${e.type}` }, e.type)], ["kind", (e) => e.kind],
    ["namespace", (e) => e.namespace], ["memories", (e) => e.memory_ids.join(", ")],
    ["cause", (e) => [e.key_id && `key ${e.key_id}`, e.session_id && `session ${e.session_id}`,
      e.window !== null && e.window !== undefined && `window ${e.window}`, e.reason && `reason ${e.reason}`]
      .filter(Boolean).join(", ")],
    ["id", (e) => e.id],
  ];

  function addEvent(event) {
    const table = $("#events-table");
    const empty = $("tbody td.muted", table);
    if (empty) empty.parentElement.remove();
    fillTable(table, EVENT_COLUMNS, [event], {
      append: true, rowId: (e) => e.id,
      onRow: (e) => { if (e.kind !== "graph_fact" && e.memory_ids.length) openMemory(e.memory_ids[e.memory_ids.length - 1]); },
    });
    const body = table.tBodies[0];
    body.prepend(body.lastElementChild); // newest first
  }

  async function openMemory(memoryId) {
    go("memories");
    await showMemory(memoryId);
  }

  // ---- the audit log ----------------------------------------------------------------------------

  let auditFilters = {};

  async function loadAudit(append = false) {
    await guarded("audit", async () => {
      const f = formValues($("#audit-form"));
      if (!append) auditFilters = { ...f, agent_id: f.all_agents ? null : agent, all_agents: null };
      const page = await api("GET", "/v1/audit", { params: { ...auditFilters, before: append ? pages.audit : null } });
      setMore("audit", page.next);
      fillTable($("#audit-table"), [
        ["at", (e) => when(e.at)], ["action", (e) => e.action], ["key", (e) => e.key_id], ["agent", (e) => e.agent_id],
        ["target", (e) => e.target], ["before", (e) => (e.before === null ? "" : short(JSON.stringify(e.before), 120))],
        ["after", (e) => (e.after === null ? "" : short(JSON.stringify(e.after), 120))],
      ], page.entries, { append, rowId: (e) => e.id });
    });
  }

  // ---- views ------------------------------------------------------------------------------------

  let current = null;
  const LOADERS = {
    agents: () => (agent ? Promise.all([loadUsers(), loadSessions()]) : null),
    memories: () => loadMemories(), formation: () => loadFormation(), audit: () => loadAudit(),
    graph: () => loadEntities(), search: () => null, context: () => null,
    // Not awaited: the stream runs until stopped (the view is left, another agent picked).
    events: () => { if (!following || following.agent !== agent) followEvents(); return null; },
  };

  /** Show `view`; `filters` pre-fill its form (e.g. a user's memories). */
  function go(view, filters = null) {
    if (filters) {
      const form = $(`#view-${view} form`);
      if (form) {
        form.reset();
        for (const [name, value] of Object.entries(filters)) if (form.elements[name]) form.elements[name].value = value;
      }
    }
    if (window.location.hash !== `#${view}`) {
      window.history.pushState(null, "", `#${view}`);
    }
    show(view);
  }

  async function show(view) {
    if (!LOADERS[view]) view = "agents";
    if (view !== "events" && following) stopEvents(); // a stream open is one of the server's EVENTS_SSE_MAX_STREAMS
    current = view;
    for (const section of $$(".view")) section.hidden = section.id !== `view-${view}`;
    for (const link of $$("#nav a")) link.classList.toggle("active", link.dataset.view === view);
    document.body.dataset.view = view;
    document.body.dataset.busy = "1";
    try {
      await LOADERS[view]();
    } finally {
      document.body.dataset.busy = "0";
    }
  }

  function onSubmit(id, work) {
    $(id).addEventListener("submit", async (event) => {
      event.preventDefault();
      document.body.dataset.busy = "1";
      try { await work(); } finally { document.body.dataset.busy = "0"; }
    });
  }

  document.addEventListener("DOMContentLoaded", async () => {
    $("#key-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      document.body.dataset.busy = "1";
      try { await useKey($("#api-key").value.trim()); await show(current || "agents"); } finally {
        document.body.dataset.busy = "0";
      }
    });
    $("#forget-key").addEventListener("click", async () => { await useKey(null); await show(current || "agents"); });
    $("#agent").addEventListener("change", async (event) => {
      await selectAgent(event.target.value);
      await show(current || "agents");
    });
    for (const link of $$("#nav a")) {
      link.addEventListener("click", (event) => { event.preventDefault(); go(link.dataset.view); });
    }
    window.addEventListener("popstate", () => show(window.location.hash.slice(1)));
    $("#events-follow").addEventListener("click", () => { followEvents(); });
    $("#events-stop").addEventListener("click", () => stopEvents());
    onSubmit("#memories-form", () => loadMemories());
    onSubmit("#search-form", runSearch);
    onSubmit("#context-form", assemble);
    onSubmit("#graph-form", () => loadEntities());
    onSubmit("#audit-form", () => loadAudit());
    const more = { agents: loadAgents, users: loadUsers, sessions: loadSessions, memories: loadMemories,
      formation: loadFormation, entities: loadEntities, facts: moreFacts, audit: loadAudit };
    for (const button of $$("[data-more]")) button.addEventListener("click", () => more[button.dataset.more](true));
    document.body.dataset.busy = "1";
    try {
      await loadAgents();
      await show(window.location.hash.slice(1) || "agents");
    } finally {
      document.body.dataset.busy = "0";
      document.body.dataset.ready = "1";
    }
  });
})();
