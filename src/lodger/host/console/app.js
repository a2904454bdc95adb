// The console's pages, chosen by the URL fragment: #/sessions, #/session/ID, #/approvals.
import {signIn} from "./api.js";
import {el, fill} from "./dom.js";
import {showSessions} from "./sessions.js";
import {showSession} from "./session.js";
import {showApprovals, countApprovals} from "./approvals.js";

const main = document.getElementById("main");
let leave = null;  // what the current page must stop (its live stream) when another opens

async function route() {
  if (leave) { leave(); leave = null; }
  const hash = location.hash.slice(1) || "/sessions";
  const [, page, ...rest] = hash.split("/");
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  main.replaceChildren();
  try {
    if (page === "session" && rest.length) {
      leave = await showSession(main, decodeURIComponent(rest.join("/")));
    } else if (page === "approvals") {
      leave = await showApprovals(main);
    } else {
      leave = await showSessions(main);
    }
  } catch (err) {
    fill(main, el("h1", {}, "Something went wrong"),
      el("p", {class: "error", role: "alert"}, err.code ? err.code + ": " + err.message : String(err)),
      err.status === 401 ? el("p", {}, "Open the console with its token: /console#token=TOKEN") : null);
  }
  document.body.dataset.page = page || "sessions";
}

async function start() {
  try {
    await signIn();
  } catch (err) {
    fill(main, el("p", {class: "error", role: "alert"}, "sign-in failed: " + err.message));
    return;
  }
  window.addEventListener("hashchange", route);
  await route();
  countApprovals();
  setInterval(countApprovals, 5000);
}
start();
