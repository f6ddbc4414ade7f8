// eventbus dashboard: live panel refresh over server-sent events, and confirmations.
// No build step, no dependencies.
(function () {
  "use strict";
  var base = document.body.getAttribute("data-base") || "";

  function busy(panel) {
    // Leave a panel alone while the user is working in it.
    if (panel.contains(document.activeElement) && document.activeElement !== document.body) return true;
    return panel.querySelector("input[type=checkbox]:checked") !== null;
  }

  function refresh() {
    fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (panel) {
          var fresh = doc.getElementById(panel.id);
          if (fresh && !busy(panel)) panel.innerHTML = fresh.innerHTML;
        });
        var stamp = document.getElementById("live-stamp");
        if (stamp) stamp.textContent = "updated " + new Date().toISOString().slice(11, 19);  // UTC, as the page
      })
      .catch(function () {});
  }

  if (window.EventSource && document.querySelector("[data-live]")) {
    var source = new EventSource(base + "/live");
    var dot = document.getElementById("live-dot");
    source.addEventListener("refresh", refresh);
    // A change between this page's render and the stream's first look would
    // otherwise be missed: catch up once each time the stream (re)connects.
    source.onopen = function () { if (dot) dot.className = "live on"; refresh(); };
    source.onerror = function () { if (dot) dot.className = "live off"; };
  }

  document.addEventListener("submit", function (e) {
    var msg = e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) e.preventDefault();
  });

  document.addEventListener("change", function (e) {
    if (e.target.id === "select-all") {
      document.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = e.target.checked; });
    }
  });
})();
