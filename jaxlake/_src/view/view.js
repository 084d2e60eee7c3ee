// jaxlake view: draws the data embedded in the page (model.py builds it).
// The timeline and the allocation bands are plotly charts; the memory map
// is drawn on a canvas. Nothing is fetched: the page works offline.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("jaxlake-data").textContent);
  var POLICY_COLORS = {
    "jaxlake": "#1f5fbf", "bfc": "#ff7f0e", "torch": "#2ca02c",
    "torch-expandable": "#9467bd", "gmlake": "#8c564b"
  };
  var KIND_COLORS = {
    "param": "#4e79a7", "opt_state": "#f28e2b", "input": "#76b7b2",
    "output": "#59a14f", "temp": "#e15759", "grad": "#edc948",
    "activation": "#b07aa1", "other": "#9c755f", "unknown": "#bab0ac"
  };
  // Chunk states of a snapshot (model.py): free, live, lent, slab, free
  // but pending another stream's work.
  var STATE = { FREE: 0, LIVE: 1, LENT: 2, SLAB: 3, PENDING: 4 };
  var MAP_COLORS = {
    0: "#e9e9e9", 1: "#4e79a7", 2: "#d81b7a", 3: "#59a14f", 4: "#f3d9a4"
  };
  var STITCH_COLOR = "#d81b7a";
  var PLOT_CONFIG = { displaylogo: false, responsive: true,
                      modeBarButtonsToRemove: ["select2d", "lasso2d"] };

  var state = { device: 0, snap: 0, layout: null, syncing: false };

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmtBytes(b) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var v = b, u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return (u === 0 ? String(v) : v.toFixed(v >= 100 ? 1 : 2)) + " " + units[u];
  }
  function dev() { return DATA.devices[state.device]; }
  // Whether a snapshot follows an allocation served by a stitched range.
  function isStitch(s) {
    return s.why.some(function (w) { return w.indexOf("stitch") === 0; });
  }

  // -- header, notes, table -------------------------------------------------

  function renderHeader() {
    var t = DATA.trace;
    $("trace-name").textContent = t.name;
    var parts = [t.events.toLocaleString() + " events", t.devices + " device(s)",
                 "policies: " + DATA.policies.join(", ")];
    if (DATA.capacity) parts.push("capacity " + DATA.capacity + " per device");
    if (t.path) parts.push(t.path);
    $("trace-info").textContent = parts.join(" \u00b7 ");
    document.title = "jaxlake view: " + t.name;
  }

  function renderNotes() {
    var ul = $("notes");
    ul.innerHTML = "";
    var notes = DATA.notes.slice();
    if (DATA.devices.length) notes = notes.concat(dev().notes);
    notes.forEach(function (n) { ul.appendChild(el("li", null, n)); });
    ul.hidden = notes.length === 0;
  }

  function renderTable() {
    var tab = $("summary");
    tab.innerHTML = "";
    var head = el("tr");
    DATA.table.columns.forEach(function (c) { head.appendChild(el("th", null, c)); });
    tab.appendChild(head);
    var best = -1, bestU = -1;
    DATA.table.rows.forEach(function (r, i) {
      var u = parseFloat(r[2]);
      if (u > bestU) { bestU = u; best = i; }
    });
    DATA.table.rows.forEach(function (r, i) {
      var tr = el("tr", { "class": "policy-row" + (i === best ? " best" : "") });
      r.forEach(function (c, j) {
        var td = el("td", null, c);
        if (j === 1 && POLICY_COLORS[c]) {
          var sw = el("span", { "class": "legend-swatch" });
          sw.style.background = POLICY_COLORS[c];
          td.insertBefore(sw, td.firstChild);
        }
        tr.appendChild(td);
      });
      tab.appendChild(tr);
    });
    var ul = $("summary-notes");
    ul.innerHTML = "";
    DATA.table.notes.forEach(function (n) { ul.appendChild(el("li", null, n)); });
  }

  function renderDeviceSelector() {
    var sel = $("device");
    sel.innerHTML = "";
    DATA.devices.forEach(function (d, i) {
      sel.appendChild(el("option", { value: String(i) },
                         "device " + d.device + " (" + d.events.toLocaleString() + " events)"));
    });
    $("device-box").hidden = DATA.devices.length < 2;
    sel.onchange = function () {
      state.device = parseInt(sel.value, 10);
      renderDevice();
    };
  }

  // -- timeline --------------------------------------------------------------

  function selectedEvent() {
    var s = dev().snapshots[state.snap];
    return s ? s.event : null;
  }

  function markerShape(x) {
    return { type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
             line: { color: STITCH_COLOR, width: 1.5, dash: "dot" } };
  }

  function renderTimeline() {
    var d = dev(), tl = d.timeline, unit = d.unit;
    var traces = [{
      type: "scatter", mode: "lines", name: "live", x: tl.x, y: tl.live,
      line: { color: "#222", width: 1.5, shape: "hv" }, fill: "tozeroy",
      fillcolor: "rgba(0,0,0,0.10)", customdata: tl.hover,
      hovertemplate: "live %{y:.4g} " + unit + "<br>%{customdata}<extra>live</extra>"
    }];
    tl.policies.forEach(function (p) {
      var x = p.x || tl.x.slice(0, p.y.length);
      var custom = p.y.map(function (y, i) {
        var live = tl.live[i] || 0;
        return [p.u[i], y > 0 ? live / y : 0];
      });
      traces.push({
        type: "scatter", mode: "lines", name: p.name + " reserved", x: x, y: p.y,
        line: { color: POLICY_COLORS[p.name] || "#666", width: p.name === "jaxlake" ? 2.5 : 1.6,
                shape: "hv" },
        customdata: custom, meta: p.name,
        hovertemplate: "reserved %{y:.4g} " + unit +
          " \u00b7 live/reserved %{customdata[1]:.3f} \u00b7 U so far %{customdata[0]:.3f}" +
          "<extra>%{meta}</extra>"
      });
      if (p.oom) {
        traces.push({
          type: "scatter", mode: "markers", name: p.name + " out of memory",
          x: [p.oom.event], y: [p.oom.y], showlegend: false,
          marker: { symbol: "x", size: 13, color: "#d00", line: { width: 2 } },
          text: [p.oom.text], hovertemplate: "%{text}<extra></extra>"
        });
      }
    });
    // Few stitches: marks on the lake's line. Many: a lane of ticks above
    // the chart, so they do not hide the line.
    var many = tl.stitches.x.length + tl.reuses.x.length > 60;
    [[tl.reuses, "jaxlake stitch reuse", "circle-open", 0],
     [tl.stitches, "jaxlake stitch", "diamond", 1]].forEach(function (m) {
      var marks = m[0];
      if (!marks.x.length) return;
      traces.push({
        type: "scatter", mode: "markers", name: m[1] + (many ? " (" + marks.total.toLocaleString() + ")" : ""),
        x: marks.x, y: many ? marks.x.map(function () { return m[3]; }) : marks.y,
        yaxis: many ? "y2" : "y", text: marks.text,
        marker: many ? { symbol: "line-ns-open", size: 10, color: STITCH_COLOR, opacity: 0.6 }
                     : { symbol: m[2], size: m[3] ? 10 : 8, color: STITCH_COLOR,
                         line: { color: m[3] ? "#fff" : STITCH_COLOR, width: 1 } },
        hovertemplate: "%{text}<extra></extra>"
      });
    });
    var shapes = [];
    if (d.capacity !== null) {
      shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: d.capacity, y1: d.capacity,
                    line: { color: "#d00", width: 1, dash: "dash" } });
    }
    var ev = selectedEvent();
    if (ev !== null) shapes.push(markerShape(ev));
    var layout = {
      height: 360, margin: { l: 70, r: 20, t: 10, b: 40 },
      hovermode: "x unified", showlegend: true,
      legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 0 },
      xaxis: { title: { text: "event" }, hoverformat: ",d", range: fullRange() },
      yaxis: { title: { text: unit }, rangemode: "tozero" },
      shapes: shapes
    };
    if (many) {
      layout.yaxis.domain = [0, 0.86];
      layout.yaxis2 = { domain: [0.89, 1], range: [-0.6, 1.6], fixedrange: true,
                        tickvals: [0, 1], ticktext: ["reuse", "stitch"], showgrid: false,
                        zeroline: false };
    }
    if (d.capacity !== null) {
      layout.annotations = [{ xref: "paper", x: 1, y: d.capacity, xanchor: "right", yanchor: "bottom",
                              text: "capacity", showarrow: false, font: { color: "#d00", size: 11 } }];
    }
    Plotly.react($("timeline"), traces, layout, PLOT_CONFIG);
  }

  // -- bands -----------------------------------------------------------------

  // The x range both charts show when not zoomed: the device's events.
  function fullRange() {
    var d = dev();
    return [d.timeline.x.length ? d.timeline.x[0] : 0, d.bands.end];
  }

  function renderBands() {
    var d = dev(), b = d.bands, unit = d.unit;
    var traces = b.kinds.map(function (k) {
      return {
        type: "bar", orientation: "h", name: k.kind, base: k.base, x: k.len,
        y: k.y, width: k.w, hovertext: k.text, hoverinfo: "text",
        customdata: k.id, marker: { color: KIND_COLORS[k.kind] || "#999",
                                    line: { width: 0 } }
      };
    });
    var ev = selectedEvent();
    var layout = {
      height: 380, margin: { l: 70, r: 20, t: 10, b: 40 }, barmode: "overlay",
      hovermode: "closest", bargap: 0,
      legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 0 },
      xaxis: { title: { text: "event" }, range: fullRange() },
      yaxis: { title: { text: "stacked live " + unit }, rangemode: "tozero" },
      shapes: ev !== null ? [markerShape(ev)] : []
    };
    Plotly.react($("bands"), traces, layout, PLOT_CONFIG);
    $("bands-info").textContent = b.total
      ? "Each allocation is a band over its lifetime, stacked in allocation order and coloured by kind" +
        " (" + b.drawn.toLocaleString() + " of " + b.total.toLocaleString() + " allocations drawn)." +
        " Hover a band for its size, kind, lifetime, stream and how jaxlake served it."
      : "No allocations on this device.";
  }

  function linkZoom(from, to) {
    $(from).on("plotly_relayout", function (ev) {
      if (state.syncing) return;
      var upd = null;
      if (ev["xaxis.range[0]"] !== undefined) {
        upd = { "xaxis.range": [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] };
      } else if (ev["xaxis.range"]) {
        upd = { "xaxis.range": ev["xaxis.range"] };
      } else if (ev["xaxis.autorange"]) {
        upd = { "xaxis.range": fullRange() };
      }
      if (!upd) return;
      state.syncing = true;
      Promise.resolve(Plotly.relayout($(to), upd)).then(function () { state.syncing = false; },
                                                        function () { state.syncing = false; });
    });
  }

  function nearestSnapshot(event) {
    var snaps = dev().snapshots, best = 0, bestD = Infinity;
    for (var i = 0; i < snaps.length; i++) {
      var dd = Math.abs(snaps[i].event - event);
      if (dd < bestD) { bestD = dd; best = i; }
    }
    return best;
  }

  // -- memory map ------------------------------------------------------------

  function findRun(runs, c) {
    var lo = 0, hi = runs.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (runs[mid][1] <= c) lo = mid + 1;
      else if (runs[mid][0] > c) hi = mid - 1;
      else return runs[mid];
    }
    return null;
  }

  // Segments flow left to right like words, each a box of chunk cells
  // with a label above it; a segment longer than a line takes whole lines.
  function mapGeometry(snap, width) {
    var areaW = Math.max(160, width - 16), x0 = 8;
    var labelH = 13, lineGap = 5, segGap = 12;
    var sizes = [16, 13, 11, 9, 7, 5, 4, 3, 2];
    var g = null;
    for (var i = 0; i < sizes.length; i++) {
      g = flow(snap, sizes[i], areaW, x0, labelH, lineGap, segGap);
      if (g.height <= 720) break;
    }
    return g;
  }

  // Narrow cells stay at least 9 pixels tall, so their colour shows.
  function flow(snap, cell, areaW, x0, labelH, lineGap, segGap) {
    var gap = cell >= 5 ? 1 : 0, pitch = cell + gap;
    var ch = Math.max(cell, 9), pitchY = ch + 1;
    var cols = Math.max(1, Math.floor(areaW / pitch));
    var lineH = labelH + ch + lineGap;
    var x = x0, y = 6, placed = [], segIndex = {};
    snap.segs.forEach(function (s) {
      var n = s[1], w = n * pitch - gap, p;
      if (n <= cols) {
        if (x > x0 && x + w > x0 + areaW) { x = x0; y += lineH; }
        p = { seg: s, x: x, y: y + labelH, perLine: n, lines: 1, w: w };
        x += w + segGap;
      } else {
        if (x > x0) { x = x0; y += lineH; }
        var lines = Math.ceil(n / cols);
        p = { seg: s, x: x0, y: y + labelH, perLine: cols, lines: lines, w: cols * pitch - gap };
        y += labelH + lines * pitchY + lineGap;
        x = x0;
      }
      placed.push(p);
      segIndex[s[0]] = p;
    });
    var height = (x > x0 ? y + lineH : y) + 6;
    return { cell: cell, ch: ch, gap: gap, pitch: pitch, pitchY: pitchY, cols: cols,
             rows: placed, segIndex: segIndex, height: height, labelH: labelH };
  }

  function chunkXY(g, p, c) {
    return [p.x + (c % p.perLine) * g.pitch, p.y + Math.floor(c / p.perLine) * g.pitchY];
  }

  // Rectangles covering chunks [start, start+n) of a segment (one per line).
  function chunkRects(g, p, start, n) {
    var out = [], c = start, end = start + n;
    while (c < end) {
      var lineEnd = (Math.floor(c / p.perLine) + 1) * p.perLine;
      var stop = Math.min(end, lineEnd);
      var xy = chunkXY(g, p, c);
      out.push([xy[0], xy[1], (stop - c) * g.pitch - g.gap, g.ch]);
      c = stop;
    }
    return out;
  }

  function drawMap() {
    var d = dev();
    var canvas = $("map-canvas");
    var box = $("map-box");
    var snap = d.snapshots[state.snap];
    var ctx = canvas.getContext("2d");
    var width = Math.max(320, box.clientWidth - 2);
    if (!snap) {
      canvas.width = width; canvas.height = 40;
      ctx.clearRect(0, 0, width, 40);
      ctx.fillStyle = "#666"; ctx.font = "13px sans-serif";
      ctx.fillText("No snapshot of the lake on this device.", 10, 24);
      state.layout = null;
      return;
    }
    var g = mapGeometry(snap, width);
    var ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(g.height * ratio);
    canvas.style.width = width + "px";
    canvas.style.height = g.height + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, g.height);
    ctx.font = "11px sans-serif";
    ctx.textBaseline = "top";
    var slabs = {};
    snap.slabs.forEach(function (s) { slabs[s[0]] = s; });
    g.rows.forEach(function (r) {
      var s = r.seg;
      var label = "seg " + s[0] + " \u00b7 " + fmtBytes(s[1] * snap.gran);
      ctx.fillStyle = "#444";
      ctx.font = "10px sans-serif";
      var lw = ctx.measureText(label).width;
      if (lw > r.w + 10) {
        label = "#" + s[0];
        lw = ctx.measureText(label).width;
      }
      if (lw <= r.w + 10) ctx.fillText(label, r.x, r.y - g.labelH + 1);
      // The segment's outline: where one physical handle ends.
      ctx.strokeStyle = "#9a9a9a";
      ctx.lineWidth = g.cell >= 5 ? 1 : 0.6;
      chunkRects(g, r, 0, s[1]).forEach(function (rc) {
        ctx.strokeRect(rc[0] - 1.5, rc[1] - 1.5, rc[2] + 3, rc[3] + 3);
      });
      s[2].forEach(function (run) {
        var st = run[2];
        chunkRects(g, r, run[0], run[1] - run[0]).forEach(function (rc) {
          ctx.fillStyle = MAP_COLORS[st];
          ctx.fillRect(rc[0], rc[1], rc[2], rc[3]);
          if (st === STATE.SLAB && slabs[run[3]]) {
            // Darker: the used share of the slab.
            var sl = slabs[run[3]], share = sl[4] ? sl[5] / sl[4] : 0;
            ctx.fillStyle = "#2e6b2a";
            ctx.fillRect(rc[0], rc[1] + rc[3] * (1 - share), rc[2], rc[3] * share);
          }
        });
        if (g.cell >= 7) {
          // Run borders, so neighbouring blocks stay apart.
          ctx.strokeStyle = "rgba(255,255,255,0.9)";
          ctx.lineWidth = 1;
          chunkRects(g, r, run[0], run[1] - run[0]).forEach(function (rc) {
            ctx.strokeRect(rc[0] + 0.5, rc[1] + 0.5, rc[2] - 1, rc[3] - 1);
          });
        }
      });
    });
    // Stitched ranges over the chunks they borrow: outlines and links
    // between their pieces, in address order.
    var showCached = $("show-cached").checked;
    snap.stitched.forEach(function (st) {
      var live = st[2] > 0;
      if (!live && !showCached) return;
      var color = live ? STITCH_COLOR : "rgba(216,27,122,0.55)";
      ctx.strokeStyle = color;
      ctx.lineWidth = live ? 2 : 1.2;
      ctx.setLineDash(live ? [] : [3, 3]);
      var prev = null, first = null;
      st[4].forEach(function (p) {
        var row = g.segIndex[p[0]];
        if (!row) return;
        var rects = chunkRects(g, row, p[1], p[2]);
        rects.forEach(function (rc) { ctx.strokeRect(rc[0] - 1, rc[1] - 1, rc[2] + 2, rc[3] + 2); });
        var a = rects[0], z = rects[rects.length - 1];
        if (!first) first = a;
        if (prev) {
          var x0 = prev[0] + prev[2], y0 = prev[1] + prev[3] / 2;
          var x1 = a[0], y1 = a[1] + a[3] / 2;
          var bend = Math.max(24, Math.abs(y1 - y0) * 0.35);
          ctx.save();
          ctx.lineWidth = live ? 1.3 : 1;
          ctx.globalAlpha = live ? 0.8 : 0.6;
          ctx.beginPath();
          ctx.moveTo(x0, y0);
          ctx.bezierCurveTo(x0 + bend, y0, x1 - bend, y1, x1, y1);
          ctx.stroke();
          ctx.restore();
        }
        prev = z;
      });
      ctx.setLineDash([]);
      if (first && g.ch >= 9) {
        ctx.font = "bold 10px sans-serif";
        var name = "S" + st[0];
        if (ctx.measureText(name).width + 4 <= first[2]) {
          ctx.fillStyle = live ? "#fff" : STITCH_COLOR;
          ctx.textBaseline = "middle";
          ctx.fillText(name, first[0] + 2, first[1] + first[3] / 2 + 0.5);
          ctx.textBaseline = "top";
        }
      }
    });
    state.layout = { geometry: g, snap: snap };
    canvas.setAttribute("data-event", String(snap.event));
    canvas.setAttribute("data-segments", String(snap.segs.length));
    canvas.setAttribute("data-stitched", String(snap.stitched.length));
  }

  function renderMapStats() {
    var d = dev(), snap = d.snapshots[state.snap];
    var box = $("map-stats");
    box.innerHTML = "";
    if (!snap) return;
    var liveStitched = 0, liveStitchedBytes = 0, cached = 0, pending = 0, pieces = 0;
    snap.stitched.forEach(function (s) {
      if (s[2] > 0) { liveStitched++; liveStitchedBytes += s[2] * snap.gran; pieces += s[4].length; }
      else cached++;
    });
    snap.segs.forEach(function (s) {
      s[2].forEach(function (r) { if (r[2] === STATE.PENDING) pending += (r[1] - r[0]) * snap.gran; });
    });
    var freeBlocks = 0;
    snap.segs.forEach(function (s) { s[2].forEach(function (r) { if (r[2] === STATE.FREE || r[2] === STATE.PENDING) freeBlocks++; }); });
    var rows = [
      ["event", snap.event.toLocaleString() + (snap.why.length ? " (" + snap.why.join(", ") + ")" : "")],
      ["what", snap.what],
      ["reserved", fmtBytes(snap.reserved) + " in " + snap.segs.length + " segment(s)"],
      ["live", fmtBytes(snap.live) + (snap.reserved ? " (" + (snap.live / snap.reserved).toFixed(3) + " of reserved)" : "")],
      ["free (stitchable)", fmtBytes(snap.free) + " in " + freeBlocks + " block(s)"],
      ["largest free run", fmtBytes(snap.largest)],
      ["stitched ranges", liveStitched + " live (" + fmtBytes(liveStitchedBytes) + ", " + pieces + " pieces), " + cached + " cached"],
      ["small pool", fmtBytes(snap.small_used) + " used of " + fmtBytes(snap.small)]
    ];
    if (pending) rows.push(["waiting on a stream", fmtBytes(pending)]);
    var tab = el("table");
    rows.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", { "class": "key" }, r[0]));
      tr.appendChild(el("td", null, r[1]));
      tab.appendChild(tr);
    });
    box.appendChild(tab);
    // The allocation of this very event, when a stitched range serves it.
    snap.stitched.forEach(function (st) {
      if (st[5] !== snap.event || st[2] === 0) return;
      var how = el("div", { "class": "insight" });
      var parts = st[4].map(function (p) { return fmtBytes(p[2] * snap.gran) + " of seg " + p[0]; });
      var verb = snap.why.indexOf("stitch-reuse") >= 0 ? "reusing stitched range S" : "stitched range S";
      how.textContent = "This event's allocation (" + fmtBytes(st[2] * snap.gran) + ") is served by " + verb +
        st[0] + ", which maps " + st[4].length + " piece(s): " + parts.join(" + ") + "." +
        (snap.why.indexOf("stitch-grow") >= 0 ? " The last piece is a new segment holding only the shortfall." : "");
      box.appendChild(how);
    });
    var insight = el("div", { "class": "insight" });
    if (snap.free > snap.largest) {
      insight.textContent = "Fragmented: " + fmtBytes(snap.free) + " is free but the largest contiguous run is " +
        fmtBytes(snap.largest) + ". A request up to " + fmtBytes(snap.free) +
        " is served by stitching free chunks, with no new memory.";
    } else if (snap.free > 0) {
      insight.textContent = "Free memory is contiguous: " + fmtBytes(snap.free) + " in one run.";
    } else {
      insight.textContent = "No free chunks: the next large request grows the lake.";
    }
    box.appendChild(insight);
  }

  function renderMapLegend() {
    var items = [[MAP_COLORS[1], "live allocation"], [MAP_COLORS[2], "lent to a stitched allocation"],
                 [MAP_COLORS[0], "free (stitchable)"]];
    if (dev().streams > 1) items.push([MAP_COLORS[4], "free, for now only for the stream that freed it"]);
    items.push([MAP_COLORS[3], "small-request pool (dark: used)"]);
    var box = $("map-legend");
    box.innerHTML = "";
    items.forEach(function (it) {
      var span = el("span", { "class": "item" });
      var sw = el("span", { "class": "legend-swatch" });
      sw.style.background = it[0];
      span.appendChild(sw);
      span.appendChild(document.createTextNode(it[1]));
      box.appendChild(span);
    });
    var s = el("span", { "class": "item" });
    var sw2 = el("span", { "class": "legend-swatch" });
    sw2.style.border = "2px solid " + STITCH_COLOR;
    sw2.style.background = "transparent";
    s.appendChild(sw2);
    s.appendChild(document.createTextNode("stitched range (linked pieces; dashed: cached for reuse)"));
    box.appendChild(s);
  }

  function describeAlloc(ev) {
    var a = dev().allocs[String(ev)];
    if (!a) return "";
    var life = a[0] >= 0 ? "events " + ev + "-" + a[0] : "from event " + ev + ", never freed";
    return "<b>" + fmtBytes(a[1]) + "</b> " + a[2] + "<br>" + life + "<br>stream " + a[3] +
      ", line " + a[5] + "<br>jaxlake served it: " + a[4];
  }

  function onMapMove(e) {
    var tip = $("tooltip");
    var L = state.layout;
    if (!L) { tip.hidden = true; return; }
    var rect = $("map-canvas").getBoundingClientRect();
    var x = e.clientX - rect.left, y = e.clientY - rect.top;
    var g = L.geometry, snap = L.snap, hit = null;
    for (var i = 0; i < g.rows.length && !hit; i++) {
      var r = g.rows[i];
      var col = Math.floor((x - r.x) / g.pitch), line = Math.floor((y - r.y) / g.pitchY);
      if (col < 0 || col >= r.perLine || line < 0 || line >= r.lines) continue;
      if (y - r.y - line * g.pitchY > g.ch) continue;
      var c = line * r.perLine + col;
      if (c < r.seg[1]) hit = { seg: r.seg, chunk: c };
    }
    if (!hit) { tip.hidden = true; return; }
    var run = findRun(hit.seg[2], hit.chunk);
    var names = { 0: "free (stitchable)", 1: "live", 2: "lent to a stitched range", 3: "small-request pool",
                  4: "free, waiting for another stream's work" };
    var html = "segment " + hit.seg[0] + ", chunk " + hit.chunk + " (" + fmtBytes(snap.gran) + ")<br>" +
      "<b>" + names[run[2]] + "</b>, a block of " + (run[1] - run[0]) + " chunk(s)";
    if (run[2] === STATE.LIVE && run[3] >= 0) html += "<br>" + describeAlloc(run[3]);
    if (run[2] === STATE.LENT) {
      var st = null;
      snap.stitched.forEach(function (s) { if (s[0] === run[3]) st = s; });
      if (st) {
        html += "<br>stitched range S" + st[0] + ": " + fmtBytes(st[1] * snap.gran) + " from " +
          st[4].length + " piece(s): " + st[4].map(function (p) {
            return "seg " + p[0] + "[" + p[1] + "+" + p[2] + "]";
          }).join(", ");
        if (st[5] >= 0) html += "<br>" + describeAlloc(st[5]);
      }
    }
    if (run[2] === STATE.SLAB) {
      snap.slabs.forEach(function (s) {
        if (s[0] === run[3]) html += "<br>slab of stream " + s[6] + ": " + fmtBytes(s[5]) + " used of " + fmtBytes(s[4]);
      });
    }
    tip.innerHTML = html;
    tip.hidden = false;
    tip.style.left = (e.clientX + 14) + "px";
    tip.style.top = (e.clientY + 14) + "px";
  }

  // -- the event selector ----------------------------------------------------

  function setSnapshot(i, from) {
    var snaps = dev().snapshots;
    if (!snaps.length) return;
    state.snap = Math.max(0, Math.min(snaps.length - 1, i));
    var slider = $("event-slider");
    slider.value = String(state.snap);
    var s = snaps[state.snap];
    $("event-label").textContent = "event " + s.event.toLocaleString() + " (snapshot " +
      (state.snap + 1) + " of " + snaps.length + ")";
    drawMap();
    renderMapStats();
    var shape = [markerShape(s.event)];
    var tlShapes = [];
    var d = dev();
    if (d.capacity !== null) {
      tlShapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: d.capacity, y1: d.capacity,
                      line: { color: "#d00", width: 1, dash: "dash" } });
    }
    state.syncing = true;
    Promise.all([Plotly.relayout($("timeline"), { shapes: tlShapes.concat(shape) }),
                 Plotly.relayout($("bands"), { shapes: shape })]).then(function () { state.syncing = false; },
                                                                       function () { state.syncing = false; });
  }

  function jump(pred, dir) {
    var snaps = dev().snapshots;
    for (var k = 1; k <= snaps.length; k++) {
      var i = state.snap + dir * k;
      if (i < 0 || i >= snaps.length) break;
      if (pred(snaps[i])) { setSnapshot(i); return; }
    }
  }

  function renderSelector() {
    var d = dev(), snaps = d.snapshots;
    var slider = $("event-slider");
    slider.min = "0";
    slider.max = String(Math.max(0, snaps.length - 1));
    slider.disabled = snaps.length === 0;
    var stitchCount = snaps.filter(function (s) { return isStitch(s); }).length;
    $("next-stitch").disabled = stitchCount === 0;
    $("prev-stitch").disabled = stitchCount === 0;
    $("goto-oom").hidden = !snaps.some(function (s) { return s.why.indexOf("oom") >= 0; });
    $("map-intro").textContent = snaps.length
      ? "The jaxlake policy's memory after the chosen event (" + snaps.length +
        " snapshots: evenly spread, the peak of live bytes, " + stitchCount +
        " after allocations served by a stitched range). Rows are segments (physical handles), cells are " + fmtBytes(snaps[0].gran) +
        " chunks. Pick an event with the slider, or click the timeline."
      : "No snapshot of the lake on this device.";
    // Start at the stitch nearest the peak of live bytes when there is one
    // (that is the story), else at the peak; at an out-of-memory stop if
    // the lake had one.
    var start = d.peak_live_event >= 0 ? nearestSnapshot(d.peak_live_event) : 0, bestD = Infinity;
    snaps.forEach(function (s, i) {
      var dd = Math.abs(s.event - d.peak_live_event);
      if (isStitch(s) && s.why.indexOf("stitch-reuse") < 0 && dd < bestD) { bestD = dd; start = i; }
    });
    snaps.forEach(function (s, i) { if (s.why.indexOf("oom") >= 0) start = i; });
    state.snap = start;
    var maxCached = 0;
    snaps.forEach(function (s) {
      var c = 0;
      s.stitched.forEach(function (st) { if (st[2] === 0) c++; });
      maxCached = Math.max(maxCached, c);
    });
    $("show-cached").checked = maxCached <= 12;
  }

  // -- the whole page --------------------------------------------------------

  function renderDevice() {
    renderNotes();
    renderMapLegend();
    var d = dev();
    var served = Object.keys(d.served).filter(function (k) { return d.served[k] > 0; });
    $("served").textContent = served.length ? "jaxlake served " + served.map(function (k) {
      return d.served[k].toLocaleString() + " " + k;
    }).join(", ") + "." : "";
    renderSelector();
    renderTimeline();
    renderBands();
    setSnapshot(state.snap);
  }

  function init() {
    renderHeader();
    renderTable();
    if (DATA.empty) {
      $("empty").textContent = DATA.empty;
      $("empty").hidden = false;
      ["timeline-section", "map-section", "bands-section"].forEach(function (id) { $(id).hidden = true; });
      renderNotes();
      document.body.setAttribute("data-ready", "1");
      return;
    }
    renderDeviceSelector();
    $("event-slider").addEventListener("input", function () {
      setSnapshot(parseInt($("event-slider").value, 10));
    });
    $("prev-snap").onclick = function () { setSnapshot(state.snap - 1); };
    $("next-snap").onclick = function () { setSnapshot(state.snap + 1); };
    $("next-stitch").onclick = function () { jump(function (s) { return isStitch(s); }, 1); };
    $("prev-stitch").onclick = function () { jump(function (s) { return isStitch(s); }, -1); };
    $("goto-peak").onclick = function () { setSnapshot(nearestSnapshot(dev().peak_live_event)); };
    $("goto-oom").onclick = function () { jump(function (s) { return s.why.indexOf("oom") >= 0; }, 1); };
    $("show-cached").onchange = drawMap;
    $("map-canvas").addEventListener("mousemove", onMapMove);
    $("map-canvas").addEventListener("mouseleave", function () { $("tooltip").hidden = true; });
    renderDevice();
    linkZoom("timeline", "bands");
    linkZoom("bands", "timeline");
    $("timeline").on("plotly_click", function (ev) {
      if (ev.points && ev.points.length) setSnapshot(nearestSnapshot(ev.points[0].x));
    });
    $("bands").on("plotly_click", function (ev) {
      if (ev.points && ev.points.length) setSnapshot(nearestSnapshot(ev.points[0].customdata));
    });
    var resizeTimer = null;
    window.addEventListener("resize", function () {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(drawMap, 150);
    });
    document.addEventListener("keydown", function (e) {
      if (e.target && (e.target.tagName === "SELECT" || e.target.tagName === "INPUT")) return;
      if (e.key === "ArrowRight") setSnapshot(state.snap + 1);
      else if (e.key === "ArrowLeft") setSnapshot(state.snap - 1);
    });
    document.body.setAttribute("data-ready", "1");
  }

  window.jaxlakeView = { data: DATA, state: state, setSnapshot: setSnapshot };
  init();
})();
