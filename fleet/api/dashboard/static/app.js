// fleetd dashboard: reads /v1/status, /v1/fleets/{name}, /v1/projects,
// /v1/queue and /v1/events with the token and follows /v1/events/stream (Server-Sent Events read
// through fetch, so the token travels in the Authorization header, never in
// a URL). Plain DOM and inline SVG; no dependencies, no build step.
"use strict";

(function () {
  const TOKEN_KEY = "fleetd.token";
  const STATES = ["running", "joined", "booting", "provisioning", "requested", "draining", "terminating", "failed"];
  const LIVE_COST = new Set(["provisioning", "booting", "joined", "running", "draining", "terminating"]);
  const MAX_SAMPLES = 2000;
  const MAX_EVENTS_SHOWN = 150;
  const HISTORY_EVENTS = 1000;
  const REFRESH_MIN_GAP_MS = 400;
  const PERIODIC_REFRESH_MS = 5000;

  const app = {
    token: "",
    status: null,
    projects: null,    // GET /v1/projects
    queue: null,       // GET /v1/queue
    selected: "",
    detail: null,
    samples: {},       // fleet → [{t, counts: {state: n}, cost}]
    notices: {},       // fleet → Map(seq → {seq, t, node, kind, source})
    events: [],        // newest last
    lastSeq: 0,
    refreshTimer: null,
    lastRefresh: 0,
    streamAbort: null,
  };

  // ---------- small DOM helpers ----------
  const $ = (id) => document.getElementById(id);
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  const SVGNS = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const usd = (v) => "$" + (v || 0).toFixed(2);
  const usdh = (v) => "$" + (v || 0).toFixed(2) + "/h";
  function dur(sec) {
    sec = Math.max(0, sec);
    if (sec < 60) return sec.toFixed(sec < 10 ? 1 : 0) + "s";
    if (sec < 3600) return Math.floor(sec / 60) + "m" + String(Math.floor(sec % 60)).padStart(2, "0") + "s";
    if (sec < 172800) return Math.floor(sec / 3600) + "h" + String(Math.floor((sec % 3600) / 60)).padStart(2, "0") + "m";
    return Math.floor(sec / 86400) + "d";
  }
  const clock = (t) => new Date(t).toLocaleTimeString([], { hour12: false });
  function rate(v) {
    v = v || 0;
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (v >= 10) return v.toFixed(0);
    return v.toFixed(2);
  }
  // A heartbeat comes every second or so: tenths under ten seconds.
  const hbAge = (sec) => (sec < 10 ? Math.max(0, sec).toFixed(1) + "s" : dur(sec));
  function progressText(t) {
    if (!t) return "–";
    if (t.source === "round-timing") return "no reports";
    let s = String(t.step) + (t.total_steps ? " / " + t.total_steps : "");
    if (t.samples_per_second) s += " · " + rate(t.samples_per_second) + "/s";
    if (t.eta_seconds) s += " · ETA " + dur(t.eta_seconds);
    return s;
  }

  // ---------- token ----------
  function takeToken() {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
      // Keep the token out of the address bar and history.
      history.replaceState(null, "", location.pathname + location.search);
    }
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }
  function showLogin(msg) {
    if (app.streamAbort) app.streamAbort.abort();
    $("main").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").hidden = !msg;
    $("login-error").textContent = msg || "";
    setConn("off", "offline");
  }

  // ---------- API ----------
  class AuthError extends Error {}
  async function api(path) {
    const resp = await fetch(path, { headers: { Authorization: "Bearer " + app.token }, cache: "no-store" });
    if (resp.status === 401) throw new AuthError("the daemon rejected the token");
    if (!resp.ok) {
      let msg = "HTTP " + resp.status;
      try { msg = (await resp.json()).error || msg; } catch (_) { /* not JSON */ }
      throw new Error(path + ": " + msg);
    }
    return resp.json();
  }

  function setConn(kind, text) {
    const c = $("conn");
    c.className = "conn conn-" + kind;
    c.textContent = text;
  }

  // ---------- history from the event log ----------
  // Rebuild each fleet's nodes-by-state and cost history by undoing the
  // recent node transitions from the nodes' current states.
  function seedHistory(fleetDetails, events) {
    for (const det of fleetDetails) {
      const nodes = new Map();
      for (const n of det.nodes) nodes.set(n.id, { state: n.state, price: n.price_per_hour });
      const out = [];
      const snap = (t) => {
        const counts = {};
        let cost = 0;
        for (const n of nodes.values()) {
          counts[n.state] = (counts[n.state] || 0) + 1;
          if (LIVE_COST.has(n.state)) cost += n.price || 0;
        }
        out.push({ t, counts, cost });
      };
      snap(Date.now());
      const trans = events.filter((e) => e.fleet === det.name && e.type === "node.transition" && e.node && e.data);
      for (let i = trans.length - 1; i >= 0; i--) {
        const e = trans[i];
        const t = Date.parse(e.time);
        snap(t); // the state right after e
        const n = nodes.get(e.node) || { state: e.data.to, price: 0 };
        if (!e.data.from) nodes.delete(e.node);
        else nodes.set(e.node, { state: e.data.from, price: n.price });
        if (i === 0) snap(t - 1); // the state right before the oldest one
      }
      out.reverse();
      app.samples[det.name] = out.slice(-MAX_SAMPLES);
    }
  }

  function addSample(f) {
    const s = app.samples[f.name] || (app.samples[f.name] = []);
    s.push({ t: Date.now(), counts: Object.assign({}, f.nodes_by_state), cost: f.cost_per_hour });
    if (s.length > MAX_SAMPLES) s.splice(0, s.length - MAX_SAMPLES);
  }

  function noteNotice(fleet, n) {
    const m = app.notices[fleet] || (app.notices[fleet] = new Map());
    m.set(n.seq, n);
  }

  // ---------- refresh ----------
  function scheduleRefresh() {
    if (app.refreshTimer) return;
    const wait = Math.max(0, app.lastRefresh + REFRESH_MIN_GAP_MS - Date.now());
    app.refreshTimer = setTimeout(() => { app.refreshTimer = null; refresh().catch(fail); }, wait);
  }

  async function refresh() {
    app.lastRefresh = Date.now();
    const [st, projects, queue] = await Promise.all([api("/v1/status"), api("/v1/projects"), api("/v1/queue")]);
    app.status = st;
    app.projects = projects;
    app.queue = queue;
    for (const f of st.fleets) addSample(f);
    if (!app.selected || !st.fleets.some((f) => f.name === app.selected)) {
      app.selected = st.fleets.length ? st.fleets[0].name : "";
    }
    app.detail = app.selected ? await api("/v1/fleets/" + encodeURIComponent(app.selected)) : null;
    if (app.detail) for (const i of app.detail.recent_interruptions || []) {
      noteNotice(app.detail.name, { seq: i.seq, t: Date.parse(i.at), node: i.node, kind: i.kind, source: i.source });
    }
    render();
  }

  function fail(err) {
    if (err instanceof AuthError) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(err.message);
      return;
    }
    console.error(err);
    setConn("wait", "error: " + err.message);
  }

  // ---------- event stream ----------
  function onEvent(e) {
    if (e.seq <= app.lastSeq) return;
    app.lastSeq = e.seq;
    app.events.push(e);
    if (app.events.length > HISTORY_EVENTS) app.events.splice(0, app.events.length - HISTORY_EVENTS);
    if (e.type === "notice" && e.fleet) {
      noteNotice(e.fleet, { seq: e.seq, t: Date.parse(e.time), node: e.node, kind: (e.data || {}).kind, source: (e.data || {}).source });
    }
  }

  function parseFrame(frame) {
    let id = "", type = "message", data = "";
    for (const line of frame.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let val = i < 0 ? "" : line.slice(i + 1);
      if (val.startsWith(" ")) val = val.slice(1);
      if (field === "id") id = val;
      else if (field === "event") type = val;
      else if (field === "data") data += (data ? "\n" : "") + val;
    }
    return { id, type, data };
  }

  async function follow() {
    for (let attempt = 0; ; attempt++) {
      const ctl = new AbortController();
      app.streamAbort = ctl;
      try {
        const resp = await fetch("/v1/events/stream?since=" + app.lastSeq, {
          headers: { Authorization: "Bearer " + app.token, Accept: "text/event-stream" },
          cache: "no-store", signal: ctl.signal,
        });
        if (resp.status === 401) throw new AuthError("the daemon rejected the token");
        if (!resp.ok || !resp.body) throw new Error("event stream: HTTP " + resp.status);
        setConn("live", "live");
        attempt = 0;
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, "\n");
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const fr = parseFrame(buf.slice(0, cut));
            buf = buf.slice(cut + 2);
            if (!fr.data) continue;
            if (fr.type === "error") throw new Error(JSON.parse(fr.data).error);
            onEvent(JSON.parse(fr.data));
            renderEvents();
            scheduleRefresh();
          }
        }
      } catch (err) {
        if (err instanceof AuthError) { fail(err); return; }
        if (ctl.signal.aborted) return;
        console.warn("event stream:", err);
      }
      setConn("wait", "reconnecting");
      await new Promise((r) => setTimeout(r, Math.min(10000, 1000 * (attempt + 1))));
    }
  }

  // ---------- rendering ----------
  function render() {
    const st = app.status;
    if (!st) return;
    $("daemon").textContent = `${st.daemon_id} · ${st.version} · api ${st.api_version}`;
    renderFleets(st.fleets);
    renderProjects(app.projects, app.queue);
    renderDetail(app.detail);
    renderEvents();
  }

  function stateSummary(counts) {
    const span = el("span");
    for (const s of STATES.concat(["terminated"])) {
      if (!counts[s]) continue;
      span.append(el("span", { class: "state state-" + s, title: s }, `${s} ${counts[s]}`), " ");
    }
    return span;
  }

  function renderFleets(fleets) {
    $("no-fleets").hidden = fleets.length > 0;
    const tb = $("fleets").tBodies[0];
    tb.replaceChildren();
    for (const f of fleets) {
      const rdv = f.rendezvous;
      const tr = el("tr", { "data-fleet": f.name, class: f.name === app.selected ? "selected" : "" },
        el("td", {}, el("b", {}, f.name), f.destroying ? " (destroying)" : "", f.completed ? (f.succeeded ? " (done)" : " (failed)") : ""),
        el("td", {}, `${f.nodes_by_state.running || 0} / ${f.target_nodes}`),
        el("td", {}, stateSummary(f.nodes_by_state)),
        el("td", {}, rdv ? `${rdv.round} (${rdv.state})` : "–"),
        el("td", {}, rdv ? String(rdv.world_size) : "–"),
        el("td", { class: "fleet-progress" }, progressText(f.training)),
        el("td", {}, usdh(f.cost_per_hour)),
        el("td", {}, usd(f.spend_usd)),
        el("td", {}, usd(f.savings_usd)),
        el("td", { class: "fleet-interruptions" }, String(f.interruptions || 0)),
        el("td", {}, String(f.alert_count || 0)));
      tr.addEventListener("click", () => { app.selected = f.name; refresh().catch(fail); });
      tb.append(tr);
    }
  }

  // The projects view (docs/projects.md): quota, borrowed and lent GPUs,
  // spend against the budget with its burn rate and when it runs out, and
  // the queue in start order with each fleet's reason.
  function renderProjects(pr, q) {
    const declared = pr ? pr.projects.filter((p) => !p.unlimited) : [];
    const waiting = q ? q.queue : [];
    const shown = pr ? pr.projects.filter((p) => !p.unlimited || p.fleets.length || p.budget) : [];
    $("no-projects").hidden = declared.length > 0;
    $("projects").hidden = shown.length === 0;
    $("pool").textContent = declared.length ? `— pool ${pr.used_gpus} of ${pr.pool_gpus} GPUs allocated` : "";
    const tb = $("projects").tBodies[0];
    tb.replaceChildren();
    for (const p of shown) {
      const b = p.budget;
      let spend = "–", burn = "–", out = "–", state = el("span", { class: "muted" }, "none");
      if (b) {
        const limit = b.total_limit || 0;
        const frac = limit > 0 ? Math.min(1, b.spent_usd / limit) : 0;
        spend = el("span", { class: "budget-" + b.state },
          limit > 0 ? el("span", { class: "budget-bar", title: Math.round(frac * 100) + "% spent" }, el("i", {})) : "",
          usd(b.spent_usd) + (limit > 0 ? " of " + usd(limit) : ""));
        if (limit > 0) spend.querySelector(".budget-bar i").style.width = (frac * 100).toFixed(1) + "%";
        burn = usdh(b.burn_per_hour) + (b.per_hour_limit ? " (cap " + usdh(b.per_hour_limit) + ")" : "");
        if (b.exhausts_at) out = dur((Date.parse(b.exhausts_at) - Date.parse(app.status.time)) / 1000);
        else if (b.state === "exhausted") out = "spent";
        state = el("span", { class: "budget-state budget-" + b.state, title: b.reason }, b.state);
      }
      const dashIf = (v) => (p.unlimited ? "–" : String(v));
      tb.append(el("tr", { "data-project": p.name },
        el("td", {}, el("b", {}, p.name), p.priority ? el("span", { class: "muted" }, " prio " + p.priority) : ""),
        el("td", { class: "project-quota" }, dashIf(p.quota_gpus)), el("td", {}, dashIf(p.max_gpus)),
        el("td", { class: "project-used" }, String(p.used_gpus)),
        el("td", { class: "project-borrowed" }, dashIf(p.borrowed_gpus)), el("td", { class: "project-lent" }, dashIf(p.lent_gpus)),
        el("td", { class: "project-spend" }, spend), el("td", { class: "project-burn" }, burn), el("td", {}, out),
        el("td", { class: "project-budget" }, state), el("td", {}, String(p.queued)),
        el("td", {}, p.fleets.length ? p.fleets.join(", ") : "–"),
        el("td", { class: "muted" }, p.unlimited ? "default" : p.source === "api" ? "admin" : "daemon.hcl")));
    }
    $("no-queue").hidden = waiting.length > 0;
    $("queue").hidden = waiting.length === 0;
    const qb = $("queue").tBodies[0];
    qb.replaceChildren();
    const now = Date.parse(app.status.time);
    for (const e of waiting) {
      qb.append(el("tr", { "data-fleet": e.fleet, "data-position": String(e.position) },
        el("td", {}, String(e.position) + (e.reserved ? " (reserved)" : "")), el("td", {}, el("b", {}, e.fleet)),
        el("td", {}, e.project), el("td", {}, String(e.priority)), el("td", {}, dur((now - Date.parse(e.since)) / 1000)),
        el("td", { class: "msg queue-reason" }, e.reason)));
    }
  }

  function renderDetail(d) {
    $("detail").hidden = !d;
    if (!d) return;
    $("fleet-name").textContent = d.name;
    const badge = $("fleet-badge");
    badge.hidden = !(d.destroying || d.completed);
    badge.textContent = d.destroying ? "destroying" : d.completed ? (d.succeeded ? "job succeeded" : "job failed") : "";
    const rdv = d.rendezvous;
    $("kpi-running").textContent = `${d.nodes_by_state.running || 0} / ${d.target_nodes}`;
    $("kpi-round").textContent = rdv ? `${rdv.round} ${rdv.state}` : "none yet";
    $("kpi-world").textContent = rdv ? String(rdv.world_size) : "–";
    $("kpi-rate").textContent = usdh(d.cost_per_hour);
    $("kpi-spend").textContent = usd(d.spend_usd);
    const pct = d.on_demand_equivalent_usd > 0 ? ` (${Math.round((100 * d.savings_usd) / d.on_demand_equivalent_usd)}%)` : "";
    $("kpi-savings").textContent = usd(d.savings_usd) + pct;
    $("kpi-interruptions").textContent = String(d.interruptions || 0);
    renderTraining(d);
    renderCheckpoint(d);
    const a = d.allocation;
    $("allocation").hidden = !a;
    if (a) {
      const what = a.action === "queue" ? `queued #${a.queue_position || "?"}` : `${a.action} ${a.target} nodes`;
      $("allocation-explain").textContent = `${a.project}: ${what} (${a.kind}) — ${a.reason}`;
    }

    const al = $("alerts");
    al.replaceChildren();
    for (const a of d.alerts || []) al.append(el("li", { "data-kind": a.kind }, el("b", {}, a.kind), a.message));

    const nb = $("nodes").tBodies[0];
    nb.replaceChildren();
    const nodes = (d.nodes || []).slice().sort((a, b) => (a.state === "terminated") - (b.state === "terminated") || a.id.localeCompare(b.id));
    for (const n of nodes) {
      const hb = n.last_heartbeat ? hbAge((Date.parse(app.status.time) - Date.parse(n.last_heartbeat)) / 1000) + " ago" : "–";
      const round = n.round ? String(n.round) : n.rendezvous_state || "–";
      nb.append(el("tr", { "data-node": n.id, "data-state": n.state },
        el("td", {}, n.id), el("td", {}, el("span", { class: "state state-" + n.state }, n.state)),
        el("td", { class: "node-instance mono" }, n.instance_id || "–"), el("td", { class: "node-address mono" }, n.address || "–"),
        el("td", {}, n.provider), el("td", {}, n.zone || n.region), el("td", {}, n.instance_type),
        el("td", {}, n.capacity_type), el("td", {}, (n.price_per_hour || 0).toFixed(3)),
        el("td", {}, dur(n.age_seconds)), el("td", { class: "node-round" }, round), el("td", { class: "node-heartbeat" }, hb),
        el("td", { class: "msg" }, n.reason || "")));
    }

    const rb = $("recoveries").tBodies[0];
    rb.replaceChildren();
    const recs = (d.recoveries || []).slice().reverse();
    $("no-recoveries").hidden = recs.length > 0;
    $("recoveries").hidden = recs.length === 0;
    for (const r of recs) {
      rb.append(el("tr", { "data-kind": r.kind }, el("td", {}, clock(r.at)), el("td", {}, r.kind), el("td", {}, r.node || "–"),
        el("td", {}, r.duration_seconds.toFixed(2) + "s"), el("td", {}, r.lost_steps === undefined ? "–" : String(r.lost_steps))));
    }
    renderCharts(d.name);
  }

  // The training KPIs, the size explanation and the round-timing note.
  // renderCheckpoint shows training.checkpoint's store (docs/checkpoints.md):
  // the newest checkpoint in it, transfers, the last restore, a failure.
  function renderCheckpoint(d) {
    const c = d.checkpoint;
    $("checkpoint").hidden = !c;
    if (!c) return;
    const gib = (b) => b >= 1073741824 ? (b / 1073741824).toFixed(2) + " GiB" : b >= 1048576 ? (b / 1048576).toFixed(1) + " MiB"
      : b >= 1024 ? (b / 1024).toFixed(1) + " KiB" : b + " B";
    const rate = (r) => (r >= 10 ? r.toFixed(0) : r.toPrecision(2)) + " MiB/s";
    const parts = [c.store ? `${c.dir} → ${c.store} (${c.access})` : `${c.dir} (on the nodes only)`];
    parts.push(c.last_step >= 0 ? `step ${c.last_step}, ${gib(c.bytes || 0)}, ${dur(c.age_seconds || 0)} old` : "none in the store yet");
    if (c.upload_mib_per_s) parts.push(`upload ${rate(c.upload_mib_per_s)}`);
    if (c.restore_mib_per_s) parts.push(`restore ${rate(c.restore_mib_per_s)}`);
    for (const [what, t] of [["uploading", c.uploading], ["restoring", c.restoring]]) {
      if (t) parts.push(`${what} step ${t.step} on ${t.node}: ${gib(t.done_bytes)} of ${gib(t.total_bytes)}`);
    }
    if (c.error) parts.push(`failing (${c.error_kind} on ${c.error_node}): ${c.error}`);
    // What placement charges a move away from the store (egress to every
    // node, restore time): why the job prefers to stay near its checkpoint.
    if (c.moves && c.moves.length) {
      const to = (m) => m.to.endsWith(":*") ? "another " + m.to.slice(0, -2) + " region" : m.to;
      parts.push("a move costs " + c.moves.map((m) => `${to(m)} $${m.egress_usd.toFixed(2)} ($${m.egress_per_gb.toFixed(3)}/GB)`).join(", ") +
        `, restore ≈ ${dur(c.moves[0].restore_seconds)} per node (egress prices as of ${c.moves[0].as_of})`);
    }
    $("checkpoint-explain").textContent = parts.join("; ");
    $("checkpoint").dataset.failing = c.error ? "1" : "0";
  }

  function renderTraining(d) {
    const t = d.training;
    const rep = t && t.source === "reports";
    $("kpi-step").textContent = rep ? String(t.step) + (t.total_steps ? " / " + t.total_steps : "") : "–";
    $("kpi-throughput").textContent = rep ? rate(t.samples_per_second) + " samples/s" : "–";
    $("kpi-loss").textContent = rep && t.loss !== undefined ? Number(t.loss).toPrecision(4) : "–";
    $("kpi-eta").textContent = rep && t.eta ? dur(t.eta_seconds) + " (" + clock(t.eta) + ")" : "–";
    const note = $("training-note");
    note.hidden = !(t && t.note);
    note.textContent = t && t.note ? t.note : "";
    const sc = d.scaling;
    $("scaling").hidden = !sc;
    if (sc) {
      $("scaling-explain").textContent = sc.explain;
      $("scaling-policy").textContent = `(scale = ${sc.policy}${sc.reason !== sc.policy ? ", " + sc.reason : ""})`;
      $("scaling").setAttribute("data-reason", sc.reason);
      $("scaling").setAttribute("data-target", String(sc.target));
    }
  }

  function chartFrame(svg) {
    const W = Math.max(200, Math.round(svg.clientWidth || 640));
    const H = Math.max(50, Math.round(svg.clientHeight || 200));
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.replaceChildren();
    return { W, H };
  }

  function timeRange(samples, notices) {
    const now = Date.now();
    let t0 = samples.length ? samples[0].t : now;
    for (const n of notices) t0 = Math.min(t0, n.t);
    t0 = Math.min(t0, now - 30000); // at least half a minute wide
    return [t0, now];
  }

  function renderCharts(fleet) {
    const samples = app.samples[fleet] || [];
    const notices = Array.from((app.notices[fleet] || new Map()).values()).sort((a, b) => a.seq - b.seq);
    const [t0, t1] = timeRange(samples, notices);
    renderNodesChart($("chart-nodes"), samples, notices, t0, t1);
    renderCostChart($("chart-cost"), samples, t0, t1);
    renderTimeline($("chart-interruptions"), notices, t0, t1);
    renderThroughput($("chart-throughput"), (app.detail && app.detail.training && app.detail.training.history) || [], notices);
    const lg = $("legend-nodes");
    lg.replaceChildren();
    for (const s of STATES) lg.append(el("span", {}, el("i", { class: "bg-" + s }), s));
  }

  const PAD = { l: 34, r: 8, t: 8, b: 18 };

  function axes(svg, W, H, t0, t1, ymax, fmt) {
    const x = (t) => PAD.l + ((t - t0) / Math.max(1, t1 - t0)) * (W - PAD.l - PAD.r);
    const y = (v) => H - PAD.b - (v / Math.max(ymax, 1e-9)) * (H - PAD.t - PAD.b);
    for (const frac of [0, 0.5, 1]) {
      const v = ymax * frac;
      svg.append(svgEl("line", { class: "grid-line", x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v) }));
      svg.append(svgEl("text", { class: "tick", x: PAD.l - 4, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
    }
    svg.append(svgEl("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }));
    svg.append(svgEl("text", { class: "tick", x: PAD.l, y: H - 4 }, clock(t0)));
    svg.append(svgEl("text", { class: "tick", x: W - PAD.r, y: H - 4, "text-anchor": "end" }, clock(t1)));
    return { x, y };
  }

  // Samples hold until the next one (step-after), the last one until now.
  function steps(samples, t1, value) {
    const pts = [];
    samples.forEach((s, i) => {
      const tn = i + 1 < samples.length ? samples[i + 1].t : t1;
      const v = value(s);
      pts.push([s.t, v], [tn, v]);
    });
    return pts;
  }

  function renderNodesChart(svg, samples, notices, t0, t1) {
    const { W, H } = chartFrame(svg);
    if (!samples.length) {
      svg.append(svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
      return;
    }
    let ymax = 1;
    for (const s of samples) {
      let tot = 0;
      for (const st of STATES) tot += s.counts[st] || 0;
      ymax = Math.max(ymax, tot);
    }
    const { x, y } = axes(svg, W, H, t0, t1, ymax, (v) => (Number.isInteger(v) ? String(v) : ""));
    let below = samples.map(() => 0);
    for (const st of STATES) {
      const top = samples.map((s, i) => below[i] + (s.counts[st] || 0));
      if (top.every((v, i) => v === below[i])) { below = top; continue; }
      const upper = steps(samples.map((s, i) => ({ t: s.t, v: top[i] })), t1, (s) => s.v);
      const lower = steps(samples.map((s, i) => ({ t: s.t, v: below[i] })), t1, (s) => s.v).reverse();
      const d = upper.concat(lower).map(([t, v], i) => (i ? "L" : "M") + x(t).toFixed(1) + "," + y(v).toFixed(1)).join("") + "Z";
      svg.append(svgEl("path", { d, class: "fill-" + st, "data-state": st }));
      below = top;
    }
    for (const n of notices) {
      if (n.t < t0) continue;
      svg.append(svgEl("line", { class: "intr-line", x1: x(n.t), x2: x(n.t), y1: PAD.t, y2: H - PAD.b }));
    }
  }

  function renderCostChart(svg, samples, t0, t1) {
    const { W, H } = chartFrame(svg);
    if (!samples.length) {
      svg.append(svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
      return;
    }
    const ymax = Math.max(0.01, ...samples.map((s) => s.cost || 0)) * 1.15;
    const { x, y } = axes(svg, W, H, t0, t1, ymax, (v) => "$" + v.toFixed(2));
    const pts = steps(samples, t1, (s) => s.cost || 0);
    const line = pts.map(([t, v], i) => (i ? "L" : "M") + x(t).toFixed(1) + "," + y(v).toFixed(1)).join("");
    const first = pts[0], last = pts[pts.length - 1];
    svg.append(svgEl("path", { class: "cost-area", d: line + `L${x(last[0]).toFixed(1)},${y(0)}L${x(first[0]).toFixed(1)},${y(0)}Z` }));
    svg.append(svgEl("path", { class: "cost-line", d: line }));
  }

  // Throughput over time from the workers' progress reports, with the
  // world-size changes (dashed lines, "→ N") and the interruptions (red)
  // marked. The SVG's data-* attributes count what it shows.
  function renderThroughput(svg, hist, notices) {
    const { W, H } = chartFrame(svg);
    const pts = hist.map((p) => ({ t: Date.parse(p.at), v: p.samples_per_second || 0, ws: p.world_size, round: p.round }));
    svg.setAttribute("data-points", String(pts.length));
    if (!pts.length) {
      svg.setAttribute("data-world-changes", "0");
      svg.setAttribute("data-interruptions", "0");
      svg.append(svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no progress reports yet (FLEETD_PROGRESS)"));
      return;
    }
    const t1 = Date.now();
    const t0 = Math.min(pts[0].t, t1 - 30000);
    const ymax = Math.max(1e-9, ...pts.map((p) => p.v)) * 1.15;
    const { x, y } = axes(svg, W, H, t0, t1, ymax, (v) => rate(v));
    const line = pts.map((p, i) => (i ? "L" : "M") + x(p.t).toFixed(1) + "," + y(p.v).toFixed(1)).join("");
    svg.append(svgEl("path", { class: "tp-area", d: line + `L${x(pts[pts.length - 1].t).toFixed(1)},${y(0)}L${x(pts[0].t).toFixed(1)},${y(0)}Z` }));
    svg.append(svgEl("path", { class: "tp-line", d: line }));
    let changes = 0;
    let lastLabel = -1e9;
    for (let i = 0; i < pts.length; i++) {
      const p = pts[i];
      const changed = i === 0 || p.ws !== pts[i - 1].ws;
      if (!changed) continue;
      if (i > 0) changes++;
      const cx = x(p.t);
      const g = svgEl("g", { class: "ws-change", "data-world-size": String(p.ws), "data-round": String(p.round) });
      g.append(svgEl("title", {}, `${clock(p.t)} round ${p.round}: world size ${p.ws}`));
      g.append(svgEl("line", { class: "ws-line", x1: cx, x2: cx, y1: PAD.t, y2: H - PAD.b }));
      if (cx - lastLabel > 60) {
        g.append(svgEl("text", { class: "ws-label", x: cx + 3, y: PAD.t + 10 }, (i ? "→ " : "") + "world " + p.ws));
        lastLabel = cx;
      }
      svg.append(g);
    }
    let shown = 0;
    for (const n of notices) {
      if (n.t < t0) continue;
      shown++;
      const g = svgEl("g", { class: "intr", "data-node": n.node || "" });
      g.append(svgEl("title", {}, `${clock(n.t)} ${n.kind} on ${n.node}`));
      g.append(svgEl("line", { class: "intr-line", x1: x(n.t), x2: x(n.t), y1: PAD.t, y2: H - PAD.b }));
      svg.append(g);
    }
    svg.setAttribute("data-world-changes", String(changes));
    svg.setAttribute("data-interruptions", String(shown));
  }

  function renderTimeline(svg, notices, t0, t1) {
    const { W, H } = chartFrame(svg);
    svg.setAttribute("data-count", String(notices.length));
    $("timeline-count").textContent = notices.length ? `(${notices.length} notice${notices.length === 1 ? "" : "s"})` : "(none)";
    const x = (t) => PAD.l + ((t - t0) / Math.max(1, t1 - t0)) * (W - PAD.l - PAD.r);
    const mid = H / 2 - 6;
    svg.append(svgEl("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: mid, y2: mid }));
    svg.append(svgEl("text", { class: "tick", x: PAD.l, y: H - 4 }, clock(t0)));
    svg.append(svgEl("text", { class: "tick", x: W - PAD.r, y: H - 4, "text-anchor": "end" }, clock(t1)));
    if (!notices.length) {
      svg.append(svgEl("text", { class: "empty", x: W / 2, y: mid - 8, "text-anchor": "middle" }, "no interruptions"));
      return;
    }
    let lastLabel = -1e9;
    for (const n of notices) {
      const cx = Math.max(PAD.l, x(n.t));
      const g = svgEl("g", { class: "intr", "data-node": n.node || "", "data-kind": n.kind || "" });
      g.append(svgEl("title", {}, `${clock(n.t)} ${n.kind} on ${n.node} (from ${n.source})`));
      g.append(svgEl("path", { class: "intr-mark" + (n.kind === "rebalance" ? " soft" : ""), d: `M${cx},${mid - 7}L${cx + 6},${mid + 5}L${cx - 6},${mid + 5}Z` }));
      if (cx - lastLabel > 120) {
        // Near the right edge the label goes to the left of its mark.
        const right = cx > W - 220;
        g.append(svgEl("text", { class: "intr-label", x: right ? cx - 9 : cx + 9, y: mid - 4, "text-anchor": right ? "end" : "start" }, `${n.node} ${n.kind}`));
        lastLabel = cx;
      }
      svg.append(g);
    }
  }

  function renderEvents() {
    const tb = $("events").tBodies[0];
    tb.replaceChildren();
    const shown = app.events.slice(-MAX_EVENTS_SHOWN).reverse();
    for (const e of shown) {
      const who = (e.fleet || "–") + (e.node ? "/" + e.node : "");
      tb.append(el("tr", { class: "ev-" + e.type.replace(/[^a-z0-9_-]/gi, "-"), "data-seq": String(e.seq) },
        el("td", {}, String(e.seq)), el("td", {}, clock(e.time)), el("td", {}, e.type), el("td", {}, who), el("td", { class: "msg" }, e.message)));
    }
  }

  // ---------- start ----------
  async function start() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("logout").hidden = false;
    setConn("wait", "connecting");
    const st = await api("/v1/status");
    app.status = st;
    // Recent history seeds the charts, the timeline and the event list.
    const since = Math.max(0, st.last_event_seq - HISTORY_EVENTS);
    const evs = await api(`/v1/events?since=${since}&limit=${HISTORY_EVENTS}`);
    for (const e of evs.events) onEvent(e);
    app.lastSeq = Math.max(app.lastSeq, evs.next);
    const details = [];
    for (const f of st.fleets) details.push(await api("/v1/fleets/" + encodeURIComponent(f.name)));
    seedHistory(details, app.events);
    await refresh();
    follow();
    setInterval(() => { if (!$("main").hidden) scheduleRefresh(); }, PERIODIC_REFRESH_MS);
    window.addEventListener("resize", () => { if (app.detail) renderCharts(app.detail.name); });
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = $("token-input").value.trim();
      if (!v) return;
      sessionStorage.setItem(TOKEN_KEY, v);
      app.token = v;
      $("token-input").value = "";
      start().catch(fail);
    });
    $("logout").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      app.token = "";
      showLogin("");
    });
    app.token = takeToken();
    if (!app.token) { showLogin(""); return; }
    start().catch(fail);
  });
})();
