// One session: its timeline (live), usage and cost, and what a person can do to it:
// steer, queue, cancel, switch mode, answer approvals, recover an interrupted turn
// (decide, resume, abandon), fork and rewind from any offset.
import {get, post, call, sessionPath} from "./api.js";
import {el, fill, toggler} from "./dom.js";
import {Timeline, showUsage, KINDS} from "./timeline.js";
import {decideButtons} from "./approvals.js";

// what the last action said, kept across the page's reload after a rewind
let carried = null;

export async function showSession(main, sessionId) {
  // a log the runtime cannot fold (damaged, inconsistent) still shows its facts: the
  // session's state is then an error, said at the top, and the timeline is read as it is
  const failedWith = (err) => ({failure: err});
  const info = await get(sessionPath(sessionId)).catch((err) => {
    if (err.status === 401 || err.status === 403 || err.status === 404) throw err;
    return failedWith(err);
  });
  // a rewound session goes on in its current branch: its facts are read from there
  const logId = info.branch || sessionId;
  const api = sessionPath(sessionId);
  const say = el("p", {id: "action-status", role: "status", "aria-live": "polite"});
  const done = (text) => fill(say, text);
  const failed = (err) => {
    fill(say, el("span", {class: "error"}, (err.code || "error") + ": " + err.message +
      (err.hint ? " — " + err.hint : "")));
  };
  // a sent message or a resume runs in the background: say how it ended, a failure too
  // (in a line of its own: the action line is the next action's)
  const runSay = el("p", {id: "run-status", role: "status", "aria-live": "polite"});
  const watch = async (what, accepted) => {
    const id = accepted && accepted.message ? accepted.message.id : null;
    if (id === null) return accepted;
    for (let i = 0; i < 600; i++) {
      const m = await get(api + "/messages/" + id);
      if (m.status === "failed") {
        const err = (m.result && m.result.error) || {};
        fill(runSay, el("span", {class: "error"}, (err.code || "error") + ": " + what + " failed: " +
          err.message + (err.hint ? " — " + err.hint : "")));
        return accepted;
      }
      if (m.status === "done") {
        fill(runSay, what + ": " + ((m.result && m.result.status) || "done"));
        return accepted;
      }
      fill(runSay, what + ": " + m.status);
      await new Promise((r) => setTimeout(r, 500));
    }
    return accepted;
  };
  const act = async (what, fn) => {
    try {
      done(what + "…");
      const out = await fn();
      done(what + ": done");
      await refresh();
      return out;
    } catch (err) {
      failed(err);
      return null;
    }
  };

  const head = el("div", {class: "row"});
  const totals = el("span", {class: "usage", id: "session-usage"});
  const timelineRoot = el("div", {id: "timeline", class: "facts"});
  const inherited = el("section", {id: "inherited", "aria-label": "shared history"});
  const recovery = el("section", {class: "panel", id: "recovery", "aria-labelledby": "recovery-h"});
  const queueList = el("ul", {id: "queue-list"});

  const timeline = new Timeline(timelineRoot, logId, {
    fork: (offset) => fork(offset),
    rewind: (offset) => rewind(offset),
    decide: (callId, after) => decideButtons(sessionId, callId, () => { after(); refresh(); }),
  });

  async function fork(offset) {
    const made = await act("fork at offset " + offset, () =>
      post(api + "/fork", offset ? {at: offset} : {}));
    if (made) {
      fill(say, "forked: ", el("a", {href: "#/session/" + encodeURIComponent(made.session_id),
        id: "fork-link"}, made.session_id), " shares [0, " + made.high_water + ")");
    }
  }
  async function rewind(offset) {
    const made = await act("rewind to offset " + offset, () =>
      post(api + "/rewind", {point: {kind: "offset", offset}}));
    if (made) {
      // the session goes on in the new branch: show it (this page, read again)
      carried = "rewound: the session goes on in " + made.branch + " (the branch left behind, " +
        made.source + ", stays: rewind to it to undo)";
      window.dispatchEvent(new HashChangeEvent("hashchange"));
    }
  }

  // ---------------------------------------------------------------- controls
  const steerText = el("textarea", {id: "steer-text", "aria-label": "steer message"});
  const queueText = el("textarea", {id: "queue-text", "aria-label": "follow-up message"});
  const policy = el("select", {id: "queue-policy", "aria-label": "queue policy"},
    ["enqueue", "reject", "interrupt", "rollback"].map((p) => el("option", {value: p}, p)));
  const reason = el("input", {id: "cancel-reason", type: "text", "aria-label": "cancel reason"});
  const mode = el("select", {id: "mode", "aria-label": "permission mode"},
    ["ask", "plan", "accept_edits", "full_auto"].map((m) => el("option", {value: m}, m)));
  const sendText = el("textarea", {id: "send-text", "aria-label": "new message"});
  const offset = el("input", {id: "offset", type: "number", min: "1", "aria-label": "offset"});

  const form = (label, onsubmit, ...children) => el("form", {"aria-label": label,
    onsubmit: (e) => { e.preventDefault(); onsubmit(); }}, ...children);
  const controls = el("section", {class: "panel", "aria-labelledby": "controls-h"},
    el("h2", {id: "controls-h"}, "Control"),
    form("send a message", () => act("send", () => post(api + "/messages", {text: sendText.value})
      .then((r) => { sendText.value = ""; watch("the message", r); return r; })),
    el("label", {for: "send-text"}, "Message (the next turn)"), sendText,
    el("button", {type: "submit", id: "send"}, "Send")),
    form("steer the running turn", () => act("steer", () => post(api + "/steer", {text: steerText.value})
      .then((r) => { steerText.value = ""; return r; })),
    el("label", {for: "steer-text"}, "Steer the running turn"), steerText,
    el("button", {type: "submit", id: "steer"}, "Steer")),
    form("queue a follow-up", () => act("queue", () => post(api + "/queue",
      {text: queueText.value, policy: policy.value}).then((r) => { queueText.value = ""; return r; })),
    el("label", {for: "queue-text"}, "Queue a follow-up"), queueText, policy,
    el("button", {type: "submit", id: "queue"}, "Queue")),
    queueList,
    form("cancel the running turn", () => act("cancel", () => post(api + "/cancel", {reason: reason.value})
      .then((r) => { done("cancel: " + r.status); return r; })),
    el("label", {for: "cancel-reason"}, "Reason"), reason,
    el("button", {type: "submit", id: "cancel", class: "danger"}, "Cancel the turn")),
    form("switch the permission mode", () => act("mode " + mode.value, () => post(api + "/mode", {mode: mode.value})),
      el("label", {for: "mode"}, "Permission mode"), mode, el("button", {type: "submit", id: "set-mode"}, "Switch")),
    form("fork or rewind at an offset", () => {},
      el("label", {for: "offset"}, "Offset"), offset,
      el("button", {type: "button", id: "fork", onclick: () => fork(Number(offset.value) || null)}, "Fork here"),
      el("button", {type: "button", id: "rewind", onclick: () => rewind(Number(offset.value))}, "Rewind here")),
    el("p", {class: "muted"}, "Fork: a new session sharing events [0, offset) (all when empty). " +
      "Rewind: this session goes back to [0, offset), files too; the branch left behind stays."));

  fill(main,
    el("h1", {}, "Session ", el("span", {id: "session-id"}, sessionId)),
    head, el("p", {}, "Usage: ", totals), say, runSay,
    el("div", {class: "grid"},
      el("div", {}, el("h2", {}, "Timeline"), inherited, timelineRoot),
      el("div", {}, recovery, controls)));

  // ---------------------------------------------------------------- state
  async function refresh() {
    const [now, usage, plan, queue] = await Promise.all([
      get(api).catch(failedWith), get(api + "/usage").catch(failedWith),
      get(api + "/recovery").catch(failedWith),
      get(api + "/queue").catch(() => ({messages: []})),
    ]);
    if (now.failure) {
      fill(head, el("span", {class: "error", role: "alert", id: "session-error"},
        now.failure.code + ": " + now.failure.message));
      fill(recovery, el("h2", {id: "recovery-h"}, "Recovery"),
        el("p", {class: "error"}, plan.failure ? plan.failure.message : "see above"));
      return;
    }
    fill(head,
      el("span", {class: "status", id: "session-status", dataset: {status: now.running ? "running" : (now.last_turn_status || "new")}},
        now.running ? "running" : now.open_turn ? "interrupted" : (now.last_turn_status || "new")),
      " model " + (now.model || "?"), " · " + now.events + " facts · " + now.turns + " turn(s)",
      now.branch && now.branch !== sessionId ? " · branch " + now.branch : "",
      now.permission_mode ? " · mode " + now.permission_mode : "",
      now.pending_approvals ? " · " + now.pending_approvals + " waiting for approval" : "",
      now.workspace ? " · workspace " + now.workspace : "");
    if (now.permission_mode && document.activeElement !== mode) mode.value = now.permission_mode;
    if (!usage.failure) showUsage(timeline, usage, totals);
    if (plan.failure) fill(recovery, el("p", {class: "error"}, plan.failure.message));
    else showRecovery(plan, now);
    fill(queueList, queue.messages.map((m) => el("li", {dataset: {messageId: m.message_id}},
      m.policy + ": " + m.text + " ",
      el("button", {type: "button", onclick: () => act("retract", () =>
        call("DELETE", api + "/queue/" + encodeURIComponent(m.message_id)))}, "Retract"))));
  }

  function showRecovery(plan, now) {
    const h = el("h2", {id: "recovery-h"}, "Recovery");
    if (!plan.open_turn || now.running) {
      fill(recovery, h, el("p", {class: "muted"}, now.running ? "A turn is running." : "No interrupted turn."));
      return;
    }
    const rows = plan.calls.map((c) => {
      const waits = c.action === "wait_operator" || c.action === "park";
      const result = el("input", {type: "text", id: "result-" + c.call_id, class: "decide-result"});
      return el("li", {dataset: {callId: c.call_id, action: c.action}},
        el("strong", {}, c.tool), " · " + c.status + " → " + c.action,
        el("div", {class: "muted"}, c.reason),
        waits ? el("div", {class: "row"},
          el("label", {for: "result-" + c.call_id}, "Result, if it completed"), result) : null,
        waits ? el("div", {class: "row"},
          ["completed", "not_applied", "abandon"].map((d) => el("button", {type: "button",
            dataset: {decide: d}, onclick: () => act("decide " + d, () =>
              post(api + "/decide", {call_id: c.call_id, decision: d,
                ...(d === "completed" && result.value ? {result: result.value} : {})}))},
          decideLabel(d)))) : null);
    });
    fill(recovery, h,
      el("p", {}, "Turn " + plan.open_turn.slice(-8) + " was interrupted at offset " + plan.high_water +
        (plan.blocked ? "; a call waits for your decision before it can resume." : "; it can resume.")),
      el("ul", {id: "plan"}, rows),
      el("div", {class: "row"},
        el("button", {type: "button", id: "resume", class: "primary", disabled: plan.blocked,
          onclick: () => act("resume", () => post(api + "/resume", {})
            .then((r) => { watch("the resume", r); return r; }))}, "Resume"),
        el("button", {type: "button", id: "abandon", class: "danger",
          onclick: () => act("abandon", () => post(api + "/abandon", {reason: "abandoned in the console"}))},
        "Abandon the turn")));
  }

  await refresh();
  if (carried) { done(carried); carried = null; }
  showInherited(logId, inherited).catch((err) => fill(inherited, el("p", {class: "error"},
    "the shared history could not be read: " + err.message)));

  // ---------------------------------------------------------------- live
  const source = new EventSource(sessionPath(logId) + "/stream?deltas=true");
  const conn = document.getElementById("conn");
  let pending = null;
  const later = () => {  // at most one refresh of the panels per burst of facts
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh().catch(failed); }, 250);
  };
  for (const kind of KINDS) {
    source.addEventListener(kind, (e) => {
      timeline.apply(JSON.parse(e.data));
      fill(conn, "live · offset " + timeline.lastOffset);
      later();
    });
  }
  source.addEventListener("text_delta", (e) => timeline.delta(JSON.parse(e.data)));
  source.addEventListener("stream_error", (e) => {
    source.close();
    const err = (JSON.parse(e.data) || {}).error || {};
    fill(conn, "stopped: " + err.code + ": " + err.message);
  });
  source.onerror = () => fill(conn, "reconnecting…");
  source.onopen = () => fill(conn, "live");
  return () => { source.close(); if (pending) clearTimeout(pending); fill(conn); };
}

