// The site's own script (mkdocs.yml: extra_javascript), run once a page has loaded.
//
// Diagrams: each ```mermaid block of a page is a <div class="diagram"> holding the
// diagram's text (mkdocs.yml: pymdownx.superfences custom_fences), drawn here as an SVG
// in the page with the copy of mermaid under assets/vendor/, so the site needs no
// network. Drawn once, at load, in the colour scheme the page opened with.
//
// Text blocks: a ```text block (a diagram in characters, program output) keeps its lines
// whole; where they are wider than the column, its font shrinks until they fit, down
// to 9 px; wider still (long program output), its lines wrap like other code.
//
// Names in tables: a code of one word (a field, a flag, a file, a metric) of up to 40
// characters in a row's first cell, the one that names the row, gets the class "name",
// which site.css keeps on one line: never broken at an underscore, a hyphen or a slash
// ("--exactly-" / "once").
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
  function markNames() {
    document.querySelectorAll(".md-typeset table td:first-child code").forEach(function (code) {
      var text = code.textContent;
      if (!/\s/.test(text) && text.length <= 40) {
        code.classList.add("name");
      }
    });
  }
  function fitText() {
    document.querySelectorAll(".md-typeset .language-text pre > code").forEach(function (code) {
      code.style.fontSize = "";
      code.style.whiteSpace = "";
      code.style.overflowWrap = "";
      var size = parseFloat(window.getComputedStyle(code).fontSize);
      while (code.scrollWidth > code.clientWidth && size > 9) {
        size -= 0.5;
        code.style.fontSize = size + "px";
      }
      if (code.scrollWidth > code.clientWidth) {  // too wide to read small: wrap it
        code.style.fontSize = "";
        code.style.whiteSpace = "pre-wrap";
        code.style.overflowWrap = "break-word";
      }
    });
  }
  function start() {
    markNames();
    fitText();
    draw();
    window.addEventListener("resize", fitText);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
