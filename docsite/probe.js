// The docs check's probe: once every diagram is drawn (or 8 s have passed), write what
// the page shows into a JSON script element, which --dump-dom prints.
(function () {
  var started = Date.now();
  function report() {
    var diagrams = Array.from(document.querySelectorAll("div.diagram"));
    var drawn = diagrams.filter(function (d) { return d.querySelector("svg"); });
    if (drawn.length < diagrams.length && Date.now() - started < 8000) {
      setTimeout(report, 100);
      return;
    }
    var content = document.querySelector(".md-content");
    var code = Array.from(content.querySelectorAll("pre > code"));
    var names = Array.from(content.querySelectorAll("table td:first-child code"))
                     .filter(function (c) {
      // a row's name: one word of up to 40 characters, never broken (assets/site.js)
      return !/\s/.test(c.textContent) && c.textContent.length <= 40;
    });
    var out = document.createElement("script");
    out.type = "application/json";
    out.id = "kasper-probe";
    out.textContent = JSON.stringify({
      title: document.title,
      h1: (content.querySelector("h1") || {}).textContent || "",
      text: content.innerText,
      diagrams: diagrams.length,
      drawn: drawn.map(function (d) {
        return Array.from(d.querySelectorAll("svg text, svg foreignObject"))
                    .map(function (e) { return e.textContent; }).join(" ");
      }),
      code_blocks: code.length,
      cut_code: code.filter(function (c) { return c.scrollWidth > c.clientWidth + 1; })
                    .map(function (c) { return c.textContent.slice(0, 60); }),
      broken_names: names.filter(function (c) { return c.getClientRects().length > 1; })
                         .map(function (c) { return c.textContent; }),
      cut_tables: Array.from(content.querySelectorAll(".md-typeset__scrollwrap"))
                       .filter(function (t) { return t.scrollWidth > t.clientWidth + 1; })
                       .map(function (t) { return t.innerText.slice(0, 60); }),
      page_overflow: document.documentElement.scrollWidth - window.innerWidth
    });
    document.body.appendChild(out);
  }
  window.addEventListener("load", function () { setTimeout(report, 0); });
})();
