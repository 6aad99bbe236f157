// An experiment page's charts: one SVG line chart per reported key, one line per member
// (its colour the same in every chart and in the legend), from
// /api/experiments/{id}/reports. Every text goes in as text (never as HTML).
"use strict";
(function () {
  const charts = document.getElementById("charts");
  if (!charts) return;
  const legend = document.getElementById("legend");
  const note = document.getElementById("charts-note");
  const SVG = "http://www.w3.org/2000/svg";
  const W = 520, H = 260, LEFT = 58, RIGHT = 14, TOP = 12, BOTTOM = 34;
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  // colour: a member's colour, by its index (past the palette: hues a golden angle apart).
  function colour(index) {
    if (index < PALETTE.length) return PALETTE[index];
    return "hsl(" + ((index * 137.508) % 360).toFixed(1) + ", 62%, 42%)";
  }

  function svg(name, attributes, parent) {
    const element = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
    if (parent) parent.appendChild(element);
    return element;
  }

  // ticks: about `count` round values spanning [lo, hi] (1, 2 or 5 times a power of ten apart).
  function ticks(lo, hi, count) {
    const raw = (hi - lo) / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || 10 * power;
    const first = Math.floor(lo / step) * step;
    const last = Math.ceil(hi / step) * step;
    const found = [];
    for (let v = first; v <= last + step / 2; v += step) found.push(Number(v.toPrecision(12)));
    return found;
  }

  // label: a tick's text, short (k and M for large numbers, an exponent for tiny ones).
  function label(v) {
    const size = Math.abs(v);
    if (size >= 1e6) return Number((v / 1e6).toPrecision(3)) + "M";
    if (size >= 1e4) return Number((v / 1e3).toPrecision(3)) + "k";
    if (size !== 0 && size < 1e-3) return v.toExponential(1);
    return String(Number(v.toPrecision(4)));
  }

  // span: the [lo, hi] of the numbers, widened when they are all one value.
  function span(numbers) {
    let lo = Infinity, hi = -Infinity;
    for (const n of numbers) {
      if (n < lo) lo = n;
      if (n > hi) hi = n;
    }
    if (lo === hi) {
      const pad = Math.abs(lo) * 0.1 || 1;
      lo -= pad;
      hi += pad;
    }
    return [lo, hi];
  }

  function draw(key, members) {
    const drawn = members.filter((m) => m.series[key] && m.series[key].steps.length);
    const figure = document.createElement("figure");
    figure.className = "chart";
    figure.dataset.key = key;
    const caption = document.createElement("figcaption");
    caption.textContent = key;
    figure.appendChild(caption);
    const plot = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img" }, figure);
    const steps = drawn.flatMap((m) => m.series[key].steps);
    const values = drawn.flatMap((m) => m.series[key].values);
    const xs = ticks(...span(steps), 5), ys = ticks(...span(values), 4);
    const [x0, x1] = [xs[0], xs[xs.length - 1]], [y0, y1] = [ys[0], ys[ys.length - 1]];
    const x = (s) => LEFT + ((s - x0) / (x1 - x0)) * (W - LEFT - RIGHT);
    const y = (v) => H - BOTTOM - ((v - y0) / (y1 - y0)) * (H - TOP - BOTTOM);
    const axes = svg("g", { class: "axes" }, plot);
    for (const v of ys) {
      svg("line", { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v), class: "grid" }, axes);
      const text = svg("text", { x: LEFT - 6, y: y(v) + 4, "text-anchor": "end" }, axes);
      text.textContent = label(v);
    }
    for (const s of xs) {
      svg("line", { x1: x(s), x2: x(s), y1: H - BOTTOM, y2: H - BOTTOM + 4, class: "tick" }, axes);
      const text = svg("text", { x: x(s), y: H - BOTTOM + 16, "text-anchor": "middle" }, axes);
      text.textContent = label(s);
    }
    svg("line", { x1: LEFT, x2: W - RIGHT, y1: H - BOTTOM, y2: H - BOTTOM, class: "axis" }, axes);
    svg("line", { x1: LEFT, x2: LEFT, y1: TOP, y2: H - BOTTOM, class: "axis" }, axes);
    const title = svg("text", { x: W - RIGHT, y: H - 4, "text-anchor": "end" }, axes);
    title.textContent = "step";
    const lines = svg("g", { class: "lines" }, plot);
    for (const m of drawn) {
      const s = m.series[key];
      const points = s.steps.map((step, i) => x(step).toFixed(1) + "," + y(s.values[i]).toFixed(1));
      const line = svg("polyline", {
        points: points.join(" "), fill: "none", stroke: colour(m.index), "stroke-width": 1.8,
        class: "series", "data-member": m.name,
      }, lines);
      svg("title", {}, line).textContent = m.name + (m.label ? " (" + m.label + ")" : "");
      if (s.steps.length === 1) {  // one point draws no line: mark it
        svg("circle", { cx: x(s.steps[0]), cy: y(s.values[0]), r: 3, fill: colour(m.index),
                        class: "point", "data-member": m.name }, lines);
      }
    }
    charts.appendChild(figure);
  }

  // highlight: pointing at a member in the legend dims every other member's lines.
  function highlight(name) {
    for (const element of charts.querySelectorAll(".series, .point")) {
      element.classList.toggle("dim", name !== null && element.dataset.member !== name);
    }
  }

  function key(members) {
    legend.replaceChildren();
    for (const m of members) {
      const item = document.createElement("li");
      const swatch = svg("svg", { width: 14, height: 10, class: "swatch" }, item);
      svg("rect", { width: 14, height: 10, rx: 2, fill: colour(m.index) }, swatch);
      item.appendChild(document.createTextNode(" " + m.name + (m.label ? " · " + m.label : "")));
      item.addEventListener("mouseenter", () => highlight(m.name));
      item.addEventListener("mouseleave", () => highlight(null));
      legend.appendChild(item);
    }
  }

  async function load() {
    try {
      const reply = await fetch("/api/experiments/" + encodeURIComponent(charts.dataset.experiment)
                                + "/reports", { credentials: "same-origin" });
      if (!reply.ok) {
        note.textContent = await reply.text();
        return;
      }
      const data = await reply.json();
      charts.replaceChildren();
      key(data.members);
      for (const k of data.keys) draw(k, data.members);
      charts.dataset.drawn = String(data.keys.length);
    } catch (error) {
      note.textContent = "the server did not answer: " + error;
    }
  }
  load();
})();
