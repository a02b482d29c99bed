// Live updates of the partition grid: poll the status API and update the
// cells with textContent (never as HTML). Long values are cut as the
// server cuts them (templates "clip" and "name").
(function () {
  var grid = document.getElementById("grid");
  if (!grid) return;
  var base = document.body.dataset.base || "";
  var every = parseInt(document.body.dataset.refresh, 10) || 1000;
  var url = base + "/api/status?group=" + encodeURIComponent(grid.dataset.group) + "&topic=" + encodeURIComponent(grid.dataset.topic);
  function set(row, field, value) {
    var cell = row.querySelector('[data-f="' + field + '"]');
    if (cell && cell.textContent !== String(value)) cell.textContent = value;
  }
  // visible writes the characters a page would not show as themselves
  // (controls, bidirectional overrides, zero-width characters) as escapes,
  // as the server does.
  function visible(value) {
    return value.replace(/[\p{Cc}\p{Cf}\u2028\u2029]/gu, function (c) {
      var n = c.codePointAt(0);
      if (c === "\n" || c === "\t") return c;
      if (c === "\r") return "\\r";
      if (n < 0x80) return "\\x" + n.toString(16).padStart(2, "0");
      if (n <= 0xffff) return "\\u" + n.toString(16).padStart(4, "0");
      return "\\U" + n.toString(16).padStart(8, "0");
    });
  }
  function short(value, n) {
    var chars = Array.from(value);
    return chars.length > n ? chars.slice(0, n).join("") + "\u2026" : value;
  }
  // clip shows value's first n characters and the whole behind "show all".
  function clip(row, field, value, n) {
    var cell = row.querySelector('[data-f="' + field + '"]');
    if (!cell) return;
    var full = cell.querySelector(".full");
    if ((full ? full.textContent : cell.textContent) === value) return;
    var chars = Array.from(value);
    if (chars.length <= n) { cell.textContent = value; return; }
    cell.textContent = "";
    var head = document.createElement("span");
    head.className = "short";
    head.textContent = chars.slice(0, n).join("") + "\u2026";
    var more = document.createElement("details");
    more.className = "more";
    var summary = document.createElement("summary");
    summary.textContent = "show all " + chars.length.toLocaleString("en-US") + " characters";
    var whole = document.createElement("div");
    whole.className = "full";
    whole.textContent = value;
    more.appendChild(summary);
    more.appendChild(whole);
    cell.appendChild(head);
    cell.appendChild(more);
  }
  function ago(t) {
    if (!t) return "-";
    var d = Math.round((new Date(t) - Date.now()) / 1000);
    return d < 0 ? (-d) + "s ago" : "in " + d + "s";
  }
  // stateOf is grid.go's stateOf (the class colours a partition's tile and
  // row, the label lists every condition): change both together.
  function stateOf(p) {
    var labels = [], cls = "";
    function flag(c, label) { if (!cls) cls = c; labels.push(label); }
    if (p.paused) flag("paused", "paused"); else if (!p.leased) flag("no-lease", "no lease");
    if (p.backing_off) flag("backing-off", "backing-off"); else if (p.attempts > 0) flag("failing", "failing (" + p.attempts + " attempts)");
    if (p.unanswered > 0) flag("failing", "unanswered delivery");
    if (p.held_keys && p.held_keys.length) flag("held", p.held_keys.length + " keys held");
    if (p.isolation_full_since) flag("held", "isolation-full");
    if (p.adaptive_state === "degraded") flag("degraded", "degraded");
    else if (p.adaptive_state !== "normal") flag("unknown", "batching state " + JSON.stringify(String(p.adaptive_state)) + " unknown to this console");
    return cls ? { cls: cls, label: labels.join(", ") } : { cls: "ok", label: "ok" };
  }
  // paint colours a partition's row and tile and counts it in the legend.
  function paint(p, row, counts) {
    var s = stateOf(p);
    counts[s.cls] = (counts[s.cls] || 0) + 1;
    if (row.className !== "s-" + s.cls) row.className = "s-" + s.cls;
    set(row, "state", s.label);
    var tile = document.getElementById("t" + p.partition);
    if (!tile) return;
    if (tile.className !== "tile s-" + s.cls) tile.className = "tile s-" + s.cls;
    tile.setAttribute("title", "partition " + p.partition + ": " + s.label);
  }
  function legend(counts) {
    document.querySelectorAll("#legend li").forEach(function (li) {
      var n = counts[li.dataset.s] || 0;
      li.querySelector("b").textContent = n;
      li.className = "s-" + li.dataset.s + (n ? "" : " none");
    });
  }
  function refresh() {
    fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (rep) {
        (rep.topics || []).forEach(function (t) {
          (t.groups || []).forEach(function (g) {
            if (g.group !== grid.dataset.group) return;
            document.getElementById("lag").textContent = g.lag;
            document.getElementById("maxlag").textContent = g.max_lag_seconds.toFixed(1);
            document.getElementById("members").textContent = (g.members || []).length;
            var counts = {};
            (g.partitions || []).forEach(function (p) {
              var row = document.getElementById("p" + p.partition);
              if (!row) return;
              paint(p, row, counts);
              set(row, "head", p.head_seq); set(row, "cursor", p.cursor); set(row, "lag", p.lag);
              set(row, "lags", p.lag_seconds.toFixed(1)); set(row, "owner", short(visible(p.lease_owner || ""), 64));
              set(row, "expires", ago(p.lease_expires_at));
              set(row, "attempts", p.attempts); clip(row, "error", visible(p.last_error || ""), 200);
            });
            legend(counts);
          });
        });
        document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { document.getElementById("updated").textContent = "update failed, retrying"; })
      .finally(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();

// Live charts (templates/charts.html): poll the history API and move each
// chart's line and labels, as attributes and text (never as markup). The
// server draws the line (charts.go); this only puts it in place.
(function () {
  var box = document.getElementById("charts"), grid = document.getElementById("grid");
  if (!box || !grid) return;
  var base = document.body.dataset.base || "";
  var every = parseInt(box.dataset.every, 10) || 1000;
  var url = base + "/api/history?group=" + encodeURIComponent(grid.dataset.group) + "&topic=" + encodeURIComponent(grid.dataset.topic);
  function draw(reply) {
    (reply.charts || []).forEach(function (c) {
      var fig = document.getElementById("chart-" + c.id);
      if (!fig) return;
      var path = fig.querySelector("path.line");
      if (path.getAttribute("d") !== c.d) path.setAttribute("d", c.d);
      path.setAttribute("data-points", c.points);
      fig.querySelector('[data-c="max"]').textContent = c.max;
      fig.querySelector('[data-c="now"]').textContent = c.now;
    });
  }
  function poll() {
    fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (reply) { if (reply) draw(reply); })
      .catch(function () {})
      .finally(function () { setTimeout(poll, every); });
  }
  setTimeout(poll, every);
})();
