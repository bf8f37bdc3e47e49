// artstore viewer: charts (Chart.js, vendored) and live updates (periodic fetch of JSON).
// Every value from the store is set as text (textContent) or drawn on a canvas: never
// parsed as HTML.
"use strict";

(function () {
  const COLORS = ["#2f6fde", "#e4572e", "#1f8a4c", "#8a63d2", "#d2a663", "#17a2b8", "#c0392b", "#6c757d"];

  function pageData() {
    const element = document.getElementById("page-data");
    return element ? JSON.parse(element.textContent) : null;
  }

  function alpha(color, opacity) {
    const n = parseInt(color.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${opacity})`;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined) return "";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return String(value);
    return String(Number(value.toPrecision(digits || 4)));
  }

  function el(tag, props, ...children) {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "className") element.className = value;
      else if (key === "dataset") Object.assign(element.dataset, value);
      else element.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  function runHref(run) {
    return "/runs/" + run.split("/").map(encodeURIComponent).join("/");
  }

  function clock() {
    return new Date().toISOString().slice(11, 19) + " UTC";
  }

  // Fetch `url` every `ms` milliseconds and hand the JSON to `update`; say so in `note`.
  function poll(url, ms, update, note) {
    async function tick() {
      try {
        const response = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
        if (!response.ok) throw new Error(`${response.status}`);
        const keepGoing = update(await response.json());
        if (note) note.textContent = `live: updated ${clock()}`;
        if (keepGoing === false) return;
      } catch (error) {
        if (note) note.textContent = `live: cannot reach the viewer (${error.message}); retrying`;
      }
      setTimeout(tick, ms);
    }
    setTimeout(tick, ms);
  }

  // --- charts --------------------------------------------------------------------------

  const BASE_OPTIONS = {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    interaction: { mode: "nearest", intersect: false },
    plugins: {
      legend: { labels: { boxWidth: 12, filter: (item, data) => !data.datasets[item.datasetIndex].band } },
    },
  };

  function linearX(title) {
    return { type: "linear", title: { display: true, text: title }, ticks: { precision: 0 } };
  }

  function titled(text, extra) {
    return Object.assign({ title: { display: true, text } }, extra || {});
  }

  // A mean line with a band of ± one standard deviation, as three datasets.
  function bandDatasets(label, points, color) {
    const xy = (key, sign) =>
      points.map((p) => ({ x: p.step, y: key === "mean" ? p.mean : p.mean + sign * p.std }));
    return [
      { label: `${label} +std`, band: true, data: xy("band", 1), borderWidth: 0, pointRadius: 0, fill: false },
      {
        label: `${label} -std`,
        band: true,
        data: xy("band", -1),
        borderWidth: 0,
        pointRadius: 0,
        fill: "-1",
        backgroundColor: alpha(color, 0.15),
      },
      {
        label,
        data: xy("mean", 0),
        borderColor: color,
        backgroundColor: color,
        pointRadius: 3,
        tension: 0,
        points: points,
      },
    ];
  }

  function makeChart(canvas, config) {
    if (!canvas || typeof Chart === "undefined") return null;
    const existing = Chart.getChart(canvas);
    if (existing) {
      existing.data = config.data;
      existing.update("none");
      return existing;
    }
    return new Chart(canvas, config);
  }

  function showEmpty(canvas, empty, text) {
    const frame = canvas.parentElement;
    let note = frame.querySelector(".empty");
    if (empty && !note) {
      note = el("p", { className: "empty" }, text);
      frame.append(note);
    }
    if (!empty && note) note.remove();
    canvas.hidden = empty;
  }

  function rewardCurveChart(canvas, curve) {
    const scorers = Object.keys(curve);
    const datasets = scorers.flatMap((scorer, i) => bandDatasets(scorer, curve[scorer], COLORS[i % COLORS.length]));
    showEmpty(canvas, datasets.length === 0, "No reward recorded yet.");
    return makeChart(canvas, {
      type: "line",
      data: { datasets },
      options: Object.assign({}, BASE_OPTIONS, {
        scales: { x: linearX("policy step"), y: titled("reward") },
      }),
    });
  }

  function tokensChart(canvas, usage) {
    showEmpty(canvas, usage.length === 0, "No LLM call recorded yet.");
    return makeChart(canvas, {
      type: "bar",
      data: {
        labels: usage.map((u) => String(u.step)),
        datasets: [
          { label: "prompt tokens", data: usage.map((u) => u.prompt_tokens), backgroundColor: alpha(COLORS[0], 0.7) },
          { label: "completion tokens", data: usage.map((u) => u.completion_tokens), backgroundColor: alpha(COLORS[1], 0.7) },
        ],
      },
      options: Object.assign({}, BASE_OPTIONS, {
        scales: {
          x: titled("policy step", { stacked: true }),
          y: titled("tokens (policy rollouts)", { stacked: true }),
        },
      }),
    });
  }

  function latencyChart(canvas, usage, trainDurations) {
    const series = [
      ["mean LLM latency", usage.map((u) => ({ x: u.step, y: u.mean_latency_s }))],
      ["max LLM latency", usage.map((u) => ({ x: u.step, y: u.max_latency_s }))],
      ["mean rollout duration", usage.map((u) => ({ x: u.step, y: u.mean_duration_s }))],
      // The train step that started from policy step s (and reached s + 1).
      ["train step duration", trainDurations.map((t) => ({ x: t.step - 1, y: t.duration_s }))],
    ];
    const datasets = series
      .map(([label, points], i) => ({
        label,
        data: points.filter((p) => p.x !== null && p.y !== null && p.y !== undefined),
        borderColor: COLORS[i],
        backgroundColor: COLORS[i],
        pointRadius: 3,
      }))
      .filter((d) => d.data.length > 0);
    showEmpty(canvas, datasets.length === 0, "No timing recorded yet.");
    return makeChart(canvas, {
      type: "line",
      data: { datasets },
      options: Object.assign({}, BASE_OPTIONS, {
        scales: { x: linearX("policy step"), y: titled("seconds") },
      }),
    });
  }

  function metricCharts(container, metrics) {
    const names = [...new Set(metrics.map((m) => m.metric))];
    const models = [...new Set(metrics.map((m) => m.model))];
    const wanted = names.join("\n");
    if (container.dataset.metrics !== wanted) {
      container.replaceChildren(
        ...names.map((name, i) =>
          el("div", { className: "chart", dataset: { metric: name } },
            el("h3", {}, name),
            el("div", { className: "frame" }, el("canvas", { id: `metric-${i}`, dataset: { metric: name } })))
        )
      );
      container.dataset.metrics = wanted;
    }
    const empty = document.getElementById("no-metrics");
    if (empty) empty.hidden = names.length > 0;
    names.forEach((name, i) => {
      const datasets = metrics
        .filter((m) => m.metric === name)
        .map((m) => {
          const color = COLORS[models.indexOf(m.model) % COLORS.length];
          return {
            label: m.model,
            data: m.points.map((p) => ({ x: p.step, y: p.value })),
            borderColor: color,
            backgroundColor: color,
            pointRadius: 3,
          };
        });
      makeChart(document.getElementById(`metric-${i}`), {
        type: "line",
        data: { datasets },
        options: Object.assign({}, BASE_OPTIONS, {
          plugins: { legend: { display: models.length > 1 } },
          scales: { x: linearX("step"), y: {} },
        }),
      });
    });
  }

  // --- pages ---------------------------------------------------------------------------

  function sparkline(points) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", "70");
    svg.setAttribute("height", "18");
    if (points.length < 2) return svg;
    const ys = points.map((p) => p.mean);
    const low = Math.min(...ys);
    const high = Math.max(...ys);
    const coords = points.map((p, i) => {
      const x = 2 + (66 * i) / (points.length - 1);
      const y = high === low ? 9 : 16 - (14 * (p.mean - low)) / (high - low);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", coords.join(" "));
    const title = document.createElementNS(ns, "title");
    title.textContent = "reward per policy step: " + ys.map((y) => fmt(y, 3)).join(", ");
    svg.append(title, line);
    return svg;
  }

  function runRow(run) {
    const rollouts = `${run.rollouts_finished} / ${run.rollouts_failed}` +
      (run.rollouts_running ? ` (${run.rollouts_running} running)` : "");
    const cell = (name, className, ...content) => el("td", { className: `c-${name} ${className || ""}`.trim() }, ...content);
    return el("tr", { dataset: { run: run.run } },
      cell("run", "", el("a", { href: runHref(run.run) }, run.run)),
      cell("model", "", run.model),
      cell("status", "", el("span", { className: `status status-${run.status}` }, run.status)),
      cell("steps", "num", run.steps),
      cell("groups", "num", `${run.groups_sealed} / ${run.groups_consumed}`),
      cell("rollouts", "num", rollouts),
      cell("reward", "num", fmt(run.reward), sparkline(run.reward_curve)),
      cell("tokens", "num", run.total_tokens || 0),
      cell("failures", "num", run.failures),
      cell("started", "", (run.started_at || "").slice(0, 19)),
    );
  }

  function renderRuns(runs) {
    document.getElementById("runs-body").replaceChildren(...runs.map(runRow));
    document.getElementById("runs-empty").hidden = runs.length > 0;
    document.getElementById("runs-table").dataset.rows = String(runs.length);
  }

  function runsPage(data) {
    renderRuns(data.runs);
    poll("/api/runs", data.refresh_ms, renderRuns, document.getElementById("live-note"));
  }

  function drawRun(charts) {
    rewardCurveChart(document.getElementById("reward-curve"), charts.curve);
    tokensChart(document.getElementById("tokens-chart"), charts.usage);
    latencyChart(document.getElementById("latency-chart"), charts.usage, charts.train_durations);
    metricCharts(document.getElementById("metric-charts"), charts.metrics);
  }

  function runPage(data) {
    drawRun(data.charts);
    const status = data.charts.summary.status;
    if (status !== "running" && status !== "stale") return;
    poll(data.api, data.refresh_ms, (charts) => {
      drawRun(charts);
      for (const element of document.querySelectorAll("[data-field]")) {
        const value = charts.summary[element.dataset.field];
        element.textContent = value === null || value === undefined ? "" : String(value);
        if (element.dataset.field === "status") element.className = `status status-${value}`;
      }
      return charts.summary.status === "running" || charts.summary.status === "stale";
    }, document.getElementById("live-note"));
  }

  // Rollouts with the same pair of rewards share one point, sized by how many they are.
  function pairPoints(pairs) {
    const byPair = new Map();
    for (const p of pairs) {
      const key = `${p.x} ${p.y}`;
      if (!byPair.has(key)) byPair.set(key, { x: p.x, y: p.y, rollout_ids: [] });
      byPair.get(key).rollout_ids.push(p.rollout_id);
    }
    return [...byPair.values()];
  }

  function showRollouts(ids) {
    const wanted = new Set(ids);
    let first = null;
    for (const row of document.querySelectorAll("#pairs-table tbody tr")) {
      const hit = wanted.has(row.dataset.rollout);
      row.classList.toggle("picked", hit);
      if (hit && !first) first = row;
    }
    if (first) first.scrollIntoView({ block: "center" });
  }

  function compareScorersPage(data) {
    const canvas = document.getElementById("scorer-scatter");
    const values = data.pairs.flatMap((p) => [p.x, p.y]);
    const low = values.length ? Math.min(...values) : 0;
    const high = values.length ? Math.max(...values) : 1;
    const radius = (context) => {
      const raw = context.raw;
      return raw && raw.rollout_ids ? 4 + 3 * Math.sqrt(raw.rollout_ids.length - 1) : 0;
    };
    const datasets = [
      { label: "policy rollouts", data: pairPoints(data.pairs.filter((p) => p.role !== "validation")), backgroundColor: alpha(COLORS[0], 0.6), pointRadius: radius },
      { label: "validation rollouts", data: pairPoints(data.pairs.filter((p) => p.role === "validation")), backgroundColor: alpha(COLORS[1], 0.6), pointRadius: radius },
      { label: "x = y", type: "line", data: [{ x: low, y: low }, { x: high, y: high }], borderColor: "#aab4c3", borderDash: [4, 4], pointRadius: 0 },
    ].filter((d) => d.data.length > 0);
    showEmpty(canvas, data.pairs.length === 0, "No rollout was scored by both scorers.");
    makeChart(canvas, {
      type: "scatter",
      data: { datasets },
      options: Object.assign({}, BASE_OPTIONS, {
        interaction: { mode: "nearest", intersect: true },
        scales: { x: titled(`${data.x} reward`), y: titled(`${data.y} reward`) },
        // One rollout: open its trajectory. Several: pick out their rows in the table.
        onClick: (event, elements, chart) => {
          const hit = elements.find((e) => chart.data.datasets[e.datasetIndex].data[e.index].rollout_ids);
          if (!hit) return;
          const ids = chart.data.datasets[hit.datasetIndex].data[hit.index].rollout_ids;
          if (ids.length === 1) window.location.href = "/trajectories/" + encodeURIComponent(ids[0]);
          else showRollouts(ids);
        },
        plugins: {
          tooltip: {
            callbacks: {
              label: (item) => {
                const ids = item.raw.rollout_ids;
                const who = !ids ? "" : ids.length === 1 ? ids[0].slice(0, 8) : `${ids.length} rollouts`;
                return `${who}: (${fmt(item.raw.x)}, ${fmt(item.raw.y)})`;
              },
            },
          },
        },
      }),
    });
  }

  function compareRunsPage(data) {
    const canvas = document.getElementById("runs-curve");
    if (!canvas) return;
    const datasets = data.compared.flatMap((c, i) =>
      bandDatasets(`${c.run} (${c.scorer})`, c.points, COLORS[i % COLORS.length]).map((d) => Object.assign(d, { run: c.run }))
    );
    showEmpty(canvas, data.compared.every((c) => c.points.length === 0), "No reward recorded in these runs.");
    makeChart(canvas, {
      type: "line",
      data: { datasets },
      options: Object.assign({}, BASE_OPTIONS, { scales: { x: linearX("policy step"), y: titled("reward") } }),
    });
  }

  // --- the feedback queue: keys to judge one rollout after another ----------------------

  function typingIn(target) {
    return target instanceof Element && target.closest("input, textarea, select, button, a[href]") !== null;
  }

  function queuePage() {
    const form = document.getElementById("queue-form");
    const skip = document.getElementById("queue-skip");
    const field = (id) => document.getElementById(id);
    if (form) {
      // Nothing to record: say so rather than answer with an error page.
      form.addEventListener("submit", (event) => {
        const given = ["queue-score", "queue-label", "queue-comment"].some((id) => field(id).value.trim());
        field("queue-note").hidden = given;
        if (!given) event.preventDefault();
      });
    }
    document.addEventListener("keydown", (event) => {
      if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
      if (typingIn(event.target)) {
        if (event.key === "Escape") event.target.blur();
        return; // Enter in a field submits its form, as any form's
      }
      const action = queueKey(event.key, form, skip, field);
      if (action) {
        event.preventDefault();
        action();
      }
    });
  }

  // What a key does outside the fields: a digit starts the score, l and c go to the label
  // and the comment, Enter records, s skips.
  function queueKey(key, form, skip, field) {
    if (key === "s" && skip) return () => skip.click();
    if (!form) return null;
    if (/^[0-9]$/.test(key)) {
      return () => {
        field("queue-score").value = key;
        field("queue-score").focus();
      };
    }
    if (key === "l") return () => field("queue-label").focus();
    if (key === "c") return () => field("queue-comment").focus();
    if (key === "Enter") return () => form.requestSubmit();
    return null;
  }

  const PAGES = {
    queue: queuePage,
    runs: runsPage,
    run: runPage,
    "compare-scorers": compareScorersPage,
    "compare-runs": compareRunsPage,
  };

  document.addEventListener("DOMContentLoaded", () => {
    const init = PAGES[document.body.dataset.page];
    if (init) init(pageData());
  });
})();
