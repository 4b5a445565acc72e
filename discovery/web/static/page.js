// The registry page, live: server-sent events from /events replace the tables the server rendered.
// Every value goes into the page as text (textContent), never as HTML: tool descriptions and diffs are untrusted.
// The server sends every string with its control and bidi characters already written as \uXXXX escapes
// (discovery/shown.py), so what is drawn here cannot hide, clear or reorder text either.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const TABLES = ["tools", "instances", "conflicts", "pending", "rejections", "replicas"];
  const SHORT = 12; // hex digits of a digest shown; the whole one is the cell's title
  let offset = 0; // registry clock minus ours, seconds
  let current = null;
  // The search this page shows ("" none): the server ranked the tools table for it; redraws keep it and its order.
  const query = $("search").dataset.query || "";
  // The ranker's answer for `query`, best first: [tool key, score]. First the server's, then /search.json's.
  let ranking = [...document.querySelectorAll("#tools tr[data-tool]")].map((tr) => [tr.dataset.tool, Number(tr.dataset.score)]);
  let asked = 0; // searches sent: only the newest answer is drawn

  const now = () => Date.now() / 1000 + offset;
  const age = (seconds) => {
    if (seconds < 60) return `${seconds.toFixed(1)} s`;
    if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  };
  const instanceKey = (i) => `${i.workspace}/${i.service}/${i.id}`;
  const pendingKey = (p) => `${p.workspace}/${p.tool}`;
  const toolKey = (t) => `${t.workspace}/${t.name}`;
  // Calls or errors per second, and p95, as the server renders them (page.py's rate and millis); null: not known, "-".
  const rate = (v) => (v == null ? "" : v === 0 ? "0" : v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0));
  const millis = (v) => (v == null ? "" : `${v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)} ms`);

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text == null || text === "" ? "-" : String(text);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function digestCell(row, digest) {
    const td = cell(row, digest ? String(digest).slice(0, SHORT) : "", "mono digest");
    if (digest) td.title = String(digest);
    return td;
  }

  // A cell that says how long ago `at` was, kept current by tick().
  function agoCell(row, at) {
    const td = cell(row, "");
    td.dataset.at = at;
    td.textContent = `${age(Math.max(0, now() - at))} ago`;
    return td;
  }

  function fill(id, items, columns, empty, build) {
    const body = $(id).tBodies[0];
    const rows = items.map((item) => {
      const tr = document.createElement("tr");
      build(tr, item);
      return tr;
    });
    if (!rows.length) {
      const tr = document.createElement("tr");
      cell(tr, empty, "empty").colSpan = columns;
      rows.push(tr);
    }
    body.replaceChildren(...rows); // counts: applyFilter, after every table is drawn
  }

  // --- the filter: rows of every table that hold the text (any case), the rest hidden ---

  function applyFilter() {
    const query = $("filter").value.trim().toLowerCase();
    for (const id of TABLES) {
      const table = $(id);
      if (!table) continue;
      let shown = 0;
      let total = 0;
      for (const tr of table.tBodies[0].rows) {
        if (tr.querySelector("td.empty")) continue; // "no tools" and the like: always shown
        total += 1;
        const match = !query || tr.textContent.toLowerCase().includes(query);
        tr.hidden = !match;
        if (match) shown += 1;
      }
      const count = $(`${id}-count`);
      if (count) count.textContent = query ? `(${shown} of ${total})` : `(${total})`;
    }
  }

  // --- a tool's traffic: what its services' heartbeats say (unsigned), moved by `heartbeats` events ---

  function usageCells(row, usage) {
    const u = usage || {};
    cell(row, rate(u.calls_per_s), "num calls");
    cell(row, rate(u.errors_per_s), "num errors");
    cell(row, millis(u.p95_ms), "num p95");
  }

  // `known`: tool key -> [calls/s, errors/s, p95 ms]; a tool not in it is not known.
  function updateUsage(known) {
    const byKey = new Map();
    if (current) {
      for (const tool of current.tools) {
        const found = known[toolKey(tool)];
        tool.usage = found ? { calls_per_s: found[0], errors_per_s: found[1], p95_ms: found[2] } : null;
        byKey.set(toolKey(tool), tool.usage);
      }
    }
    for (const tr of document.querySelectorAll("#tools tr[data-tool]")) {
      const u = byKey.get(tr.dataset.tool) || {};
      tr.querySelector("td.calls").textContent = rate(u.calls_per_s) || "-";
      tr.querySelector("td.errors").textContent = rate(u.errors_per_s) || "-";
      tr.querySelector("td.p95").textContent = millis(u.p95_ms) || "-";
    }
  }

  // --- heartbeats and ages ---

  function heartbeat(td, instance) {
    if (instance.last_seen === null) {
      const note = document.createElement("span");
      note.textContent = `not heard from since the registry started (grace of ${instance.ttl} s)`;
      td.replaceChildren(note);
      return;
    }
    const meter = document.createElement("meter");
    meter.min = 0;
    meter.max = instance.ttl;
    meter.low = instance.ttl / 3;
    meter.high = (instance.ttl * 2) / 3;
    meter.optimum = 0;
    meter.dataset.lastSeen = instance.last_seen;
    meter.dataset.instance = instanceKey(instance);
    const label = document.createElement("span");
    td.replaceChildren(meter, label);
    tickOne(meter, label, instance.ttl);
  }

  function tickOne(meter, label, ttl) {
    const seconds = Math.max(0, now() - Number(meter.dataset.lastSeen));
    meter.value = Math.min(seconds, ttl);
    label.textContent = `${age(seconds)} ago of ${ttl} s`;
  }

  function tick() {
    for (const meter of document.querySelectorAll("#instances meter")) {
      tickOne(meter, meter.nextElementSibling, Number(meter.max));
    }
    for (const td of document.querySelectorAll("td[data-at]")) {
      td.textContent = `${age(Math.max(0, now() - Number(td.dataset.at)))} ago`;
    }
    if (current) {
      $("updated").textContent = `${age(Math.max(0, now() - current.at))} ago`;
      if (current.started != null) $("uptime").textContent = age(Math.max(0, now() - current.started));
    }
  }

  // --- the header: which registry, whether it checks signatures ---

  function header(s) {
    const who = s.identity || {};
    $("broker").textContent = who.broker || "unknown";
    $("topicspace").textContent = who.topicspace || "unknown";
    $("host").textContent = who.host || "unknown";
    $("uptime-part").hidden = s.started == null;
    $("trust-line").hidden = s.trust == null && !s.pinning;
    const trust = $("trust");
    trust.hidden = s.trust == null;
    if (s.trust != null && s.trust.policy != null) {
      const path = document.createElement("code");
      path.textContent = s.trust.policy;
      const keys = s.trust.keys;
      const auto = s.trust.auto_approve ? ` (auto-approve: ${s.trust.auto_approve})` : "";
      trust.replaceChildren("trust policy ", path, `: ${keys} key${keys === 1 ? "" : "s"}; only their signed announcements are accepted${auto}`);
      trust.className = "";
    } else if (s.trust != null) {
      trust.textContent = "no trust policy: every valid announcement is accepted, signed or not";
      trust.className = "warn";
    }
    $("pinning-note").hidden = !s.pinning;
    $("footer-pending").hidden = !s.pinning;
    $("footer-replicas").hidden = !(s.replicas && s.replicas.length);
  }

  function toolCells(tr, t) {
    tr.dataset.tool = toolKey(t);
    cell(tr, t.name, "mono");
    cell(tr, t.service, "mono");
    cell(tr, t.workspace);
    cell(tr, t.source);
    cell(tr, t.status, `status-${t.status}`);
    cell(tr, t.detail || "", "why");
    cell(tr, t.source === "announced" ? t.instances : "-");
    usageCells(tr, t.usage);
    digestCell(tr, t.digest);
    cell(tr, t.hints || "", "hints");
    cell(tr, t.title ? `${t.title}: ${t.description}` : t.description, "description");
  }

  // The tools table: every tool; or, for a search, the tools of `ranking` this snapshot holds, in its order.
  function drawTools(s) {
    if (!query) {
      fill("tools", s.tools, 13, "no tools", toolCells);
      return;
    }
    const byKey = new Map(s.tools.map((t) => [toolKey(t), t]));
    const found = ranking.filter(([key]) => byKey.has(key));
    fill("tools", found, 14, `no tool matches “${query}”; try other words`, (tr, [key, score]) => {
      cell(tr, score.toFixed(2), "num score");
      toolCells(tr, byKey.get(key));
      tr.dataset.score = score;
    });
  }

  // Ask the server to rank again (a tool came, went or changed, or its health moved), and draw the answer.
  async function rerank() {
    if (!query) return;
    const mine = ++asked;
    let answer;
    try {
      const response = await fetch(`search.json?q=${encodeURIComponent(query)}`, { cache: "no-store" });
      if (!response.ok) return;
      answer = await response.json();
    } catch {
      return; // the next change asks again
    }
    if (mine !== asked || !Array.isArray(answer.tools)) return;
    ranking = answer.tools.map((t) => [String(t.key), Number(t.score)]);
    if (current) {
      drawTools(current);
      applyFilter();
    }
  }

  function render(s) {
    current = s;
    $("config-version").textContent = s.config_version == null ? "unknown" : String(s.config_version);
    header(s);
    const banner = $("held");
    banner.hidden = !s.held.length;
    $("held-services").textContent = s.held.join(", ");
    drawTools(s);
    fill("instances", s.instances, 6, "no instances hold a lease", (tr, i) => {
      cell(tr, i.service, "mono");
      cell(tr, i.id, "id");
      cell(tr, i.version);
      cell(tr, i.signer || "unsigned");
      cell(tr, i.state, `state-${i.state}`);
      heartbeat(cell(tr, ""), i);
    });
    fill("conflicts", s.conflicts, 5, "no conflicts", (tr, c) => {
      cell(tr, c.tool, "mono");
      cell(tr, c.service, "mono");
      cell(tr, c.held_by, "mono");
      cell(tr, c.workspace);
      cell(tr, c.reason);
    });
    // A diff someone is reading stays open when the table is redrawn.
    const open = new Set([...document.querySelectorAll("#pending tr[data-key] details[open]")].map((d) => d.closest("tr").dataset.key));
    const pending = s.pending || [];
    $("pending-section").hidden = !s.pinning;
    fill("pending", pending, 10, "no definition changes are held", (tr, p) => {
      const key = pendingKey(p);
      tr.dataset.key = key;
      cell(tr, p.tool, "mono");
      cell(tr, p.service, "mono");
      cell(tr, p.workspace);
      digestCell(tr, p.pinned);
      digestCell(tr, p.offered);
      cell(tr, p.pinned_version && p.pinned_version !== p.version ? `${p.pinned_version} → ${p.version}` : p.version);
      cell(tr, p.signer || "unsigned");
      agoCell(tr, p.first_seen);
      agoCell(tr, p.last_seen).dataset.pending = key;
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = "diff";
      const pre = document.createElement("pre");
      pre.className = "diff";
      pre.textContent = p.diff;
      details.replaceChildren(summary, pre);
      details.open = open.has(key);
      cell(tr, "", "diff").replaceChildren(details);
    });
    fill("rejections", s.rejections, 6, "no rejected announcements", (tr, r) => {
      agoCell(tr, r.at);
      cell(tr, r.count);
      agoCell(tr, r.first == null ? r.at : r.first);
      cell(tr, r.service, "mono");
      cell(tr, r.instance, "id");
      cell(tr, r.reason);
    });
    $("rejected-total").textContent = String(s.rejected_total);
    const replicas = s.replicas || [];
    $("replicas-section").hidden = !replicas.length;
    fill("replicas", replicas, 7, "not replicated", (tr, r) => {
      cell(tr, r.id, "id");
      cell(tr, r.group);
      cell(tr, r.role, `role-${r.role}`);
      cell(tr, r.pid);
      cell(tr, r.host, "mono");
      cell(tr, r.version);
      agoCell(tr, r.since);
    });
    $("callers-section").hidden = s.callers == null;
    const unverified = s.callers_unverified || 0;
    $("callers-unverified").hidden = !unverified;
    $("callers-unverified").textContent = ` · ${unverified} unverified record${unverified === 1 ? "" : "s"} ignored`;
    fill("callers", s.callers || [], 7, "no calls heard yet", (tr, c) => {
      cell(tr, c.subject, "mono");
      cell(tr, c.client_id, "mono");
      cell(tr, c.calls);
      cell(tr, c.refused);
      cell(tr, c.failed);
      agoCell(tr, c.last_at);
      cell(tr, c.tools.join(", "), "mono");
    });
    applyFilter();
    tick();
  }

  function connect() {
    const live = $("live");
    const events = new EventSource("events");
    events.addEventListener("snapshot", (event) => {
      const s = JSON.parse(event.data);
      offset = s.at - Date.now() / 1000;
      render(s);
      rerank();
      $("problem").hidden = true;
      live.textContent = "live";
      live.className = "on";
    });
    // A heartbeat is no change to the tables: only last-heard times move (at most once a second),
    // of instances and of the instances offering a held definition, and the tools' traffic.
    events.addEventListener("heartbeats", (event) => {
      const beats = JSON.parse(event.data);
      const held = beats.pending || {};
      updateUsage(beats.usage || {});
      offset = beats.at - Date.now() / 1000;
      if (current) {
        current.at = beats.at;
        for (const instance of current.instances) {
          const key = instanceKey(instance);
          if (key in beats.last_seen) instance.last_seen = beats.last_seen[key];
        }
        for (const change of current.pending || []) {
          const key = pendingKey(change);
          if (key in held) change.last_seen = held[key];
        }
      }
      for (const meter of document.querySelectorAll("#instances meter")) {
        const seen = beats.last_seen[meter.dataset.instance];
        if (seen != null) meter.dataset.lastSeen = seen;
      }
      for (const td of document.querySelectorAll("#pending td[data-pending]")) {
        const seen = held[td.dataset.pending];
        if (seen != null) td.dataset.at = seen;
      }
      applyFilter(); // the traffic cells are row text the filter reads
      tick();
      rerank(); // a tool's errors/s move its score
    });
    events.addEventListener("problem", (event) => {
      const problem = $("problem");
      problem.textContent = event.data;
      problem.hidden = false;
    });
    events.onerror = () => {
      live.textContent = "reconnecting…";
      live.className = "off";
    };
  }

  const filter = $("filter");
  filter.hidden = false; // useless without this script, so the server renders it hidden
  filter.addEventListener("input", applyFilter);
  applyFilter();
  connect();
  setInterval(tick, 250);
})();
