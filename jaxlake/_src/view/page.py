"""The HTML page of `jaxlake view`: one file, nothing fetched.

plotly.js (from the plotly package) draws the timeline and the allocation
bands; view.js draws the memory map on a canvas and wires the controls;
the data from model.py is embedded as JSON. The page opens offline and can
be attached to a bug report.
"""

from __future__ import annotations

import html
import json
import pathlib
from typing import Any, Dict

from jaxlake._src.errors import JaxlakeError

HERE = pathlib.Path(__file__).parent
#: The install hint when plotly is missing.
EXTRA = "pip install 'jaxlake[view]'"


class MissingPlotlyError(JaxlakeError, ImportError):
    """plotly, which the page embeds, is not installed."""


def plotly_js() -> str:
    """plotly.js, minified, from the installed plotly package."""
    try:
        from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]
    except ImportError:
        raise MissingPlotlyError(
            "jaxlake view needs plotly (its plotly.js is embedded in the "
            f"page): {EXTRA}") from None
    return str(get_plotlyjs())


def _embed_json(data: Dict[str, Any]) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # Inside <script>: no "</" (could close the element) and no U+2028/9.
    return (text.replace("</", "<\\/").replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029"))


def _embed_js(code: str) -> str:
    return code.replace("</script", "<\\/script")


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="jaxlake {version}">
<title>jaxlake view: {title}</title>
<style>
{css}
</style>
<script>
{plotly}
</script>
</head>
<body>
<header>
  <h1>jaxlake view: <span id="trace-name">{title}</span></h1>
  <p class="sub" id="trace-info"></p>
</header>
<ul class="notes" id="notes" hidden></ul>
<div class="empty" id="empty" hidden></div>
<div class="controls" id="device-box" hidden>
  <label for="device">Device</label> <select id="device"></select>
</div>

<section id="summary-section">
  <h2>Summary</h2>
  <p class="sub">What <code>jaxlake replay</code> prints for this trace (figures summed over its devices).
  U: peak live / peak reserved; W: peak reserved &minus; peak live.</p>
  <table class="summary" id="summary"></table>
  <ul id="summary-notes"></ul>
</section>

<section id="timeline-section">
  <h2>Timeline</h2>
  <p class="sub">Live bytes (grey) and each policy's reserved bytes; the gap is memory held but not used.
  Diamonds: allocations jaxlake served by stitching; circles: by reusing a stitched range (on long
  traces, ticks in a lane above the chart). Drag to zoom, double-click to reset, click to show the
  lake's memory map at that event.</p>
  <div id="timeline" class="chart"></div>
</section>

<section id="map-section">
  <h2>Memory map (jaxlake)</h2>
  <p class="sub" id="map-intro"></p>
  <div class="eventbar">
    <button id="prev-snap" title="previous snapshot (left arrow)">&#9664;</button>
    <input type="range" id="event-slider" min="0" max="0" value="0" aria-label="event">
    <button id="next-snap" title="next snapshot (right arrow)">&#9654;</button>
    <span id="event-label"></span>
  </div>
  <div class="eventbar">
    <button id="prev-stitch">previous stitch</button>
    <button id="next-stitch">next stitch</button>
    <button id="goto-peak">peak live</button>
    <button id="goto-oom" hidden>out of memory</button>
    <label><input type="checkbox" id="show-cached" checked> show cached stitched ranges</label>
  </div>
  <div class="maplegend" id="map-legend"></div>
  <div class="maprow">
    <div class="mapstats" id="map-stats"></div>
    <div class="mapbox" id="map-box"><canvas id="map-canvas"></canvas></div>
  </div>
</section>

<section id="bands-section">
  <h2>Allocations</h2>
  <p class="sub" id="bands-info"></p>
  <p class="sub" id="served"></p>
  <div id="bands" class="chart"></div>
</section>

<div class="tooltip" id="tooltip" hidden></div>
<footer>Written by <code>jaxlake view</code> (jaxlake {version}); the data and plotly.js
are embedded, nothing is fetched.</footer>
<script type="application/json" id="jaxlake-data">{data}</script>
<script>
{script}
</script>
</body>
</html>
"""


def render(data: Dict[str, Any], version: str) -> str:
    """The page for `data` (model.build())."""
    js = plotly_js()
    return TEMPLATE.format(
        version=html.escape(version),
        title=html.escape(str(data["trace"]["name"])),
        css=(HERE / "view.css").read_text(encoding="utf-8"),
        plotly=_embed_js(js),
        data=_embed_json(data),
        script=_embed_js((HERE / "view.js").read_text(encoding="utf-8")))
