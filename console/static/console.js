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
  function refresh() {
    fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (rep) {
        (rep.topics || []).forEach(function (t) {
          (t.groups || []).forEach(function (g) {
            if (g.group !== grid.dataset.group) return;
            document.getElementById("lag").textContent = g.lag;
            document.getElementById("maxlag").textContent = g.max_lag_seconds.toFixed(1);
            (g.partitions || []).forEach(function (p) {
              var row = document.getElementById("p" + p.partition);
              if (!row) return;
              var state = [];
              if (p.paused) state.push("paused");
              if (p.adaptive_state && p.adaptive_state !== "normal") state.push(p.adaptive_state);
              if (p.backing_off) state.push("backing-off");
              if (p.held_keys && p.held_keys.length) state.push(p.held_keys.length + " keys held");
              if (p.isolation_full_since) state.push("isolation-full");
              set(row, "head", p.head_seq); set(row, "cursor", p.cursor); set(row, "lag", p.lag);
              set(row, "lags", p.lag_seconds.toFixed(1)); set(row, "owner", short(visible(p.lease_owner || ""), 64));
              set(row, "expires", ago(p.lease_expires_at)); set(row, "state", state.length ? state.join(" ") : "ok");
              set(row, "attempts", p.attempts); clip(row, "error", visible(p.last_error || ""), 200);
            });
          });
        });
        document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { document.getElementById("updated").textContent = "update failed, retrying"; })
      .finally(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
