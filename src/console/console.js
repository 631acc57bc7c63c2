// The diesel-inbox console's live overview: every five seconds, the tables
// again from the server (same origin, no third-party code).
(function () {
  var live = document.getElementById("live");
  if (!live) return;
  var source = live.getAttribute("data-src");
  var state = document.getElementById("state");
  // The next refresh is 5 s after the last one ended: a slow page is
  // never asked for twice at once.
  function refresh() {
    fetch(source, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        return response.text().then(function (text) {
          if (!response.ok) throw new Error(text);
          return text;
        });
      })
      .then(function (text) {
        live.innerHTML = text;
        state.textContent = "live: updated " + new Date().toLocaleTimeString();
      })
      .catch(function () {
        state.textContent = "the database did not answer; retrying every 5 s";
      })
      .then(function () {
        setTimeout(refresh, 5000);
      });
  }
  setTimeout(refresh, 5000);
})();
