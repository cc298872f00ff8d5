// Time-series line charts drawn on a canvas: no library, nothing fetched.
//
// A chart shows points `{t, [key]: number | null}` over the last minute, growing with the
// history up to `windowS` seconds; a null (or missing) value leaves a gap. The y axis starts
// at 0, with four steps of a round size.

const FONT = "11px system-ui, -apple-system, 'Segoe UI', sans-serif";
const AXIS_COLOR = "#8a94a6";
const GRID_COLOR = "#e3e7ee";
const MARGIN = { top: 8, right: 10, bottom: 20, left: 44 };

const STEPS = 4;
const MIN_WINDOW_S = 60;

/** The smallest round step (1, 2, 2.5 or 5 × 10^n) with STEPS steps reaching `value`. */
export function niceStep(value, floor = 1) {
  const target = Math.max(value, floor) / STEPS;
  const magnitude = 10 ** Math.floor(Math.log10(target));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * magnitude >= target) return step * magnitude;
  }
  return 10 * magnitude;
}

/** A short label: 1200 -> "1.2k", 0.5 -> "0.5". */
export function shortNumber(value) {
  if (value >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
  if (value >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
  if (value >= 10 || value === 0) return String(Math.round(value));
  return String(+value.toPrecision(2));
}

export class LineChart {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {HTMLElement} legend  a list the legend entries go into
   * @param {{series: {key: string, label: string, color: string}[], scale?: number,
   *          windowS?: number, floor?: number}} options  `scale` multiplies values (s -> ms)
   */
  constructor(canvas, legend, options) {
    this.canvas = canvas;
    this.series = options.series;
    this.scale = options.scale ?? 1;
    this.windowS = options.windowS ?? 300;
    this.floor = options.floor ?? 1;
    this.latest = new Map();
    for (const { key, label, color } of this.series) {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.backgroundColor = color; // CSSOM: allowed by the page's style-src 'self'
      const name = document.createElement("span");
      name.textContent = label;
      const value = document.createElement("span");
      value.className = "legend-value";
      item.append(swatch, name, value);
      legend.append(item);
      this.latest.set(key, value);
    }
  }

  /** Redraw with `points` (oldest first); `now` (Unix s, the server's clock) is the right edge. */
  draw(points, now) {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (width === 0 || height === 0) return;
    // Draw at the screen's resolution so lines stay sharp on high-density displays.
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);

    // The window grows with the history, so the first minutes are not a sliver at the edge.
    const span = points.length ? now - points[0].t : 0;
    const windowS = Math.min(this.windowS, Math.max(MIN_WINDOW_S, Math.ceil(span / 60) * 60));
    const start = now - windowS;
    const visible = points.filter((point) => point.t >= start && point.t <= now + 5);
    let highest = 0;
    for (const point of visible) {
      for (const { key } of this.series) {
        const value = point[key];
        if (typeof value === "number") highest = Math.max(highest, value * this.scale);
      }
    }
    const step = niceStep(highest, this.floor);
    const top = step * STEPS;
    const plotWidth = width - MARGIN.left - MARGIN.right;
    const plotHeight = height - MARGIN.top - MARGIN.bottom;
    const x = (t) => MARGIN.left + ((t - start) / windowS) * plotWidth;
    const y = (value) => MARGIN.top + plotHeight - (value / top) * plotHeight;

    context.font = FONT;
    context.lineWidth = 1;
    // Horizontal grid with value labels.
    context.textAlign = "right";
    context.textBaseline = "middle";
    for (let index = 0; index <= STEPS; index += 1) {
      const value = step * index;
      const row = Math.round(y(value)) + 0.5;
      context.strokeStyle = GRID_COLOR;
      context.beginPath();
      context.moveTo(MARGIN.left, row);
      context.lineTo(width - MARGIN.right, row);
      context.stroke();
      context.fillStyle = AXIS_COLOR;
      context.fillText(shortNumber(value), MARGIN.left - 6, row);
    }
    // Time labels, seconds before now.
    context.textAlign = "center";
    context.textBaseline = "top";
    const tick = windowS / 4;
    for (let ago = 0; ago <= windowS; ago += tick) {
      const column = x(now - ago);
      context.fillText(ago === 0 ? "now" : `-${ago}s`, column, height - MARGIN.bottom + 5);
    }

    for (const { key, color } of this.series) {
      context.strokeStyle = color;
      context.lineWidth = 1.75;
      context.lineJoin = "round";
      context.beginPath();
      const lonely = []; // values with gaps on both sides: a line would not show them
      visible.forEach((point, index) => {
        const value = point[key];
        if (typeof value !== "number") return; // a gap: nothing was observed then
        const px = x(point.t);
        const py = y(value * this.scale);
        const before = visible[index - 1]?.[key];
        const after = visible[index + 1]?.[key];
        if (typeof before === "number") context.lineTo(px, py);
        else context.moveTo(px, py);
        if (typeof before !== "number" && typeof after !== "number") lonely.push([px, py]);
      });
      context.stroke();
      context.fillStyle = color;
      for (const [px, py] of lonely) {
        context.beginPath();
        context.arc(px, py, 2.5, 0, 2 * Math.PI);
        context.fill();
      }
      const last = visible.length ? visible[visible.length - 1][key] : null;
      this.latest.get(key).textContent =
        typeof last === "number" ? shortNumber(last * this.scale) : "–";
    }
  }
}
