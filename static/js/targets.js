// Keyboard judging on the targets page: j/k move between proposals, a approves the focused one,
// e edits it, r rejects all of its feedback's proposals. After a choice, focus moves on to the
// next feedback still waiting for one. The keys join the ? map. No proposal text is read here.
(function () {
  "use strict";

  let decidedGroupId = null;

  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }

  function proposals() {
    return Array.from(document.querySelectorAll(".proposal[data-target]"));
  }

  function focusProposal(proposal) {
    if (!proposal) return;
    const others = proposal.closest("details.other-proposals");
    if (others) others.open = true;
    proposals().forEach(function (p) { p.classList.remove("focused"); });
    proposal.classList.add("focused");
    proposal.focus();
  }

  function focused() {
    return document.querySelector(".proposal.focused");
  }

  function move(step) {
    const all = proposals();
    if (!all.length) return;
    const current = all.indexOf(focused());
    focusProposal(all[current < 0 ? 0 : Math.min(Math.max(current + step, 0), all.length - 1)]);
  }

  function waiting(group) {
    return group.querySelector('.proposal button[value="approve"]') !== null;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    const group = event.target.closest(".feedback-targets");
    decidedGroupId = group && focused() && group.contains(focused()) ? group.id : null;
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    if (!decidedGroupId || event.detail.xhr.status !== 200) return;
    const group = document.getElementById(decidedGroupId);
    decidedGroupId = null;
    if (!group) return;
    let next = group.nextElementSibling;
    while (next && !(next.matches(".feedback-targets") && waiting(next))) next = next.nextElementSibling;
    focusProposal((next || group).querySelector(".proposal[data-target]"));
  });

  document.addEventListener("DOMContentLoaded", function () {
    const keys = document.getElementById("target-keys");
    const map = document.querySelector("#keymap dl");
    if (!keys || !map) return;
    Array.from(keys.children).forEach(function (row) { map.appendChild(row.cloneNode(true)); });
  });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const key = event.key;
    const proposal = focused();
    if (key === "j" || key === "k") {
      move(key === "j" ? 1 : -1);
    } else if (key === "a" && proposal) {
      const approve = proposal.querySelector('button[name="decision"][value="approve"]');
      if (approve) approve.click();
    } else if (key === "e" && proposal) {
      const edit = proposal.querySelector("details.edit");
      if (!edit) return;
      edit.open = true;
      edit.querySelector("textarea").focus();
    } else if (key === "r" && proposal) {
      const reject = proposal.closest(".feedback-targets").querySelector("form.reject-all button");
      if (reject) reject.click();
    } else {
      return;
    }
    event.preventDefault();
  });
})();
