// Keyboard review: j/k move between turns, 1-9 toggle tags, f writes feedback on the focused
// turn, n opens the next queue item, ? shows the map. Nothing here reads trace text.
(function () {
  "use strict";

  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }

  function turns() {
    return Array.from(document.querySelectorAll(".turn[data-turn]"));
  }

  function focusTurn(step) {
    const all = turns();
    if (!all.length) return;
    const current = all.indexOf(document.querySelector(".turn.focused"));
    const next = all[Math.min(Math.max(current + step, 0), all.length - 1)];
    all.forEach(function (turn) { turn.classList.remove("focused"); });
    next.classList.add("focused");
    next.focus();
  }

  function pinFeedback(anchor) {
    const form = document.getElementById("feedback-form");
    if (!form) return;
    const select = form.querySelector("select[name=anchor]");
    if (select && anchor && Array.from(select.options).some(function (o) { return o.value === anchor; })) {
      select.value = anchor;
    }
    form.closest("details") && (form.closest("details").open = true);
    form.querySelector("textarea[name=text]").focus();
  }

  document.addEventListener("click", function (event) {
    const pin = event.target.closest("button.pin");
    if (pin) pinFeedback(pin.dataset.anchor);
  });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const key = event.key;
    if (key === "j" || key === "k") {
      focusTurn(key === "j" ? 1 : -1);
    } else if (key >= "1" && key <= "9") {
      const button = document.querySelector('.tag-toggle[data-key="' + key + '"]');
      if (button) button.click();
    } else if (key === "f") {
      const focused = document.querySelector(".turn.focused");
      let anchor = "trace";
      if (focused && focused.dataset.role === "assistant") anchor = "turn:" + focused.dataset.turn;
      pinFeedback(anchor);
    } else if (key === "n") {
      // In a queue: finish this item and go on; after finishing: just go on.
      const next = document.getElementById("done-next") || document.getElementById("next-item");
      if (next) next.click();
    } else if (key === "?") {
      const map = document.getElementById("keymap");
      if (map && !map.open) map.showModal();
    } else {
      return;
    }
    event.preventDefault();
  });
})();
