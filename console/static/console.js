// Live updates of the partition grid: poll the status API and update the
// cells with textContent (never as HTML).
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
              set(row, "lags", p.lag_seconds.toFixed(1)); set(row, "owner", p.lease_owner || "");
              set(row, "expires", ago(p.lease_expires_at)); set(row, "state", state.length ? state.join(" ") : "ok");
              set(row, "attempts", p.attempts); set(row, "error", p.last_error || "");
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
