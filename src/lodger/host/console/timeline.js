// A session's timeline, built fact by fact: turns, runs, steps, the model's text, each
// call with its arguments and result (folded: a button opens it), a code cell's nested
// calls and a delegate call's subagent under their parent, compactions, control actions,
// background processes and long calls. Live text deltas (never facts) show in the step
// they belong to until its committed model_output replaces them.
import {get, sessionPath} from "./api.js";
import {el, fill, pretty, clock, usd, toggler, visible} from "./dom.js";

const SUBAGENT = "actor:subagent:";

export class Timeline {
  constructor(root, sessionId, actions) {
    this.root = root;
    this.sessionId = sessionId;
    this.actions = actions;  // {fork(offset), rewind(offset), decide(callId, decision)}
    this.turns = new Map();
    this.runs = new Map();
    this.steps = new Map();
    this.calls = new Map();
    this.lastOffset = -1;
  }

  turnOf(f) {
    const key = f.turn_id || "";
    let t = this.turns.get(key);
    if (!t) {
      t = el("section", {class: "turn", dataset: {turnId: key}});
      t.input = el("div", {class: "turn-input"});
      t.usage = el("span", {class: "usage"});
      t.tools = el("span", {class: "row"});
      t.append(el("div", {class: "turn-head"}, t.input, t.usage, t.tools));
      this.root.append(t);
      this.turns.set(key, t);
    }
    return t;
  }

  runOf(f) {
    let r = this.runs.get(f.run_id);
    if (!r) {
      r = el("div", {class: "run"});
      r.head = el("div", {class: "head"}, "run " + (f.run_id || "").slice(-8));
      r.append(r.head);
      this.turnOf(f).append(r);
      this.runs.set(f.run_id, r);
    }
    return r;
  }

  stepOf(f) {
    let s = this.steps.get(f.step_id);
    if (s && f.run_id && !s.inRun) {  // made by a text delta before its run's facts came
      this.runOf(f).append(s);
      s.inRun = true;
    }
    if (!s) {
      s = el("div", {class: "step", dataset: {stepId: f.step_id || ""}});
      s.head = el("div", {class: "head"}, "step");
      s.texts = el("div", {});
      s.append(s.head, s.texts);
      (f.run_id ? this.runOf(f) : this.turnOf(f)).append(s);
      s.inRun = Boolean(f.run_id);
      this.steps.set(f.step_id, s);
    }
    return s;
  }

  // Where a fact's note goes: its turn, else the timeline itself (between turns).
  boxOf(f) {
    return f.turn_id ? this.turnOf(f) : this.root;
  }

  note(f, cls, ...text) {
    const n = el("div", {class: "note " + cls, dataset: {offset: String(f.offset), kind: f.kind}},
      ...text);
    this.boxOf(f).append(n);
    return n;
  }

  callRow(f, id, name) {
    let c = this.calls.get(id);
    if (c) return c;
    c = el("div", {class: "call", dataset: {callId: id, status: "proposed"}});
    c.state = el("span", {class: "call-state"});
    c.body = el("div", {class: "call-body"});
    c.args = el("pre", {class: "arguments"});
    c.result = el("div", {class: "result"}, el("span", {class: "muted"}, "no result yet"));
    c.extra = el("div", {});
    c.body.append(el("h3", {}, "Arguments"), c.args, el("h3", {}, "Result"), c.result, c.extra);
    c.toggle = toggler(name, c.body, {class: "toggle", dataset: {expand: id},
      "aria-label": "call " + name + ": show arguments and result"});
    c.decide = el("span", {});
    c.append(el("div", {class: "call-head"}, c.toggle, c.state, c.decide), c.body);
    this.calls.set(id, c);
    const parent = f.parent_call_id ? this.calls.get(f.parent_call_id) : null;
    if (parent) this.nestUnder(parent, c);
    else this.stepOf(f).append(c);
    return c;
  }

  // A code cell's nested call, or a subagent, folded under its parent call.
  nestUnder(parent, child) {
    if (!parent.nested) {
      parent.nested = el("div", {class: "nested"});
      parent.nestedToggle = toggler("nested calls", parent.nested, {class: "nested-toggle"});
      parent.append(el("div", {class: "nested"}, parent.nestedToggle), parent.nested);
    }
    parent.nested.append(child);
    fill(parent.nestedToggle, "nested calls (" + parent.nested.children.length + ")");
  }

