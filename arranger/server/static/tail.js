// The job page's live log tail: polls /api/jobs/{job}/log from where the last answer ended
// and appends what came as text (never as HTML). It keeps the newest KEEP characters.
"use strict";
(function () {
  const KEEP = 262144;
  const pre = document.getElementById("log-tail");
  const note = document.getElementById("log-note");
  if (!pre) return;
  const attempts = document.getElementById("log-attempts");
  const search = new URLSearchParams(window.location.search);
  const pod = search.get("pod") || "";
  const asked = search.get("attempt");
  let offset = null;
  let tailing = null; // the attempt `offset` points into
  let shown = null;
  // The attempt picker: a link for each of the pod's attempts, the one shown in bold.
  function pick(attempt, latest) {
    if (!attempts || shown === attempt + "/" + latest) return;
    shown = attempt + "/" + latest;
    attempts.replaceChildren(document.createTextNode("attempt: "));
    for (let n = 0; n <= latest; n++) {
      const link = document.createElement("a");
      link.href = "?" + new URLSearchParams({ pod: pod, attempt: String(n) }) + "#log";
      link.textContent = String(n);
      if (n === attempt) link.className = "shown";
      attempts.append(link, document.createTextNode(" "));
    }
  }
  async function poll() {
    const query = new URLSearchParams({ pod: pod });
    if (offset !== null) query.set("offset", String(offset));
    if (asked !== null) query.set("attempt", asked);
    let wait = 1000;
    try {
      const reply = await fetch("/api/jobs/" + encodeURIComponent(pre.dataset.job) + "/log?" + query,
                                { credentials: "same-origin" });
      if (!reply.ok) {
        note.textContent = await reply.text();
        wait = 5000;
      } else {
        const piece = await reply.json();
        if (tailing !== null && piece.attempt !== tailing) {
          // Another attempt is the newest with a log now: its text starts afresh, from its tail.
          pre.textContent = "";
          offset = null;
          tailing = null;
          window.setTimeout(poll, 0);
          return;
        }
        tailing = piece.attempt;
        if (piece.text) {
          pre.appendChild(document.createTextNode(piece.text));
          if (pre.textContent.length > KEEP) pre.textContent = pre.textContent.slice(-KEEP);
          pre.scrollTop = pre.scrollHeight;
        }
        if (typeof piece.attempt === "number") pick(piece.attempt, piece.latest);
        let said = piece.ended ? "the attempt has ended" : "";
        if (asked === null && piece.attempt < piece.latest) {
          said = "attempt " + piece.attempt + ", the newest with a log. " + said;
        }
        note.textContent = piece.note || said;
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
