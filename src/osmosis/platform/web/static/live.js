// Live refresh, the only script: while the page is marked data-refresh (a run still going),
// fetch this same URL and swap in every element marked data-live. Pages work without it.
(function () {
  "use strict";
  function seconds(doc) {
    var marked = doc.querySelector("[data-refresh]");
    return marked ? Math.max(1, parseInt(marked.getAttribute("data-refresh"), 10) || 5) : 0;
  }
  function tick() {
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (old) {
          var replacement = fresh.getElementById(old.id);
          if (replacement) { old.replaceWith(document.importNode(replacement, true)); }
        });
        var wait = seconds(fresh);
        if (!wait) { document.querySelectorAll("[data-refresh]").forEach(function (el) { el.removeAttribute("data-refresh"); }); return; }
        window.setTimeout(tick, wait * 1000);
      })
      .catch(function () { window.setTimeout(tick, 10000); });
  }
  var first = seconds(document);
  if (first) { window.setTimeout(tick, first * 1000); }
})();
