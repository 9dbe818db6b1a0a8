// The console's only script, served from the package (the page's policy allows no other):
// type-ahead search, selecting jobs for bulk actions, and live parts fed by server-sent
// events. Every fragment it puts into the page was rendered and escaped by the replica; it
// never builds HTML from data itself.
(() => {
  "use strict";
  const policy = window.trustedTypes
    ? window.trustedTypes.createPolicy("hrwcron", { createHTML: (text) => text })
    : null;

  function swap(id, text) {
    const template = document.createElement("template");
    template.innerHTML = policy ? policy.createHTML(text) : text;
    const fresh = template.content.getElementById(id);
    const old = document.getElementById(id);
    if (fresh && old) old.replaceWith(fresh);
  }

  async function fetchPart(url, id) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!response.ok) return false;
    swap(id, await response.text());
    return true;
  }

  // At most one fetch of a part every REFRESH_MS, the last change never lost: a replica whose
  // jobs change every second costs an open page one fetch per REFRESH_MS, not one per change.
  const REFRESH_MS = 5000;
  function throttled(action) {
    let last = 0;
    let timer = null;
    return () => {
      const wait = last + REFRESH_MS - Date.now();
      if (wait <= 0) {
        last = Date.now();
        action();
      } else if (!timer) {
        timer = setTimeout(() => {
          timer = null;
          last = Date.now();
          action();
        }, wait);
      }
    };
  }

  function withPart(url, part) {
    return url + (url.includes("?") ? "&" : "?") + "part=" + part;
  }

  // --- the job list: search as one types -------------------------------------------------
  const search = document.getElementById("search");
  let asked = 0;
  function listUrl() {
    const params = new URLSearchParams(new FormData(search));
    for (const [key, value] of [...params]) if (!value) params.delete(key);
    const query = params.toString();
    return "/jobs" + (query ? "?" + query : "");
  }
  async function refreshList(push) {
    const url = listUrl();
    const mine = ++asked;
    if (push) history.replaceState(null, "", url);
    const response = await fetch(withPart(url, "results"), { credentials: "same-origin" });
    if (response.ok && mine === asked) swap("results", await response.text());
  }
  if (search) {
    let timer = null;
    const soon = () => {
      clearTimeout(timer);
      timer = setTimeout(() => refreshList(true), 120);
    };
    search.addEventListener("input", soon);
    search.addEventListener("change", soon);
    search.addEventListener("submit", (event) => {
      event.preventDefault();
      refreshList(true);
    });
  }

  document.addEventListener("change", (event) => {
    if (event.target.id !== "select-all") return;
    for (const box of document.querySelectorAll('#jobs input[type="checkbox"][name="name"]')) {
      box.checked = event.target.checked;
    }
  });
  document.addEventListener("submit", (event) => {
    const text = event.target.dataset && event.target.dataset.confirm;
    if (text && !window.confirm(text)) event.preventDefault();
  });

  // --- live parts ----------------------------------------------------------------------------
  const live = document.body.dataset.live || "";
  const state = document.getElementById("live-state");
  if (!live || !window.EventSource) return;
  const job = live.startsWith("job:") ? live.slice(4) : "";
  const events = new EventSource("/events" + (job ? "?job=" + encodeURIComponent(job) : ""));
  let previous = null;
  const fleet = throttled(() => fetchPart("/?part=fleet", "fleet"));
  const list = throttled(() => {
    // A person choosing jobs for a bulk action keeps the rows they are choosing from.
    if (!document.querySelector('#results input[type="checkbox"]:checked')) refreshList(false);
  });
  const page = throttled(() =>
    fetchPart(withPart(location.pathname + location.search, "live"), "live"));
  events.onopen = () => { if (state) state.textContent = "live"; };
  events.onerror = () => { if (state) state.textContent = "reconnecting…"; };
  events.onmessage = (message) => {
    const pulse = JSON.parse(message.data);
    const before = previous;
    previous = pulse;
    if (!before) return;
    const slow = pulse.slot !== before.slot && pulse.slot % 3 === 0;
    if (live === "fleet" && pulse.fleet !== before.fleet) fleet();
    else if (live === "jobs" && (pulse.jobs !== before.jobs || slow)) list();
    else if (job && (pulse.job !== before.job || pulse.jobs !== before.jobs || slow)) page();
  };
})();
