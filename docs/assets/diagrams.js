// Draws the diagrams: each ```mermaid block of a page is a <div class="diagram"> holding
// the diagram's text (mkdocs.yml: pymdownx.superfences custom_fences), drawn here as an
// SVG in the page with the copy of mermaid under assets/vendor/, so the site needs no
// network. Drawn once, at load, in the colour scheme the page opened with.
(function () {
  function draw() {
    var nodes = document.querySelectorAll("div.diagram:not([data-processed])");
    if (!nodes.length || typeof mermaid === "undefined") {
      return;
    }
    var scheme = document.body.getAttribute("data-md-color-scheme");
    mermaid.initialize({
      startOnLoad: false,
      securityLevel: "strict",
      theme: scheme === "slate" ? "dark" : "default",
      fontFamily: "var(--md-text-font-family)",
    });
    mermaid.run({ nodes: nodes });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
