// The race replay, drawn in the visitor's browser (the Replay button's `js` handler: no
// Python function, no server round trip). app/figures.py race_figure() stores each
// method's timeline in the figure's layout.meta.race: engine ms and tokens committed after
// each step, and the indices of its bar, line and marker traces. This redraws the figure
// at engine time t, from 0 to the end, in real time (faster for races longer than
// race.seconds), then puts back the figure as the server drew it. A new figure from the
// server (a new run) or another press of Replay ends a replay under way. The texts of
// app/figures.py text_race_html() (#text-race) grow on the same clock: each token shows
// once the engine time of the step that committed it has passed.
() => {
  const gd = document.querySelector("#race-plot .js-plotly-plot");
  const Plotly = window.Plotly;
  if (!gd || !Plotly || !gd.layout) return [];
  const race = gd.layout.meta && gd.layout.meta.race;
  if (!race || !race.runs.length) {
    Plotly.relayout(gd, { "title.text": "Run a prompt first" });
    return [];
  }
  const token = {};
  gd._cloverReplay = token;
  const traces = race.runs.flatMap((r) => r.traces);
  const saved = {
    data: { x: traces.map((i) => gd.data[i].x), y: traces.map((i) => gd.data[i].y),
            text: traces.map((i) => gd.data[i].text) },
    layout: { "title.text": gd.layout.title.text,
              "shapes[0].x0": gd.layout.shapes[0].x0, "shapes[0].x1": gd.layout.shapes[0].x1 },
  };
  const seconds = (ms) => (ms / 1e3).toFixed(2);
  const rows = Array.from(document.querySelectorAll("#text-race .race-row")).map((row) => ({
    spans: Array.from(row.querySelectorAll(".race-text span[data-ms]")),
    box: row.querySelector(".race-text"), clock: row.querySelector(".race-clock"),
  }));
  for (const r of rows) {
    r.end = r.spans.length ? +r.spans[r.spans.length - 1].dataset.ms : 0;
    r.shown = 0;
    r.clockText = r.clock ? r.clock.textContent : "";
    for (const s of r.spans) s.style.display = "none";
  }
  const texts = (t) => {
    for (const r of rows) {
      while (r.shown < r.spans.length && +r.spans[r.shown].dataset.ms <= t) {
        r.spans[r.shown++].style.display = "";
        r.box.scrollTop = r.box.scrollHeight;
      }
      if (r.clock) r.clock.textContent = seconds(Math.min(t, r.end)) + " s" + (t >= r.end ? " ✓" : "");
    }
  };
  const draw = (t) => {
    texts(t);
    const x = [], y = [], text = [];
    for (const r of race.runs) {
      let k = 0;  // the last step that ended by t
      while (k + 1 < r.ms.length && r.ms[k + 1] <= t) k++;
      const end = r.ms[r.ms.length - 1];
      let label = `${r.tokens[k]} tok`;
      if (t >= end) label += (r.finished ? " · done in " : " · stopped at ") + seconds(end) + " s";
      x.push([r.tokens[k]], r.ms.slice(0, k + 1).map((ms) => ms / 1e3), [r.ms[k] / 1e3]);
      y.push([r.name], r.tokens.slice(0, k + 1), [r.tokens[k]]);
      text.push([label], undefined, undefined);  // undefined: left as it is
    }
    return Plotly.update(gd, { x, y, text }, {
      "title.text": `Race replay: ${seconds(t)} s of engine time`,
      "shapes[0].x0": t / 1e3, "shapes[0].x1": t / 1e3,
    }, traces);
  };
  const current = () => gd._cloverReplay === token && gd.layout && gd.layout.meta &&
    gd.layout.meta.race && gd.layout.meta.race.key === race.key;
  const speed = Math.max(1, race.end_ms / 1e3 / race.seconds);  // real time, or faster
  const start = performance.now();
  const tick = () => {
    if (!current()) return;  // a new run's figure, or a new replay, took over
    const t = (performance.now() - start) * speed;
    if (t >= race.end_ms) {
      texts(Infinity);
      for (const r of rows) if (r.clock) r.clock.textContent = r.clockText;
      Plotly.update(gd, saved.data, saved.layout, traces);
      gd._cloverReplay = null;
      return;
    }
    draw(t).then(() => setTimeout(tick, 1e3 / race.fps));
  };
  tick();
  return [];
}