  delta(d) {
    if (!d || typeof d.text !== "string") return;
    const s = this.stepOf({step_id: d.step_id, turn_id: d.turn_id, run_id: null});
    if (!s.live) {
      s.live = el("div", {class: "text live", "aria-live": "polite"});
      s.texts.append(s.live);
    }
    s.live.append(visible(d.text));  // text, hidden characters marked, as everywhere
  }

  apply(f) {
    const b = f.body || {};
    const handler = HANDLERS[f.kind];
    if (handler) handler.call(this, f, b);
    else if (f.kind !== "session_started") this.note(f, "other", f.kind);
    this.lastOffset = Math.max(this.lastOffset, f.offset);
    this.root.dataset.lastOffset = String(this.lastOffset);
  }
}

function status(c, value, text) {
  c.dataset.status = value;
  fill(c.state, text);
}

function showResult(timeline, c, f, b) {
  const parts = [el("pre", {class: "result-text"}, b.content)];
  if (b.truncated) parts.push(el("p", {class: "muted"}, "truncated: the full result is an artifact"));
  for (const ref of b.artifacts || []) {
    const out = el("pre", {class: "artifact", hidden: true});
    const load = el("button", {type: "button", dataset: {artifact: ref.sha256}, onclick: async () => {
      load.disabled = true;
      try {
        // the artifact route serves bytes inert (attachment, sandbox CSP); shown as text
        const res = await fetch(sessionPath(timeline.sessionId) + "/artifacts/" + ref.sha256,
          {credentials: "same-origin"});
        fill(out, res.ok ? await res.text() : "HTTP " + res.status);
      } catch (err) {
        fill(out, String(err));
      }
      out.hidden = false;
    }}, "Load the full result (" + ref.size + " bytes, " + ref.media_type + ")");
    parts.push(load, out);
  }
  fill(c.result, parts);
}

