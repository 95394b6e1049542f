/**
 * The error a streamed answer's body fails with when the server cuts it off on purpose.
 *
 * @module
 */

/**
 * A streamed answer cut off on purpose: the body fails with it instead of ending, so the
 * connection drops mid-answer, the way a stream ends when the machine serving it died (envd
 * when its sandbox was killed). Clients read that as a broken connection, not an answer; the
 * E2B SDKs then probe `/health` and, finding the sandbox gone, raise "the sandbox was killed or
 * reached its end of life". The server logs it as an event, not a failure.
 *
 * @example
 * ```ts
 * import { StreamCut } from "./stream_cut.ts";
 * const body = new ReadableStream({ start: (c) => c.error(new StreamCut("sandbox 'sbx_1' died")) });
 * await new Response(body).text().catch((e) => console.log(e instanceof StreamCut)); // true
 * ```
 */
export class StreamCut extends Error {
  /** Builds the cut with a sentence for the server's own log; the client never sees it. */
  constructor(message: string) {
    super(message);
    this.name = "StreamCut";
  }
}
