// The session list: search and filter by id, status, workspace, last activity, parked
// calls and cost; forks, subagents and rewind branches under their parent.
import {get} from "./api.js";
import {el, fill, ago, time, usd} from "./dom.js";

const STATUSES = ["", "running", "waiting_approval", "interrupted", "completed", "failed",
  "cancelled", "step_limit", "abandoned", "new"];

export async function showSessions(main) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const search = el("input", {id: "search", type: "search", value: params.get("q") || "",
    placeholder: "id or workspace", autocomplete: "off"});
  const status = el("select", {id: "status-filter"},
    STATUSES.map((s) => el("option", {value: s}, s || "any")));
  status.value = params.get("status") || "";
  const active = el("select", {id: "active-filter"},
    [["", "any time"], ["3600", "last hour"], ["86400", "last day"], ["604800", "last week"]]
      .map(([v, label]) => el("option", {value: v}, label)));
  const parked = el("input", {id: "parked-filter", type: "checkbox"});
  const minCost = el("input", {id: "cost-filter", type: "number", min: "0", step: "0.0001",
    placeholder: "0", inputmode: "decimal"});
  const count = el("p", {class: "muted", role: "status", "aria-live": "polite"});
  const body = el("tbody");
  const table = el("table", {id: "sessions"},
    el("caption", {class: "sr"}, "Sessions"),
    el("thead", {}, el("tr", {}, ["Session", "Status", "Workspace", "Last activity", "Turns",
      "Parked", "Cost"].map((h, i) => el("th", {scope: "col", class: i >= 4 ? "num" : ""}, h)))),
    body);
  fill(main, el("h1", {}, "Sessions"),
    el("form", {class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); draw(); }},
      el("div", {}, el("label", {for: "search"}, "Search"), search),
      el("div", {}, el("label", {for: "status-filter"}, "Status"), status),
      el("div", {}, el("label", {for: "active-filter"}, "Active"), active),
      el("div", {}, el("label", {for: "cost-filter"}, "Cost at least (USD)"), minCost),
      el("div", {}, el("label", {for: "parked-filter"}, "Parked calls only"), parked),
      el("button", {type: "button", onclick: () => load()}, "Refresh")),
    count, table);
  let rows = [];
  let seen = "";
  async function load() {
    const found = (await get("/v1/console/sessions?limit=5000")).sessions;
    const key = JSON.stringify(found);
    if (key === seen) return;  // unchanged: keep the table (and the keyboard focus)
    seen = key;
    rows = found;
    draw();
  }
  function keep(r) {
    const q = search.value.trim().toLowerCase();
    if (q && !r.session_id.toLowerCase().includes(q) &&
        !(r.workspace || "").toLowerCase().includes(q) &&
        !(r.last_input || "").toLowerCase().includes(q)) return false;
    if (status.value && r.status !== status.value) return false;
    if (active.value && Date.now() * 1000 - r.last_activity_us > Number(active.value) * 1e6) return false;
    if (parked.checked && !r.parked) return false;
    const least = Number(minCost.value || 0) * 1e6;
    if (least && (r.cost_micro_usd === null || r.cost_micro_usd < least)) return false;
    return true;
  }
  function draw() {
    const shown = rows.filter(keep);
    const ids = new Set(shown.map((r) => r.session_id));
    const children = new Map();
    for (const r of shown) {
      const parent = r.parent && ids.has(r.parent) ? r.parent : null;
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(r);
    }
    const out = [];
    const walk = (parent, depth, seen) => {
      for (const r of children.get(parent) || []) {
        if (seen.has(r.session_id)) continue;
        seen.add(r.session_id);
        out.push(row(r, depth));
        walk(r.session_id, depth + 1, seen);
      }
    };
    walk(null, 0, new Set());
    fill(body, out);
    fill(count, shown.length + " of " + rows.length + " sessions");
  }
  for (const input of [search, minCost]) input.addEventListener("input", draw);
  for (const input of [status, active, parked]) input.addEventListener("change", draw);
  await load();
  const timer = setInterval(() => load().catch(() => {}), 5000);
  return () => clearInterval(timer);
}

function row(r, depth) {
  const link = el("a", {href: "#/session/" + encodeURIComponent(r.session_id)}, r.session_id);
  const tr = el("tr", {class: depth ? "child" : "",
    dataset: {sessionId: r.session_id, status: r.status}},
    el("td", {}, r.relation ? el("span", {class: "rel"}, r.relation + " of " + r.parent) : null,
      link, r.last_input ? el("div", {class: "muted"}, r.last_input.slice(0, 90)) : null),
    el("td", {}, el("span", {class: "status", dataset: {status: r.status}}, r.status)),
    el("td", {}, r.workspace || "—"),
    el("td", {title: time(r.last_activity_us)}, ago(r.last_activity_us)),
    el("td", {class: "num"}, String(r.turns)),
    el("td", {class: "num"}, String(r.parked)),
    el("td", {class: "num"}, usd(r.cost_micro_usd)));
  if (depth) tr.style.setProperty("--depth", String(depth));  // CSSOM: no inline style
  return tr;
}
