// The trace list's "select all on this page": its box ticks or clears every row's box that
// belongs to the form it names (rows scrolled in later too), and shows mixed when only some
// are ticked. The server decides what the ticked traces may have done to them.
(function () {
  "use strict";

  function rowBoxes(toggle) {
    const form = document.getElementById(toggle.dataset.selectAll);
    if (!form) return [];
    return Array.prototype.filter.call(form.elements, function (element) {
      return element.type === "checkbox" && element.name === "trace";
    });
  }

  function refresh() {
    document.querySelectorAll("input[data-select-all]").forEach(function (toggle) {
      const boxes = rowBoxes(toggle);
      const ticked = boxes.filter(function (box) { return box.checked; }).length;
      toggle.checked = boxes.length > 0 && ticked === boxes.length;
      toggle.indeterminate = ticked > 0 && ticked < boxes.length;
    });
  }

  document.addEventListener("change", function (event) {
    const toggle = event.target.closest && event.target.closest("input[data-select-all]");
    if (toggle) {
      rowBoxes(toggle).forEach(function (box) { box.checked = toggle.checked; });
    }
    refresh();
  });
  document.addEventListener("htmx:afterSettle", refresh);
  document.addEventListener("DOMContentLoaded", refresh);
})();
