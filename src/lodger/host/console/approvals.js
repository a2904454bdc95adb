// The approvals inbox: every parked call of every session this token sees, with its
// arguments, answered allow once, allow always (this tool, this session) or deny.
import {get, post, sessionPath} from "./api.js";
import {el, fill, pretty} from "./dom.js";

export async function countApprovals() {
  const badge = document.getElementById("approval-count");
  try {
    const found = await get("/v1/approvals");
    badge.hidden = found.approvals.length === 0;
    fill(badge, String(found.approvals.length));
    badge.setAttribute("aria-label", found.approvals.length + " pending");
  } catch {
    badge.hidden = true;
  }
}

// Buttons answering one parked call; `done(decision)` after the host took the answer.
export function decideButtons(sessionId, callId, done) {
  const box = el("span", {class: "decide", role: "group", "aria-label": "answer " + callId});
  const status = el("span", {class: "call-state", role: "status"});
  const answers = [["allow", "Allow once", "primary"], ["always", "Allow always", ""],
    ["deny", "Deny", "danger"]];
  for (const [decision, label, cls] of answers) {
    box.append(el("button", {
      type: "button", class: cls, dataset: {decide: decision},
      onclick: async () => {
        box.querySelectorAll("button").forEach((b) => { b.disabled = true; });
        try {
          const answered = await post(
            sessionPath(sessionId) + "/approvals/" + encodeURIComponent(callId), {decision});
          fill(status, answered.status + " by " + (answered.answered_by || "?"));
          if (done) done(decision);
        } catch (err) {
          fill(status, err.code + ": " + err.message);
          box.querySelectorAll("button").forEach((b) => { b.disabled = false; });
        }
        countApprovals();
      },
    }, label));
  }
  return el("span", {}, box, " ", status);
}

export async function showApprovals(main) {
  const list = el("div", {id: "approvals", "aria-live": "polite"});
  fill(main, el("h1", {}, "Approvals"),
    el("p", {class: "muted"}, "Calls waiting for a person, across sessions. The answer is " +
      "recorded with your token's id."),
    el("button", {type: "button", onclick: () => load()}, "Refresh"), list);
  let shown = null;
  async function load() {
    const found = await get("/v1/approvals");
    const key = found.approvals.map((a) => a.session_id + "/" + a.call_id).join(" ");
    if (key === shown) return;  // unchanged: keep the page (and the keyboard focus) as it is
    shown = key;
    if (!found.approvals.length) {
      fill(list, el("p", {class: "muted"}, "Nothing waits for an answer."));
      return;
    }
    fill(list, found.approvals.map((a) => el("section", {
      class: "approval", dataset: {callId: a.call_id, sessionId: a.session_id},
      "aria-label": "approval of " + a.tool,
    },
    el("h2", {}, a.tool, el("span", {class: "muted"}, " in "),
      el("a", {href: "#/session/" + encodeURIComponent(a.session_id)}, a.session_id)),
    el("p", {class: "muted"}, "call " + a.call_id),
    el("h3", {}, "Arguments"),
    el("pre", {class: "arguments"}, pretty(a.arguments !== null ? a.arguments : a.summary)),
    decideButtons(a.session_id, a.call_id, () => setTimeout(() => load().catch(() => {}), 1500)))));
  }
  await load();
  const timer = setInterval(() => load().catch(() => {}), 4000);
  return () => clearInterval(timer);
}
