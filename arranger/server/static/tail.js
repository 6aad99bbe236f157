// The job page's live log tail: polls /api/jobs/{job}/log from where the last answer ended
// and appends what came as text (never as HTML). It keeps the newest KEEP characters.
"use strict";
(function () {
  const KEEP = 262144;
  const pre = document.getElementById("log-tail");
  const note = document.getElementById("log-note");
  if (!pre) return;
  const pod = new URLSearchParams(window.location.search).get("pod") || "";
  let offset = null;
  async function poll() {
    const query = new URLSearchParams({ pod: pod });
    if (offset !== null) query.set("offset", String(offset));
    let wait = 1000;
    try {
      const reply = await fetch("/api/jobs/" + encodeURIComponent(pre.dataset.job) + "/log?" + query,
                                { credentials: "same-origin" });
      if (!reply.ok) {
        note.textContent = await reply.text();
        wait = 5000;
      } else {
        const piece = await reply.json();
        if (piece.text) {
          pre.appendChild(document.createTextNode(piece.text));
          if (pre.textContent.length > KEEP) pre.textContent = pre.textContent.slice(-KEEP);
          pre.scrollTop = pre.scrollHeight;
        }
        note.textContent = piece.note || (piece.ended ? "the pod has ended" : "");
        offset = piece.offset;
        if (piece.ended) wait = 5000;
      }
    } catch (error) {
      note.textContent = "the server did not answer: " + error;
      wait = 5000;
    }
    window.setTimeout(poll, wait);
  }
  poll();
})();
