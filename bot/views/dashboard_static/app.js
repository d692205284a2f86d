// The dashboard page: reads /api/stream (server-sent events), or polls /api/state every 5 s when
// the stream cannot be had, and draws what it gets. Read-only; nothing is loaded from elsewhere.
// Every text from the store (titles come from the agent) is set with textContent, never as HTML.
(function () {
  "use strict";

  var POLL_MS = 5000;
  var RETRY_STREAM_MS = 60000;
  var FALLBACK_MS = 8000; // a stream that has not reconnected by then: poll meanwhile
  var ROWS = 100; // experiments shown before "show all"
  var SVG = "http://www.w3.org/2000/svg";

  var token = new URLSearchParams(window.location.search).get("token");
  var query = token ? "?token=" + encodeURIComponent(token) : "";
  var state = null;
  var receivedAt = 0;
  var source = null;
  var pollTimer = null;
  var fallback = null;
  var showAll = false;
  var metric = { name: "val_bpb", direction: "lower", places: 6, scale: "linear" }; // the task's, from the state

  function better(delta) { return metric.direction === "lower" ? delta < 0 : delta > 0; }

  function $(id) { return document.getElementById(id); }

  function make(tag, className, text, parent) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (parent) parent.appendChild(node);
    return node;
  }

  function svg(tag, attrs, parent) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(node);
    return node;
  }

  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function fixed(v, digits) { return isNum(v) ? v.toFixed(digits === undefined ? metric.places : digits) : "–"; }
  function signed(v, digits) {
    if (!isNum(v)) return "–";
    var text = Math.abs(v).toFixed(digits === undefined ? metric.places : digits);
    return (v > 0 ? "+" : v < 0 ? "−" : "±") + text;
  }
  // A delta as the state carries it (a change in the metric's units, or on a log scale a fraction)
  // and a margin (a magnitude on the judge's loss scale: the log of a ratio on a log scale).
  function change(v) { return metric.scale === "log" && isNum(v) ? signed(100 * v, 1) + "%" : signed(v); }
  function margin(v) { return metric.scale === "log" && isNum(v) ? fixed(100 * Math.expm1(v), 1) + "%" : fixed(v); }
  function money(v) { return isNum(v) ? "$" + v.toFixed(v < 10 ? 2 : 0) : "–"; }
  function duration(s) {
    if (!isNum(s)) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60 < 10 ? "0" : "") + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }
  function clock(at) {
    var d = new Date(at * 1000);
    return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }
  function safeUrl(url) { return /^https?:\/\//i.test(String(url)) ? String(url) : null; }

  // --- the connection --------------------------------------------------------------------------
  function setLink(mode, text) {
    var link = $("link");
    link.dataset.state = mode;
    link.textContent = text;
  }

  function showProblem(message) {
    var box = $("problem");
    box.hidden = !message;
    box.textContent = message || "";
  }

  function poll() {
    fetch("api/state" + query, { cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        return response.json().then(function (body) { return { ok: response.ok, status: response.status, body: body }; });
      })
      .then(function (answer) {
        if (!answer.ok) {
          showProblem(answer.body && answer.body.error ? answer.body.error : "the server answered " + answer.status);
          return;
        }
        if (pollTimer) setLink("polling", "polling every 5 s");
        render(answer.body);
      })
      .catch(function () {
        setLink("offline", "offline, retrying");
      });
  }

  function startPolling() {
    fallback = null;
    if (pollTimer) return;
    setLink("polling", "polling every 5 s");
    poll();
    pollTimer = window.setInterval(poll, POLL_MS);
  }

  function stopPolling() {
    if (pollTimer) window.clearInterval(pollTimer);
    pollTimer = null;
  }

  function connect() {
    if (!window.EventSource) { startPolling(); return; }
    source = new EventSource("api/stream" + query);
    source.onopen = function () {
      window.clearTimeout(fallback);
      fallback = null;
      stopPolling();
      setLink("live", "live");
    };
    source.addEventListener("state", function (event) {
      stopPolling();
      setLink("live", "live");
      render(JSON.parse(event.data));
    });
    source.addEventListener("progress", function (event) {
      var data = JSON.parse(event.data);
      if (!state) return;
      state.slots = data.slots;
      receivedAt = Date.now();
      renderSlots(state);
      renderUpdated();
    });
    source.addEventListener("problem", function (event) {
      showProblem(JSON.parse(event.data).error);
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        // refused (a 401) or not a stream (a proxy in the way): poll, try the stream again later
        source = null;
        startPolling();
        window.setTimeout(connect, RETRY_STREAM_MS);
      } else if (!fallback && !pollTimer) {
        // the browser reconnects by itself (the server ends each stream after a minute); poll only
        // if that takes long
        setLink("connecting", "reconnecting…");
        fallback = window.setTimeout(startPolling, FALLBACK_MS);
      }
    };
  }

  // --- drawing ---------------------------------------------------------------------------------
  function render(next) {
    state = next;
    receivedAt = Date.now();
    showProblem(null);
    renderMetric(state.metric);
    renderSummary(state);
    renderSlots(state);
    renderChart(state.chart);
    renderExperiments(state.experiments);
    renderEvents(state.events);
    renderUpdated();
  }

  function renderUpdated() {
    if (!receivedAt) return;
    var ago = Math.round((Date.now() - receivedAt) / 1000);
    $("updated").textContent = "updated " + (ago < 2 ? "just now" : duration(ago) + " ago");
  }

  function renderMetric(m) {
    if (m) metric = m;
    Array.prototype.forEach.call(document.querySelectorAll(".metric-name"), function (node) {
      node.textContent = metric.name;
    });
    $("direction").textContent = "(" + metric.direction + " is better)";
  }

  function renderSummary(s) {
    var main = s.main || {};
    $("main-value").textContent = fixed(main.val_bpb);
    var parts = [];
    if (isNum(main.baseline_val_bpb) && isNum(main.val_bpb)) {
      var change = main.val_bpb - main.baseline_val_bpb;
      parts.push("baseline " + fixed(main.baseline_val_bpb) + " (" + signed(change) + ", " +
                 signed(100 * change / main.baseline_val_bpb, 2) + "%)");
    }
    if (main.source && main.source !== "baseline runs") parts.push(main.source);
    else if (main.runs) parts.push("mean of " + main.runs + " run" + (main.runs === 1 ? "" : "s") +
                                  (main.commit ? " of " + main.commit : ""));
    if (isNum(main.margin)) parts.push("noise margin " + margin(main.margin));
    $("main-detail").textContent = parts.join(" · ");

    var agent = s.agent || {};
    var chip = $("agent-state");
    chip.textContent = agent.state || "–";
    chip.dataset.state = agent.state || "";
    $("agent-detail").textContent = agent.detail || "";

    var c = s.counts || {};
    var done = (c.keep || 0) + (c.discard || 0) + (c.crash || 0) + (c.rejected || 0) + (c.failed || 0)
      + (c.cancelled || 0);
    $("counts").textContent = done + " done";
    var simpler = c.kept_for_simplicity ? " (" + c.kept_for_simplicity + " for simplicity)" : "";
    var kept = (c.keep || 0) + " kept" + simpler;
    var detail = [kept, (c.discard || 0) + " discarded", (c.crash || 0) + " crashed"];
    if (c.rejected) detail.push(c.rejected + " rejected");
    if (c.failed) detail.push(c.failed + " failed");
    if (c.cancelled) detail.push(c.cancelled + " cancelled");
    if (c.active) detail.push(c.active + " in progress");
    $("counts-detail").textContent = detail.join(" · ");

    $("spent").textContent = money(s.spent_usd);
    $("spent-detail").textContent = isNum(agent.budget_usd)
      ? money(agent.budget_left_usd) + " left of " + money(agent.budget_usd) : "no budget set";

    var w = s.write_budget || {};
    var windows = w.windows || [];
    $("writes").textContent = windows.length
      ? windows[windows.length - 1].writes + " / " + windows[windows.length - 1].limit + " an hour" : "–";
    var wdetail = windows.slice(0, -1).map(function (x) { return x.writes + " / " + x.limit + " a minute"; });
    if (w.mode) {
      wdetail.push(w.mode + (isNum(w.since) ? " since " + new Date(w.since * 1000).toLocaleTimeString() : ""));
      if (w.why) wdetail.push(w.why);
    }
    $("writes-detail").textContent = wdetail.join(" · ");
  }

  function renderSlots(s) {
    var box = $("slots");
    box.textContent = "";
    $("queued").textContent = s.queued ? "(" + s.queued + " queued)" : "";
    if (!s.slots || !s.slots.length) {
      make("p", "empty", "nothing running" + (s.queued ? ", " + s.queued + " queued" : ""), box);
      return;
    }
    s.slots.forEach(function (slot) {
      var card = make("article", "slot", null, box);
      card.dataset.run = slot.run;
      var head = make("p", "slot-title", null, card);
      make("span", "slot-name", (slot.experiment ? "#" + slot.experiment + " " : "") + slot.title, head);
      make("span", "slot-purpose", slot.purpose + " · run " + slot.run, head);
      var bar = make("progress", "slot-bar", null, card);
      bar.max = 1;
      if (isNum(slot.progress)) bar.value = slot.progress;
      var facts = [];
      if (isNum(slot.progress)) facts.push(Math.round(100 * slot.progress) + "%");
      facts.push(slot.step === null || slot.step === undefined ? "starting" : "step " + slot.step);
      if (isNum(slot.loss)) facts.push("loss " + slot.loss.toFixed(3));
      if (isNum(slot.remaining_seconds)) facts.push(duration(slot.remaining_seconds) + " left");
      make("p", "slot-facts", facts.join(" · "), card);
    });
  }

  function niceStep(raw) {
    var power = Math.pow(10, Math.floor(Math.log10(raw)));
    var unit = raw / power;
    return (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10) * power;
  }

  function renderChart(chart) {
    var box = $("chart");
    box.textContent = "";
    var width = Math.max(280, Math.floor(box.clientWidth || 600));
    var height = width < 520 ? 220 : 280;
    var pad = { left: 62, right: 14, top: 14, bottom: 30 };
    var root = svg("svg", { viewBox: "0 0 " + width + " " + height, width: width, height: height, role: "img",
                            "aria-label": metric.name + " of the baseline and each finished experiment" }, box);
    var points = (chart && chart.points) || [];
    var crashes = (chart && chart.crashes) || [];
    var best = (chart && chart.best) || [];
    if (!points.length) {
      var note = svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", "class": "note" }, root);
      note.textContent = "no finished measurement yet";
      return;
    }
    var values = points.map(function (p) { return p.val_bpb; }).concat(best.map(function (b) { return b[1]; }));
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    if (hi - lo < 1e-9) { lo -= 0.005; hi += 0.005; }
    var span = hi - lo;
    lo -= span * 0.08; hi += span * 0.08;
    var xMax = Math.max(1, chart.x_max || 0);
    var plotW = width - pad.left - pad.right, plotH = height - pad.top - pad.bottom;
    function sx(x) { return pad.left + (x / xMax) * plotW; }
    function sy(y) { return pad.top + ((hi - y) / (hi - lo)) * plotH; }

    var digits = Math.min(6, Math.max(2, Math.ceil(-Math.log10((hi - lo) / 4)) + 1));
    var axes = svg("g", { "class": "axes" }, root);
    for (var i = 0; i <= 4; i++) {
      var v = lo + ((hi - lo) * i) / 4;
      svg("line", { x1: pad.left, x2: width - pad.right, y1: sy(v), y2: sy(v), "class": "grid" }, axes);
      var label = svg("text", { x: pad.left - 6, y: sy(v) + 4, "text-anchor": "end" }, axes);
      label.textContent = v.toFixed(digits);
    }
    var step = Math.max(1, niceStep(xMax / (width < 520 ? 4 : 8)));
    for (var x = 0; x <= xMax; x += step) {
      var tick = svg("text", { x: sx(x), y: height - 10, "text-anchor": "middle" }, axes);
      tick.textContent = String(x);
    }
    svg("line", { x1: pad.left, x2: width - pad.right, y1: pad.top + plotH, y2: pad.top + plotH, "class": "axis" },
        axes);

    if (best.length) {
      svg("polyline", { points: best.map(function (b) { return sx(b[0]) + "," + sy(b[1]); }).join(" "),
                        "class": "best" }, root);
    }
    var marks = svg("g", { "class": "crashes" }, root);
    crashes.forEach(function (c) {
      var cx = sx(c.x), cy = pad.top + plotH - 6;
      var mark = svg("path", { d: "M" + (cx - 4) + " " + (cy - 4) + "l8 8m0 -8l-8 8", "class": "crash" }, marks);
      var tip = svg("title", {}, mark);
      tip.textContent = "#" + c.id + " " + c.title + ": " + c.status;
    });
    var dots = svg("g", { "class": "points" }, root);
    points.forEach(function (p) {
      var cx = sx(p.x), cy = sy(p.val_bpb);
      var dot = p.for_simplicity  // a keep for simplicity: a square
        ? svg("rect", { x: cx - 4.5, y: cy - 4.5, width: 9, height: 9, "class": "point keep simplicity" }, dots)
        : svg("circle", { cx: cx, cy: cy, r: p.kept ? 5 : 4, "class": "point " + p.status }, dots);
      var tip = svg("title", {}, dot);
      tip.textContent = (p.id ? "#" + p.id + " " : "") + p.title + ": " + fixed(p.val_bpb) + " ("
        + (p.for_simplicity ? "kept for simplicity" : p.status) + ")";
    });
    $("key-simplicity").hidden = !points.some(function (p) { return p.for_simplicity; });
  }

  function resultOf(e) { return e.state === "done" ? (e.status || "done") : e.state; }

  function renderExperiments(rows) {
    var body = $("experiments").querySelector("tbody");
    body.textContent = "";
    var priced = rows.some(function (e) { return isNum(e.cost_usd); });
    $("experiments").classList.toggle("priced", priced);
    var newest = rows.slice().reverse();
    var shown = showAll ? newest : newest.slice(0, ROWS);
    $("shown").textContent = rows.length > shown.length ? "(newest " + shown.length + " of " + rows.length + ")"
      : "(" + rows.length + ")";
    var more = $("more");
    more.hidden = rows.length <= shown.length;
    more.textContent = "show all " + rows.length;
    shown.forEach(function (e) {
      var tr = make("tr", "row " + resultOf(e), null, body);
      tr.dataset.id = e.id;
      make("td", "num", e.id, tr);
      var result = make("td", null, null, tr);
      var word = resultOf(e) + (e.kept_for_simplicity ? " (simplicity)" : "");
      var pill = make("span", "pill " + resultOf(e), word + (e.in_flight ? " …" : ""), result);
      if (e.kept_for_simplicity) pill.title = e.kept_for_simplicity;
      make("td", "num", fixed(e.val_bpb), tr);
      make("td", "num " + (isNum(e.delta) ? (better(e.delta) ? "better" : "worse") : ""), change(e.delta), tr);
      make("td", "num wide", margin(e.margin), tr);
      make("td", "num runs", e.runs, tr);
      make("td", "num wide cost", isNum(e.cost_usd) ? "$" + e.cost_usd.toFixed(3) : "–", tr);
      var title = make("td", "title", null, tr);
      make("span", "name", e.title || "(untitled)", title);
      if (e.reason) make("span", "reason", e.reason, title);
      var names = Object.keys(e.links || {});
      if (names.length) {
        var links = make("span", "links", null, title);
        names.forEach(function (name) {
          var url = safeUrl(e.links[name]);
          if (!url) return;
          var a = make("a", null, name, links);
          a.href = url;
          a.rel = "noopener noreferrer";
          a.target = "_blank";
        });
      }
    });
  }

  function renderEvents(events) {
    var list = $("events");
    list.textContent = "";
    if (!events || !events.length) { make("li", "empty", "no events yet", list); return; }
    events.forEach(function (e) {
      var li = make("li", null, null, list);
      make("time", "at", clock(e.at), li);
      make("span", "kind", (e.experiment ? "#" + e.experiment + " " : "") + e.kind, li);
      make("span", "message", e.message, li);
    });
  }

  // --- start -----------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", function () {
    $("more").addEventListener("click", function () {
      showAll = true;
      if (state) renderExperiments(state.experiments);
    });
    var resizing = null;
    window.addEventListener("resize", function () {
      window.clearTimeout(resizing);
      resizing = window.setTimeout(function () { if (state) renderChart(state.chart); }, 150);
    });
    window.setInterval(renderUpdated, 1000);
    connect();
  });
})();
