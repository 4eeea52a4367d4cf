// The Studio's live pages. The websockets carry hints ("run X changed", "records Y changed");
// the page then asks the server for the fragments that show them again (htmx, `studio-refresh`
// on the elements whose `data-live` names the topic). A lost hint costs a refresh, never a wrong
// page: every fragment is the server's current answer. Log lines come straight from the log
// websocket. TTL countdowns tick here, between refreshes.
(function () {
  "use strict";

  const scheme = location.protocol === "https:" ? "wss" : "ws";

  // Hints come in bursts (a deletion changes many records): each live element asks again at
  // most every REFRESH_MS, and always after the last hint of a burst (the request starts after it).
  const REFRESH_MS = 250;

  function refresh(topic) {
    document.querySelectorAll("[data-live]").forEach((el) => {
      if (!el.dataset.live.split(" ").includes(topic) || !window.htmx || el.studioPending) return;
      el.studioPending = setTimeout(() => {
        el.studioPending = null;
        window.htmx.trigger(el, "studio-refresh");
      }, REFRESH_MS);
    });
  }

  // A websocket that comes back after the server restarts (with a growing pause). ``onOpen``
  // runs each time it (re)connects: what changed before it was listening had no hint.
  function follow(path, onMessage, onOpen) {
    let pause = 500;
    let socket = null;
    let stopped = false;
    function open() {
      socket = new WebSocket(`${scheme}://${location.host}${path}`);
      socket.onopen = () => {
        pause = 500;
        if (onOpen) onOpen();
      };
      socket.onmessage = (event) => onMessage(JSON.parse(event.data));
      socket.onclose = (event) => {
        if (stopped || event.code === 4401 || event.code === 4404 || event.code === 4400) return;
        setTimeout(open, pause);
        pause = Math.min(pause * 2, 10000);
      };
    }
    open();
    return { close() { stopped = true; if (socket) socket.close(); } };
  }

  function liveTopics() {
    const topics = new Set();
    document.querySelectorAll("[data-live]").forEach((el) => el.dataset.live.split(" ").forEach((t) => topics.add(t)));
    return topics;
  }

  function startHints() {
    const topics = liveTopics();
    const page = document.querySelector("[data-run]#content-main");
    const hinted = (topic) => () => refresh(topic);
    if (topics.has("run") && page) {
      follow(`/ws/runs/${page.dataset.run}/`, hinted("run"), hinted("run"));
    }
    if (topics.has("runs")) {
      follow("/ws/runs/", hinted("runs"), hinted("runs"));
    }
    if (topics.has("records")) {
      follow("/ws/records/", hinted("records"), hinted("records"));
    }
  }

  // --- a record's log, followed live (ws/records/<id>/logs/) -------------------------------

  function startLog(section) {
    const lines = section.querySelector(".studio-log-lines");
    const state = section.querySelector(".studio-log-state");
    const form = section.querySelector(".studio-log-filters");
    let current = null;
    function connect() {
      if (current) current.close();
      lines.textContent = "";
      const params = new URLSearchParams({ tail: "200", descendants: "true" });
      const data = new FormData(form);
      for (const [key, value] of data.entries()) {
        if (value) params.set(key, value);
      }
      state.textContent = "following…";
      current = follow(`/ws/records/${section.dataset.logRecord}/logs/?${params}`, (message) => {
        if (message.error) {
          state.textContent = message.error;
          return;
        }
        for (const line of message.lines || []) {
          const row = document.createElement("div");
          row.className = `studio-log-line severity-${line.severity}`;
          row.dataset.line = line.id;
          const when = document.createElement("time");
          when.textContent = (line.at || "").slice(11, 23);
          const who = document.createElement("span");
          who.className = "studio-log-record";
          who.textContent = line.record_name;
          const text = document.createElement("span");
          text.className = "studio-log-text";
          text.textContent = line.message;
          row.append(when, " ", who, " ", text);
          lines.append(row);
        }
        lines.scrollTop = lines.scrollHeight;
      });
    }
    form.addEventListener("change", connect);
    form.addEventListener("submit", (event) => { event.preventDefault(); connect(); });
    connect();
  }

  // --- TTL countdowns ------------------------------------------------------------------------

  function tick() {
    const now = Date.now();
    document.querySelectorAll("[data-countdown]").forEach((el) => {
      let left = Math.floor((Date.parse(el.dataset.countdown) - now) / 1000);
      if (left <= 0) { el.textContent = "expired"; return; }
      const d = Math.floor(left / 86400); left %= 86400;
      const h = Math.floor(left / 3600); left %= 3600;
      const m = Math.floor(left / 60); const s = left % 60;
      el.textContent = d ? `${d} d ${h} h` : h ? `${h} h ${String(m).padStart(2, "0")} min` : m ? `${m} min ${String(s).padStart(2, "0")} s` : `${s} s`;
    });
  }

  // --- depths (trees, waterfalls) -----------------------------------------------------------
  // The page's Content-Security-Policy allows no style= attribute: a depth comes as data-level
  // or data-depth and becomes the CSS variable the stylesheet indents by (set through the
  // CSSOM, which the policy allows), on the page and on every node added to it. A mutation
  // observer runs before the browser paints or runs anything else, so a fragment htmx swaps in
  // is never shown (or read) unindented; htmx's own load event comes only after its settle delay.

  function indent(root) {
    const each = (selector, apply) => {
      if (root.matches && root.matches(selector)) apply(root);
      root.querySelectorAll(selector).forEach(apply);
    };
    each("[data-level]", (el) => el.style.setProperty("--level", el.dataset.level));
    each("[data-depth]", (el) => el.style.setProperty("--depth", el.dataset.depth));
  }

  function indentAdded(mutations) {
    mutations.forEach((mutation) => mutation.addedNodes.forEach((node) => {
      if (node.nodeType === Node.ELEMENT_NODE) indent(node);
    }));
  }

  document.addEventListener("DOMContentLoaded", () => {
    indent(document.body);
    new MutationObserver(indentAdded).observe(document.body, { childList: true, subtree: true });
  });

  document.addEventListener("DOMContentLoaded", () => {
    startHints();
    document.querySelectorAll("[data-log-record]").forEach(startLog);
    tick();
    setInterval(tick, 1000);
  });
})();
