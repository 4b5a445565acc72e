// The registry page, live: server-sent events from /events replace the tables the server rendered.
// Every value goes into the page as text (textContent), never as HTML: tool descriptions are untrusted.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  let offset = 0; // registry clock minus ours, seconds
  let current = null;

  const now = () => Date.now() / 1000 + offset;
  const age = (seconds) => {
    if (seconds < 60) return `${seconds.toFixed(1)} s`;
    if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  };

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text == null || text === "" ? "-" : String(text);
    if (className) td.className = className;
    row.appendChild(td);
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
    body.replaceChildren(...rows);
    const count = $(`${id}-count`);
    if (count) count.textContent = `(${items.length})`;
  }

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
    if (current) $("updated").textContent = `${age(Math.max(0, now() - current.at))} ago`;
  }

  function render(s) {
    current = s;
    $("config-version").textContent = s.config_version == null ? "unknown" : String(s.config_version);
    const banner = $("held");
    banner.hidden = !s.held.length;
    $("held-services").textContent = s.held.join(", ");
    fill("tools", s.tools, 7, "no tools", (tr, t) => {
      cell(tr, t.name, "mono");
      cell(tr, t.service, "mono");
      cell(tr, t.workspace);
      cell(tr, t.source);
      cell(tr, t.status, `status-${t.status}`);
      cell(tr, t.source === "announced" ? t.instances : "-");
      cell(tr, t.description, "description");
    });
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
    fill("rejections", s.rejections, 4, "no rejected announcements", (tr, r) => {
      cell(tr, `${age(Math.max(0, s.at - r.at))} ago`);
      cell(tr, r.service, "mono");
      cell(tr, r.instance, "id");
      cell(tr, r.reason);
    });
    $("rejected-total").textContent = String(s.rejected_total);
    tick();
  }

  function connect() {
    const live = $("live");
    const events = new EventSource("events");
    events.addEventListener("snapshot", (event) => {
      const s = JSON.parse(event.data);
      offset = s.at - Date.now() / 1000;
      render(s);
      $("problem").hidden = true;
      live.textContent = "live";
      live.className = "on";
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

  connect();
  setInterval(tick, 250);
})();
