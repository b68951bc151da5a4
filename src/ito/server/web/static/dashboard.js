// Live part of the run dashboard's pages: every few seconds, fetch this page's live fragment
// (same URL, part=live, same-origin cookie) and swap it in when it changed. No library, no
// storage, nothing sent but the page's own URL. Stops on any refusal (signed out: 401).
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = Number(live.getAttribute("data-poll-ms")) || 2000;
  var status = document.getElementById("live-status");
  var last = null;

  function fragmentUrl() {
    var url = new URL(window.location.href);
    url.hash = "";
    url.searchParams.delete("requested");
    url.searchParams.delete("applied");
    url.searchParams.set("part", "live");
    return url.toString();
  }

  function say(text) { if (status) { status.textContent = text; } }

  function tick() {
    fetch(fragmentUrl(), { credentials: "same-origin", cache: "no-store", redirect: "error" })
      .then(function (response) {
        if (!response.ok) { throw new Error(String(response.status)); }
        return response.text();
      })
      .then(function (html) {
        if (html !== last) {
          last = html;
          live.innerHTML = html;
        }
        var at = new Date();
        say("updated " + at.toLocaleTimeString());
        var slow = live.querySelector("[data-terminal='true']") ? 4 : 1;
        window.setTimeout(tick, every * slow);
      })
      .catch(function (error) {
        say("live updates stopped (" + error.message + "); reload the page");
      });
  }
  window.setTimeout(tick, every);
})();
