// eventbus dashboard: live panel refresh over server-sent events, local times,
// keyboard navigation of lists, and confirmations. No build step, no dependencies.
(function () {
  "use strict";
  var base = document.body.getAttribute("data-base") || "";

  // -- times: the server writes UTC; show the browser's time zone, UTC on hover ----------

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function local(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
      pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds());
  }

  function localTimes(root) {
    root.querySelectorAll("time[datetime]:not([data-local])").forEach(function (el) {
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) return;
      el.title = el.textContent + " UTC";
      el.textContent = local(date);
      el.setAttribute("data-local", "");
    });
  }

  var zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }
  var zoneLabel = document.getElementById("time-zone");
  if (zoneLabel && !/^(Etc\/)?UTC$/.test(zone)) {
    zoneLabel.textContent = "times in " + (zone || "local time") + " (UTC on hover)";
  }
  localTimes(document);

  // -- live refresh ----------------------------------------------------------------------

  function busy(panel) {
    // Leave a panel alone while the user is working in it (a row picked with the keyboard is no work).
    var active = document.activeElement;
    if (panel.contains(active) && active !== document.body && !(active && active.matches("tr.nav-focus"))) return true;
    return panel.querySelector("input[type=checkbox]:checked") !== null;
  }

  function refresh() {
    fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var at = rows().indexOf(focused());
        document.querySelectorAll("[data-live]").forEach(function (panel) {
          var fresh = doc.getElementById(panel.id);
          if (fresh && !busy(panel)) panel.innerHTML = fresh.innerHTML;
        });
        localTimes(document);
        if (at >= 0 && !focused()) pick(at, false);
        var stamp = document.getElementById("live-stamp");
        if (stamp) stamp.textContent = "updated " + local(new Date()).slice(11);
      })
      .catch(function () {});
  }

  if (window.EventSource && document.querySelector("[data-live]")) {
    var source = new EventSource(base + "/live");
    var dot = document.getElementById("live-dot");
    source.addEventListener("refresh", function () {
      if (dot) { dot.className = "live on"; dot.title = ""; }  // the database answers again
      refresh();
    });
    source.addEventListener("trouble", function (e) {
      if (dot) { dot.className = "live off"; dot.title = "the database did not answer: " + e.data; }
    });
    // A change between this page's render and the stream's first look would
    // otherwise be missed: catch up once each time the stream (re)connects.
    source.onopen = function () { if (dot) { dot.className = "live on"; dot.title = ""; } refresh(); };
    source.onerror = function () { if (dot) dot.className = "live off"; };
  }

  // -- keyboard: j/k (arrows) through list rows, Enter opens, / filters, ? helps --------

  function rows() {
    var found = [];
    document.querySelectorAll("main table:not(.kv) > tbody > tr").forEach(function (tr) {
      if (tr.offsetParent !== null && !tr.querySelector("td[colspan]")) found.push(tr);
    });
    return found;
  }

  function focused() { return document.querySelector("main tr.nav-focus"); }

  function pick(index, scroll) {
    var all = rows();
    if (!all.length) return;
    index = Math.max(0, Math.min(all.length - 1, index));
    var old = focused();
    if (old) old.classList.remove("nav-focus");
    var row = all[index];
    row.classList.add("nav-focus");
    row.setAttribute("tabindex", "-1");
    row.addEventListener("blur", function () { row.classList.remove("nav-focus"); }, { once: true });
    row.focus({ preventScroll: true });
    if (scroll !== false) row.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    var all = rows(), row = focused();
    pick(row ? all.indexOf(row) + step : (step > 0 ? 0 : all.length - 1));
  }

  var help = null;

  function toggleHelp() {
    if (!help) {
      help = document.createElement("div");
      help.id = "kbd-help";
      help.setAttribute("role", "dialog");
      help.setAttribute("aria-label", "Keyboard shortcuts");
      var h = document.createElement("h2");
      h.textContent = "Keyboard";
      var list = document.createElement("dl");
      [["j / ↓", "next row of the list"], ["k / ↑", "previous row"], ["Enter", "open the row's link"],
       ["/", "the filter"], ["?", "this help"], ["Esc", "close it"]].forEach(function (pair) {
        var dt = document.createElement("dt"), dd = document.createElement("dd");
        dt.textContent = pair[0];
        dd.textContent = pair[1];
        list.appendChild(dt);
        list.appendChild(dd);
      });
      var close = document.createElement("button");
      close.type = "button";
      close.className = "plain";
      close.textContent = "Close";
      close.addEventListener("click", function () { help.hidden = true; });
      help.appendChild(h);
      help.appendChild(list);
      help.appendChild(close);
      help.hidden = true;
      document.body.appendChild(help);
    }
    help.hidden = !help.hidden;
  }

  function typing(el) {
    if (!el || el === document.body) return false;
    return el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName);
  }

  document.addEventListener("keydown", function (e) {
    if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    var onRow = document.activeElement === focused() && focused() !== null;
    if (e.key === "Escape") {
      if (help && !help.hidden) { help.hidden = true; e.preventDefault(); }
      return;
    }
    if (e.key === "?") { toggleHelp(); e.preventDefault(); return; }
    if (e.key === "/") {
      var box = document.querySelector("main form.filters input:not([type=hidden]):not([type=checkbox])") ||
        document.querySelector("main form.filters select");
      if (box) { box.focus(); if (box.select) box.select(); e.preventDefault(); }
      return;
    }
    if (e.key === "j" || (e.key === "ArrowDown" && onRow)) { move(1); e.preventDefault(); return; }
    if (e.key === "k" || (e.key === "ArrowUp" && onRow)) { move(-1); e.preventDefault(); return; }
    if (e.key === "Enter" && onRow) {
      var link = focused().querySelector("a[href]");
      if (link) { e.preventDefault(); link.click(); }
    }
  });

  // -- confirmations and selections ------------------------------------------------------

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
