/**
 * The gzip of a `POST /files` body, inflated without holding the node's event loop. Inflating is
 * CPU work the runtime does synchronously: a browser-style `DecompressionStream` turns one 64 KiB
 * read of a gzip of zeros into 64 MiB at once, so a 9 MB "gzip bomb" held the loop for seconds
 * (`/healthz` late, check-ins missed). Here the compressed bytes go into zlib a few KiB at a time
 * (at most ~1 MiB of output each, deflate expanding at most 1032 times), the loop is let run
 * once a slice of time has been used, and the body is refused once it has grown more than
 * `maxRatio` times its compressed size.
 *
 * @module
 */
import zlib from "node:zlib";
import { Buffer } from "node:buffer";
import { LoopBudget, type LoopBudgetOptions } from "../../../shared/event_loop.ts";

/** The default of `DORMICE_UPLOAD_GZIP_MAX_RATIO`. */
export const DEFAULT_GZIP_MAX_RATIO = 100;

/** Deflate's own most: one bit pair of a 258-byte match per byte at best, so 1032 is "no cap". */
export const GZIP_MAX_RATIO_CEILING = 1032;

/**
 * Output allowed whatever the ratio, bytes: a small text file compresses far better than 100 to
 * 1 (a 1 MiB file of one repeated line is a few KiB of gzip), and a ratio of tiny numbers says
 * nothing.
 */
export const GZIP_RATIO_GRACE_BYTES = 1024 * 1024;

/** Compressed bytes given to zlib at once: at most ~1 MiB of output, a millisecond or two of CPU. */
const INPUT_PIECE_BYTES = 1024;

/** Options of {@linkcode gunzipBounded}. */
export interface GunzipBoundedOptions {
  /** The most the output may grow past its compressed size, 1 to 1032. */
  maxRatio: number;
  /** The error the stream fails with past the ratio (`compressed` and `inflated` bytes so far). */
  tooExpanded: (compressed: number, inflated: number) => Error;
  /** The error the stream fails with when the gzip is bad (zlib's own error given). */
  unreadable: (error: unknown) => Error;
  /** Slice length, clock and yield, for tests (`LoopBudget`'s defaults otherwise). */
  budget?: LoopBudgetOptions;
}

/**
 * `body` (gzip) inflated, a slice at a time, refused past `maxRatio`. A gzip of several members
 * inflates to all of them, as `gunzip` does.
 *
 * @example
 * ```ts
 * import { gzipSync } from "node:zlib";
 * import { gunzipBounded } from "./gunzip.ts";
 * const body = new Blob([new Uint8Array(gzipSync("hello"))]).stream();
 * const out = gunzipBounded(body, {
 *   maxRatio: 100,
 *   tooExpanded: () => new Error("too expanded"),
 *   unreadable: (e) => new Error(`bad gzip: ${e}`),
 * });
 * console.log(await new Response(out).text()); // "hello"
 * ```
 */
export function gunzipBounded(
  body: ReadableStream<Uint8Array>,
  options: GunzipBoundedOptions,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  const budget = new LoopBudget(options.budget);
  const inflater = zlib.createGunzip({ chunkSize: 64 * 1024 });
  let output: Uint8Array[] = [];
  let failure: unknown;
  let ended = false;
  inflater.on("data", (chunk: Buffer) => output.push(new Uint8Array(chunk)));
  inflater.on("error", (error: unknown) => failure ??= error);
  inflater.on("end", () => ended = true);
  let compressed = 0, inflated = 0;
  let input: Uint8Array | undefined;
  let at = 0;

  const feed = (piece: Uint8Array): Promise<void> =>
    new Promise((resolve) => {
      inflater.write(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength), (error) => {
        if (error) failure ??= error;
        resolve();
      });
    });
  const finish = (): Promise<void> =>
    new Promise((resolve) => {
      if (ended || failure !== undefined) return resolve();
      inflater.once("end", () => resolve());
      inflater.once("error", () => resolve());
      inflater.end();
    });
  const stop = async (controller: ReadableStreamDefaultController<Uint8Array>, error: Error) => {
    controller.error(error);
    inflater.destroy();
    await reader.cancel().catch(() => {});
  };

  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      for (;;) {
        if (failure !== undefined) return await stop(controller, options.unreadable(failure));
        if (output.length > 0) {
          const ready = output;
          output = [];
          for (const chunk of ready) inflated += chunk.byteLength;
          if (
            inflated > GZIP_RATIO_GRACE_BYTES && inflated > compressed * options.maxRatio
          ) {
            return await stop(controller, options.tooExpanded(compressed, inflated));
          }
          for (const chunk of ready) controller.enqueue(chunk);
          return;
        }
        if (ended) return controller.close();
        if (input === undefined || at >= input.byteLength) {
          let next: ReadableStreamReadResult<Uint8Array>;
          try {
            next = await reader.read();
          } catch (error) {
            return await stop(controller, options.unreadable(error));
          }
          if (next.done) {
            await finish();
            if (!ended && failure === undefined) failure = new Error("the gzip stream ended early");
            continue;
          }
          input = next.value;
          at = 0;
          continue;
        }
        await budget.pass();
        const piece = input.subarray(at, at + INPUT_PIECE_BYTES);
        at += piece.byteLength;
        compressed += piece.byteLength;
        await feed(piece);
      }
    },
    async cancel(reason) {
      inflater.destroy();
      await reader.cancel(reason).catch(() => {});
    },
  }, { highWaterMark: 0 });
}
