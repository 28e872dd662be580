// The deployment block shows why an action was refused (409) or the model server failed (502):
// htmx leaves error responses unswapped by default, so this block opts in. No trace text here.
(function () {
  "use strict";
  document.addEventListener("htmx:beforeSwap", function (event) {
    const status = event.detail.xhr.status;
    if ((status === 409 || status === 502) && event.detail.target.closest("[data-swaps-errors]")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
