// Building the page from data: every piece of data goes in as text (textContent or a
// text node), never as markup. Characters that could hide or reorder what a person reads
// (controls, bidirectional overrides, zero-width marks) are shown as visible escapes.

const HIDDEN = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/gu;

// A node showing `text` as text, with each hidden character as a marked escape.
export function visible(text) {
  const value = text === undefined || text === null ? "" : String(text);
  HIDDEN.lastIndex = 0;
  if (!HIDDEN.test(value)) return document.createTextNode(value);
  const frag = document.createDocumentFragment();
  let at = 0;
  HIDDEN.lastIndex = 0;
  for (const m of value.matchAll(HIDDEN)) {
    if (m.index > at) frag.append(document.createTextNode(value.slice(at, m.index)));
    const esc = document.createElement("span");
    esc.className = "esc";
    esc.textContent = "\\u" + m[0].codePointAt(0).toString(16).padStart(4, "0");
    esc.title = "a hidden or direction-changing character";
    frag.append(esc);
    at = m.index + m[0].length;
  }
  if (at < value.length) frag.append(document.createTextNode(value.slice(at)));
  return frag;
}

// el("button", {class: "x", onclick: f, dataset: {a: 1}}, "text", child...)
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  // a <pre> scrolls when long: reachable by keyboard, so it can be scrolled without a mouse
  if (tag === "pre") node.tabIndex = 0;
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.append(visible(value));
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  add(node, children);
  return node;
}

function add(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) add(node, child);
    else if (child instanceof Node) node.append(child);
    else node.append(visible(child));
  }
}

// Replace a node's content with `children` (text or nodes).
export function fill(node, ...children) {
  node.replaceChildren();
  add(node, children);
  return node;
}

export function time(us) {
  if (!us) return "—";
  return new Date(us / 1000).toISOString().replace("T", " ").slice(0, 23);
}

export function clock(us) {
  return us ? new Date(us / 1000).toISOString().slice(11, 23) : "";
}

export function ago(us) {
  if (!us) return "never";
  const s = Math.max(0, Math.round(Date.now() / 1000 - us / 1e6));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

export function usd(micro) {
  if (micro === null || micro === undefined) return "unpriced";
  return "$" + (micro / 1e6).toFixed(micro < 10000 ? 6 : 4);
}

// Pretty JSON when `text` is JSON, else the text itself.
export function pretty(text) {
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// A button that shows or hides `panel` (aria-expanded says which).
export function toggler(label, panel, attrs) {
  panel.hidden = true;
  const button = el("button", {type: "button", "aria-expanded": "false", ...(attrs || {})}, label);
  button.addEventListener("click", () => {
    const open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", String(open));
    panel.hidden = !open;
    if (open && panel.onopen) panel.onopen();
  });
  return button;
}
