"""Headless Chromium for the tests that look at a page as a reader sees it (tests/report/test_report.py,
tests/report/test_browser.py): started with a fresh profile and every background network feature off
(it would otherwise hang on a closed network), the page opened with a probe script injected
that writes what it measured into ``<body data-probe>``."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium"
                                        if Path("/usr/bin/chromium").exists() else None)
SKIP_REASON = "headless chromium is not installed (apt-get install chromium; .ci/run does)"

#: what a probe reports (JSON in ``<body data-probe>``): the page's width and scroll width,
#: elements wider than the page, each image (natural and drawn size, its box's edges, whether
#: it decoded, data-layout-problems), the scrolling boxes, the text outside code and math,
#: the number of MathML elements, figure captions that overlap their image, and resources
#: fetched from anywhere but this disk
PROBE = """<script>
window.addEventListener("load", function () {
  var d = document.documentElement, vw = d.clientWidth, wide = [], imgs = [], boxes = [];
  document.querySelectorAll("body *").forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > vw + 1 && !(e.parentElement && e.parentElement.closest(".scroll, pre, .md-sidebar, .md-header, .md-tabs, .md-search, table, .md-typeset__scrollwrap")))
      wide.push(e.tagName + "." + e.className + " right=" + Math.round(r.right));
  });
  document.querySelectorAll("img").forEach(function (i) {
    var r = i.getBoundingClientRect(), box = i.closest(".scroll") || i;
    var b = box.getBoundingClientRect();
    imgs.push({nw: i.naturalWidth, nh: i.naturalHeight, w: Math.round(r.width),
               h: Math.round(r.height), left: Math.round(b.left), right: Math.round(b.right),
               ok: i.complete && i.naturalWidth > 0, src: (i.getAttribute("src") || "").slice(0, 80),
               layout: i.getAttribute("data-layout-problems")});
  });
  document.querySelectorAll(".scroll").forEach(function (e) {
    boxes.push([e.scrollWidth, e.clientWidth]);
  });
  var text = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    var n = walker.currentNode, p = n.parentElement;
    if (p && !p.closest("code, pre, kbd, script, style, math, textarea, .md-search")) text.push(n.nodeValue);
  }
  var captions = [];
  document.querySelectorAll("figure").forEach(function (f) {
    var c = f.querySelector("figcaption"), i = f.querySelector("img");
    if (!c || !i) return;
    var a = c.getBoundingClientRect(), b = i.getBoundingClientRect();
    if (a.left < b.right && b.left < a.right && a.top < b.bottom - 1 && b.top < a.bottom - 1)
      captions.push(c.textContent.slice(0, 60));
  });
  var remote = performance.getEntriesByType("resource").map(function (e) { return e.name; })
    .filter(function (u) { return !/^(file|data|blob|about):/.test(u); });
  document.body.setAttribute("data-probe", JSON.stringify(
    {vw: vw, sw: d.scrollWidth, wide: wide, imgs: imgs, boxes: boxes, text: text.join(" "),
     math: document.getElementsByTagName("math").length, captions: captions, remote: remote}));
});
</script>"""


def chromium(args: list[str], tmp_path: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    """Run headless Chromium with a fresh profile and no background networking."""
    assert CHROMIUM is not None, SKIP_REASON
    profile = tempfile.mkdtemp(dir=tmp_path)
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}"]
    return subprocess.run(base + args, check=True, capture_output=True, text=True,
                          timeout=timeout)


def probe(page: Path, width: int, height: int, tmp_path: Path) -> dict:
    """Open a copy of ``page`` (beside it, so its relative links work) with :data:`PROBE`
    injected and return what the probe measured."""
    copy = page.with_name(f"probe_{width}_{page.name}")
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"),
                    encoding="utf-8")
    try:
        dom = chromium([f"--window-size={width},{height}", "--virtual-time-budget=10000",
                        "--dump-dom", copy.resolve().as_uri()], tmp_path)
    finally:
        copy.unlink()
    match = re.search(r'data-probe="([^"]*)"', dom.stdout)
    assert match, f"the probe script did not run on {page}"
    return json.loads(html.unescape(match.group(1)))


#: TeX a reader must never see: math delimiters and common commands outside code and MathML
RAW_TEX = re.compile(r"\\[()\[\]]|\\(frac|mathrm|mathbf|operatorname|sum|sqrt|lVert|text|"
                     r"left|right|cdot|top|tilde)\b|\$\$")
#: reST roles a reader must never see
LITERAL_ROLE = re.compile(r":(func|class|mod|meth|data|attr|exc|obj):`")


def reader_problems(found: dict) -> list[str]:
    """What a reader would see wrong on a probed page: raw TeX, literal roles, an image
    that did not load, a figure whose title overlaps (the report's data-layout-problems) or
    whose caption covers it, a resource fetched from the network."""
    out = []
    text = found["text"]
    for pattern, what in ((RAW_TEX, "raw TeX"), (LITERAL_ROLE, "a literal role")):
        m = pattern.search(text)
        if m:
            out.append(f"{what}: ...{text[max(0, m.start() - 40):m.end() + 40]}...")
    out += [f"image not loaded: {i['src']}" for i in found["imgs"] if not i["ok"]]
    out += [f"figure layout: {i['layout']}" for i in found["imgs"] if i["layout"]]
    out += [f"caption over its figure: {c}" for c in found["captions"]]
    out += [f"fetched from the network: {u}" for u in found["remote"]]
    return out
