// The console's pages, chosen by the URL fragment: #/sessions, #/session/ID, #/approvals.
import {signIn} from "./api.js";
import {el, fill} from "./dom.js";
import {showSessions} from "./sessions.js";
import {showSession} from "./session.js";
import {showApprovals, countApprovals} from "./approvals.js";

const main = document.getElementById("main");
let leave = null;  // what the current page must stop (its live stream) when another opens

let signing = Promise.resolve();
let opened = 0;  // which route() call is the latest: an older one that finishes later yields

async function route() {
  const mine = ++opened;
  if (leave) { leave(); leave = null; }
  main.replaceChildren();  // the page left is gone at once, not after the next one loads
  // a token in the address (the first load, or a link opened in this tab) is traded for
  // the cookie first; a page opened meanwhile waits for the same trade
  if (/(?:^#|[&?])token=/.test(location.hash)) signing = signIn();
  try { await signing; } catch (err) {
    if (mine === opened) fill(main, el("p", {class: "error", role: "alert"}, "sign-in failed: " + err.message));
    return;
  }
  if (mine !== opened) return;
  const hash = location.hash.slice(1) || "/sessions";
  const [, page, ...rest] = hash.split("/");
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  // each page is built in a box of its own, put in place only if no newer route began
  const box = document.createElement("div");
  main.replaceChildren(box);
  try {
    let stop;
    if (page === "session" && rest.length) {
      stop = await showSession(box, decodeURIComponent(rest.join("/")));
    } else if (page === "approvals") {
      stop = await showApprovals(box);
    } else {
      stop = await showSessions(box);
    }
    if (mine !== opened) { if (stop) stop(); return; }
    leave = stop;
  } catch (err) {
    if (mine !== opened) return;
    fill(box, el("h1", {}, "Something went wrong"),
      el("p", {class: "error", role: "alert"}, err.code ? err.code + ": " + err.message : String(err)),
      err.status === 401 ? el("p", {}, "Open the console with its token: /console#token=TOKEN") : null);
  }
  document.body.dataset.page = page || "sessions";
}

function start() {
  window.addEventListener("hashchange", route);  // before anything awaits: no change missed
  route().then(() => {  // signs in first when the address holds a token
    countApprovals();
    setInterval(countApprovals, 5000);
  });
}
start();
