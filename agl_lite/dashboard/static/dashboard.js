// Live updates of the rollouts list: follow the store's completion cursor (a long poll) from where the page was
// rendered, and update the rows shown of each rollout that ends. Nothing re-reads the whole list.
"use strict";

async function follow(live) {
  let cursor = Number(live.dataset.cursor);
  let seen = 0;
  for (;;) {
    let answer;
    try {
      const resp = await fetch(`/dashboard/rollouts/completed?after=${cursor}`, { credentials: "same-origin" });
      if (!resp.ok) return; // logged out, or the gateway went away: the page stays as it is
      answer = await resp.json();
    } catch (err) {
      return;
    }
    for (const r of answer.rollouts) {
      seen += 1;
      const row = document.getElementById(`ro-${r.id}`);
      if (row === null) continue;
      const status = row.querySelector(".status");
      status.textContent = r.status;
      status.className = `status ${r.status}`;
      row.querySelector(".reward").textContent = r.reward === null ? "" : r.reward.toFixed(3);
      row.classList.add("updated");
    }
    document.getElementById("live-count").textContent = String(seen);
    cursor = answer.cursor;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (live !== null) follow(live);
});
