/**
 * How a node reaches its gateway: the endpoint it checks in at (an origin, or a gateway mounted
 * under a path), the one extra header a host service in front may ask for, and whether an origin
 * is this machine's own.
 *
 * @module
 */

const loopbackHosts = new Set(["localhost", "127.0.0.1", "[::1]", "::1"]);

/** One more header a node sends on every check-in (`DORMICE_GATEWAY_CHECK_IN_HEADER`). */
export interface CheckInHeader {
  /** The header's name, e.g. `x-host-auth`. */
  name: string;
  /** Its value; never logged. */
  value: string;
}

/** Header names a check-in sets itself, which the extra header may not replace. */
const OWN_CHECK_IN_HEADERS = ["authorization", "content-type", "content-length", "host"];

/**
 * Parses a gateway's URL: an http(s) origin, or one with the path a host app mounts the gateway
 * at (`https://host/fleet`); a trailing slash is dropped, a query, fragment or credentials are
 * refused. Returns the URL to put `/checkIn` after, or an error sentence.
 *
 * @example
 * ```ts
 * import { parseGatewayEndpoint } from "./config_gateway.ts";
 * parseGatewayEndpoint("https://host.example/fleet/"); // { ok: true, value: "https://host.example/fleet" }
 * ```
 */
export function parseGatewayEndpoint(
  input: string,
): { ok: true; value: string } | { ok: false; error: string } {
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    return {
      ok: false,
      error: `'${input}' is not a URL: write the gateway's origin, e.g. http://10.0.0.1:3677, ` +
        "or the path a host app mounts it at, e.g. https://host.example/fleet",
    };
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    return { ok: false, error: `'${input}' uses ${url.protocol} where http: or https: is needed` };
  }
  if (url.username || url.password) {
    return {
      ok: false,
      error: `'${input}' carries credentials: write them in DORMICE_GATEWAY_CHECK_IN_HEADER, ` +
        "not in the URL",
    };
  }
  if (url.search || url.hash) {
    return {
      ok: false,
      error: `'${input}' has a query or fragment: write the origin and path only, e.g. ` +
        `${url.origin}${url.pathname.replace(/\/+$/, "")}`,
    };
  }
  return { ok: true, value: url.origin + url.pathname.replace(/\/+$/, "") };
}

/**
 * Parses `name: value`, the extra check-in header. The error sentence never repeats the value
 * (it is a secret).
 *
 * @example
 * ```ts
 * import { parseCheckInHeader } from "./config_gateway.ts";
 * parseCheckInHeader("x-host-auth: s3cret"); // { ok: true, value: { name: "x-host-auth", value: "s3cret" } }
 * ```
 */
export function parseCheckInHeader(
  input: string,
): { ok: true; value: CheckInHeader } | { ok: false; error: string } {
  const colon = input.indexOf(":");
  const name = (colon < 0 ? input : input.slice(0, colon)).trim();
  const value = colon < 0 ? "" : input.slice(colon + 1).trim();
  // Without a colon the whole text may be the secret: never repeat it.
  if (colon < 0 || !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(name)) {
    return {
      ok: false,
      error:
        "write it as name: value, e.g. x-host-auth: <secret>, with a header name of letters, " +
        "digits and -",
    };
  }
  if (OWN_CHECK_IN_HEADERS.includes(name.toLowerCase())) {
    return {
      ok: false,
      error: `${name} is a header the check-in sets itself (the fleet token rides in ` +
        "authorization): name another, e.g. x-host-auth",
    };
  }
  if (value === "" || /[\r\n\0]/.test(value)) {
    return {
      ok: false,
      error: `the value of ${name} is empty or holds a line break: write name: value on one line`,
    };
  }
  return { ok: true, value: { name: name.toLowerCase(), value } };
}

/**
 * Whether an origin's host is this machine's loopback.
 *
 * @example
 * ```ts
 * import { isLoopbackOrigin } from "./config_gateway.ts";
 * isLoopbackOrigin("http://127.0.0.1:3676"); // true
 * isLoopbackOrigin("http://10.0.0.5:3676"); // false
 * ```
 */
export function isLoopbackOrigin(origin: string): boolean {
  const host = new URL(origin).hostname;
  return loopbackHosts.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host) ||
    host.endsWith(".localhost");
}
