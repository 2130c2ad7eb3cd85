/* The course's pages: render the Mermaid diagrams (from the vendored mermaid), then mark the
   page ready (body[data-ready]) for the browser test. Nothing is fetched. */
window.rlvrCourse = (function () {
  const palette = {
    background: "#14141f",
    primaryColor: "#1e1e2e",
    primaryTextColor: "#e5e7eb",
    primaryBorderColor: "#5eead4",
    secondaryColor: "#1b2b33",
    tertiaryColor: "#241a2e",
    lineColor: "#5eead4",
    textColor: "#e5e7eb",
    mainBkg: "#1e1e2e",
    nodeBorder: "#5eead4",
    clusterBkg: "#181826",
    clusterBorder: "#3b3b55",
    edgeLabelBackground: "#14141f",
    fontFamily: "DejaVu Sans, Liberation Sans, Arial, sans-serif",
    fontSize: "16px",
  };

  function init() {
    mermaid.initialize({
      startOnLoad: false,
      theme: "base",
      themeVariables: palette,
      securityLevel: "strict",
      flowchart: { htmlLabels: false, curve: "basis" },
    });
  }

  async function render() {
    init();
    const nodes = document.querySelectorAll("pre.mermaid");
    if (nodes.length) {
      await mermaid.run({ nodes: Array.from(nodes) });
    }
  }

  function ready() {
    document.body.dataset.ready = "1";
  }

  return {
    page: function () {
      render().then(ready, function (err) {
        console.error("mermaid: " + err);
        ready();
      });
    },
    deck: function () {
      render().then(
        function () {
          Reveal.initialize({
            hash: true,
            width: 1280,
            height: 720,
            margin: 0.04,
            center: false,
            transition: "none",
            slideNumber: "c/t",
            plugins: [RevealNotes],
          }).then(ready);
        },
        function (err) {
          console.error("mermaid: " + err);
          ready();
        }
      );
    },
  };
})();
