// The host's API, on this page's origin with the HttpOnly cookie (no token in scripts).

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || "HTTP " + status);
    this.status = status;
    this.code = err.code || "http_" + status;
    this.hint = err.hint || "";
  }
}

export async function call(method, path, body) {
  const init = {method, credentials: "same-origin", headers: {}};
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 204) return null;
  const type = res.headers.get("content-type") || "";
  const data = type.includes("json") ? await res.json().catch(() => null) : await res.text();
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body === undefined ? {} : body);

export function sessionPath(id) {
  return "/v1/sessions/" + encodeURIComponent(id);
}

// The token given in the URL fragment (#token=... anywhere in it) is traded once for the
// cookie, then taken out of the address bar; the fragment never reaches the server.
export async function signIn() {
  const hash = location.hash.slice(1);
  const found = /(?:^|[&?#])token=([^&]+)/.exec(hash);
  if (!found) return;
  const token = decodeURIComponent(found[1]);
  // out of the address bar before anything awaits: what the page goes to next is kept
  const rest = hash.replace(found[0], "").replace(/^[&?]/, "");
  history.replaceState(null, "", location.pathname + (rest ? "#" + rest : "#/sessions"));
  const res = await fetch("/v1/auth/cookie", {
    method: "POST", credentials: "same-origin", headers: {Authorization: "Bearer " + token},
  });
  if (!res.ok) throw new ApiError(res.status, await res.json().catch(() => null));
}