const HANDLERS = {
  turn_started(f, b) {
    const t = this.turnOf(f);
    fill(t.input, b.input);
    t.dataset.offset = String(f.offset);
    if (!this.actions.fork) return;  // an inherited history: read only
    fill(t.tools,
      el("button", {type: "button", dataset: {forkAt: String(f.offset)},
        onclick: () => this.actions.fork(f.offset)}, "Fork before this turn"),
      el("button", {type: "button", dataset: {rewindTo: String(f.offset)},
        onclick: () => this.actions.rewind(f.offset)}, "Rewind to before this turn"));
  },
  run_started(f, b) {
    fill(this.runOf(f).head, "run " + f.run_id.slice(-8) + " · " + b.model +
      (b.parent_run_id ? " · resumed from offset " + (b.resumed_from ? b.resumed_from.high_water : "?") : ""));
  },
  step_started(f, b) {
    fill(this.stepOf(f).head, "step " + b.index + " · " + b.model + " · " + clock(f.ts));
  },
  model_output(f, b) {
    const s = this.stepOf(f);
    if (s.live) { s.live.remove(); s.live = null; }  // the committed text replaces the deltas
    if (b.reasoning) s.texts.append(el("div", {class: "reasoning"}, b.reasoning));
    if (b.text) s.texts.append(el("div", {class: "text", dataset: {offset: String(f.offset)}}, b.text));
    if (b.usage) {
      const u = b.usage;
      s.head.append(el("span", {class: "usage"}, " · in " + u.input_tokens + " / out " +
        u.output_tokens + (u.cache_read_tokens ? " / cached " + u.cache_read_tokens : "") + " tokens"));
    }
    for (const p of b.calls || []) {
      const c = this.callRow(f, p.call_id, p.name);
      fill(c.args, pretty(p.arguments));
    }
  },
  permission_requested(f, b) {
    const c = this.callRow(f, f.call_id, b.tool);
    if (!c.args.textContent) fill(c.args, pretty(b.summary));
    status(c, "parked", "waiting for approval");
    if (this.actions.decide) fill(c.decide, this.actions.decide(f.call_id, () => fill(c.decide)));
  },
  permission_decided(f, b) {
    const c = this.calls.get(f.call_id);
    if (!c) return;
    if (b.decision === "park") { status(c, "parked", "parked: waiting for an answer"); return; }
    fill(c.decide);
    status(c, b.decision === "allow" ? "allowed" : "denied",
      b.decision + " by " + b.by + (b.who ? " (" + b.who + ")" : "") + (b.reason ? ": " + b.reason : ""));
  },
  call_rejected(f, b) {
    const c = this.callRow(f, f.call_id, b.tool);
    status(c, "rejected", "rejected: " + b.reason);
    fill(c.result, el("pre", {}, b.message));
  },
  tool_dispatched(f, b) {
    const c = this.callRow(f, f.call_id, b.tool);
    c.t1 = f.ts;
    fill(c.args, JSON.stringify(b.arguments, null, 2));
    status(c, "running", "T1 " + clock(f.ts) + (b.attempt > 1 ? " · attempt " + b.attempt : "") + " · running");
    for (const r of b.resources || []) {
      if (!r.startsWith(SUBAGENT)) continue;
      const child = r.slice(SUBAGENT.length);
      const box = el("div", {class: "subagent"});
      const open = el("a", {href: "#/session/" + encodeURIComponent(child)}, child);
      const summary = el("span", {class: "muted"});
      this.nestUnder(c, el("div", {class: "call subagent-child", dataset: {session: child}},
        el("div", {class: "call-head"}, "subagent ", open, " ", summary), box));
      get(sessionPath(child)).then((s) => fill(summary, s.last_turn_status || (s.running ? "running" : "")))
        .catch(() => fill(summary, "not started"));
    }
  },
  tool_responded(f, b) {
    const c = this.calls.get(f.call_id);
    if (!c) return;
    const ms = c.t1 ? " (" + ((f.ts - c.t1) / 1000).toFixed(1) + " ms)" : "";
    status(c, b.status, b.status + " · T1 " + clock(c.t1) + " → T2 " + clock(f.ts) + ms);
    showResult(this, c, f, b);
  },
  call_accepted(f, b) {
    const c = this.calls.get(f.call_id);
    const text = "accepted: running remotely (" + b.wait + "), handle " + JSON.stringify(b.handle);
    if (c) { status(c, "running", text); c.extra.append(el("p", {class: "note"}, text)); }
    else this.note(f, "process", text);
  },
  process_started(f, b) {
    this.note(f, "process", "process " + b.process_id + " started" + (b.pid ? " (pid " + b.pid + ")" : "") +
      ": " + b.command + " · keep " + b.keep);
  },
  process_ended(f, b) {
    this.note(f, "process", "process " + b.process_id + " " + b.status +
      (b.exit_code !== null && b.exit_code !== undefined ? " (exit " + b.exit_code + ")" : "") +
      (b.reason ? ": " + b.reason : "") + " · " + b.output_bytes + " bytes of output");
  },
  tools_activated(f, b) { this.note(f, "other", "tools activated for “" + b.query + "”: " + b.names.join(", ")); },
  provider_retried(f, b) { this.note(f, "control", "provider retried (attempt " + b.attempt + "): " + b.error); },
  model_switched(f, b) { this.note(f, "control", "model switched " + b.from_model + " → " + b.to_model + ": " + b.error); },
  budget_reached(f, b) {
    this.note(f, "control", "budget reached: " + b.budget + " " + b.spent + "/" + b.limit + " " + b.unit + " (" + b.scope + ")");
  },
  recovery_observed(f, b) { this.note(f, "control", "recovery observed " + b.status + ": " + b.reason); },
  recovery_decided(f, b) { this.note(f, "control", "recovery decided " + b.action + (b.reason ? ": " + b.reason : "")); },
  operator_decision(f, b) {
    const c = this.calls.get(f.call_id);
    if (c) status(c, b.decision === "completed" ? "ok" : "error", "operator: " + b.decision);
    this.note(f, "control", "operator decision " + b.decision + " by " + (b.who || b.by) +
      (b.result ? ": " + b.result : ""));
  },
  context_compacted(f, b) {
    this.note(f, "compaction", "context elided " + b.elided_call_ids.length + " result(s) to fit ~" + b.budget_tokens + " tokens");
  },
  compacted(f, b) {
    this.note(f, "compaction", "compacted [0, " + b.covers.high_water + "): ~" + b.tokens_before + " → ~" +
      b.tokens_after + " tokens, " + b.dropped_call_ids.length + " result(s) summarized (" + b.trigger + ", " + b.model + ")");
  },
  compaction_failed(f, b) {
    this.note(f, "compaction", "compaction failed (" + b.trigger + "): " + b.reason + "; fallback " + b.fallback);
  },
  steer_received(f, b) { this.note(f, "control", "steer " + (b.who ? "by " + b.who : "") + ": " + b.text); },
  steer_delivered(f, b) { this.note(f, "control", "steer delivered at step " + b.step); },
  message_queued(f, b) { this.note(f, "control", "queued (" + b.policy + ")" + (b.who ? " by " + b.who : "") + ": " + b.text); },
  queue_changed(f, b) {
    this.note(f, "control", "queue " + b.action + " " + b.message_id + (b.text ? ": " + b.text : "") + (b.who ? " by " + b.who : ""));
  },
  cancel_requested(f, b) {
    this.note(f, "control", "cancel requested" + (b.who ? " by " + b.who : "") + (b.reason ? ": " + b.reason : ""));
  },
  permission_mode_changed(f, b) {
    this.note(f, "control", "permission mode " + (b.previous || "none") + " → " + b.mode + (b.who ? " by " + b.who : ""));
  },
  rewound(f, b) {
    this.note(f, "control", "rewound to [0, " + b.to.high_water + ") of " + b.left.session_id + (b.who ? " by " + b.who : "") +
      ": " + b.restored + " file(s) restored, " + b.removed + " removed");
  },
  artifact_stored(f, b) { this.note(f, "other", "artifact stored " + (b.name || b.artifact.sha256.slice(0, 12))); },
  workspace_snapshot(f, b) { this.note(f, "other", "workspace snapshot: " + b.files + " files, " + b.size + " bytes"); },
  file_checkpoint(f, b) {
    const c = this.calls.get(f.call_id);
    if (c) c.extra.append(el("p", {class: "note"}, "file checkpoint: " + b.path));
  },
  output_rejected(f, b) { this.note(f, "control", "output rejected (attempt " + b.attempt + "): " + b.message); },
  elicitation_requested(f, b) { this.note(f, "control", "elicitation from " + b.server + ": " + b.message); },
  elicitation_answered(f, b) { this.note(f, "control", "elicitation " + b.action + " by " + (b.who || b.by)); },
  sampling_requested(f, b) { this.note(f, "other", "sampling requested by " + b.server + ": " + b.decision); },
  sampling_answered(f, b) { this.note(f, "other", "sampling answered by " + b.model); },
  tools_changed(f, b) { this.note(f, "other", "tools of " + b.server + " changed: +" + b.added.length + " −" + b.removed.length); },
  replay_started(f, b) { this.note(f, "other", "replay of " + b.source_session + " at " + b.source_offset); },
  call_replayed(f, b) { this.note(f, "other", "call replayed from " + b.source); },
  eval_scored(f, b) { this.note(f, "other", "eval " + b.case + ": " + (b.passed === null ? b.score : b.passed ? "passed" : "failed")); },
  run_ended(f, b) {
    fill(this.runOf(f).head, this.runOf(f).head.textContent + " · " + b.status + (b.error ? ": " + b.error : ""));
  },
  turn_ended(f, b) {
    this.note(f, "end", "turn " + b.status + (b.answer ? ": " + b.answer : "") + (b.reason ? " (" + b.reason + ")" : ""));
  },
};

// The usage of each turn, next to its input, and the session's total.
export function showUsage(timeline, usage, totalBox) {
  for (const t of usage.turns) {
    const turn = timeline.turns.get(t.turn_id);
    if (turn) {
      fill(turn.usage, t.requests + " request(s) · in " + t.input_tokens + " / out " +
        t.output_tokens + " tokens · " + usd(t.cost_micro_usd));
    }
  }
  const s = usage.total;
  fill(totalBox, s.requests + " request(s) · in " + s.input_tokens + " / out " + s.output_tokens +
    " / cached " + s.cache_read_tokens + " tokens · " + usd(s.cost_micro_usd));
}

export const KINDS = Object.keys(HANDLERS).concat(["session_started"]);