function decideLabel(d) {
  return {completed: "It completed", not_applied: "It did not happen", abandon: "Abandon the call"}[d];
}

// A fork (or a rewind's branch) holds only its own events; the history it shares is its
// parent's events [0, high_water), read from the parent and shown folded above, read only.
async function showInherited(logId, box) {
  const first = (await get(sessionPath(logId) + "/events?start=0&limit=1")).events[0];
  const parent = first && first.body && first.body.parent;
  if (!parent) return;
  const root = el("div", {class: "facts inherited-facts"});
  const link = el("a", {href: "#/session/" + encodeURIComponent(parent.session_id)}, parent.session_id);
  const shown = {loaded: false};
  root.onopen = async () => {
    if (shown.loaded) return;
    shown.loaded = true;
    const view = new Timeline(root, parent.session_id, {});
    for (let start = 0; start < parent.high_water;) {
      const limit = Math.min(1000, parent.high_water - start);
      const page = await get(sessionPath(parent.session_id) + "/events?start=" + start + "&limit=" + limit);
      for (const f of page.events) view.apply(f);
      if (!page.events.length) break;
      start = page.next;
    }
  };
  fill(box, el("p", {class: "muted"}, "Continues ", link, " from its first " + parent.high_water +
    " events. "), toggler("Show the shared history", root, {id: "show-inherited"}), root);
}
