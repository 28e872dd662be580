// Page behaviour the CSP allows only from a file: a form with data-confirm asks before it is
// sent (the server still decides what is allowed), a button with data-opens shows that dialog,
// and feedback a reviewer just saved is scrolled into view with its turn marked. Nothing here
// reads trace text.
(function () {
  "use strict";

  // Capturing on the document runs before htmx's own submit listener on the form, so a
  // cancelled confirmation stops both the plain post and the htmx one.
  document.addEventListener(
    "submit",
    function (event) {
      const form = event.target;
      const question = form.dataset && form.dataset.confirm;
      if (question && !window.confirm(question)) {
        event.preventDefault();
        event.stopImmediatePropagation();
      }
    },
    true
  );

  document.addEventListener("click", function (event) {
    const opener = event.target.closest("button[data-opens]");
    const dialog = opener && document.getElementById(opener.dataset.opens);
    if (dialog && !dialog.open) dialog.showModal();
  });

  function markTurn(index) {
    document.querySelectorAll(".turn.has-new-feedback").forEach(function (turn) {
      turn.classList.remove("has-new-feedback");
    });
    const turn = document.getElementById("turn-" + index);
    if (turn) turn.classList.add("has-new-feedback");
  }

  // The feedback panel marks what it just saved with data-saved on the new item and
  // data-saved-turn on the panel (absent for feedback about the whole trace).
  // Handled once: the attribute goes, so a later swap elsewhere does not scroll back to it.
  document.addEventListener("htmx:afterSettle", function () {
    const panel = document.getElementById("feedback-panel");
    const saved = panel && panel.querySelector(".feedback[data-saved]");
    if (!saved) return;
    saved.removeAttribute("data-saved");
    if (panel.dataset.savedTurn) markTurn(panel.dataset.savedTurn);
    saved.scrollIntoView({ block: "nearest" });
    saved.focus({ preventScroll: true });
  });
})();
