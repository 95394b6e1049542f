/**
 * Bounded shutdown: stop accepting, let in-flight requests finish up to a bound, then close.
 *
 * @module
 */

/** What `boundedShutdown` needs from a server: `Deno.HttpServer` fits. */
export interface Closable {
  /** Stops accepting and resolves when in-flight requests have finished. */
  shutdown(): Promise<void>;
}

/**
 * Asks `server` to stop accepting and waits for in-flight requests up to `graceMs`, then runs
 * `close` (ledger, timers) whatever happened. Resolves `true` when everything finished in time.
 *
 * @example
 * ```ts ignore
 * import { boundedShutdown } from "@dormice/cluster/shared";
 * const server = Deno.serve(app.fetch);
 * Deno.addSignalListener("SIGTERM", () => boundedShutdown(server, 10_000, () => ledger.close()));
 * ```
 */
export async function boundedShutdown(
  server: Closable,
  graceMs: number,
  close: () => void | Promise<void> = () => {},
): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), graceMs);
  });
  try {
    return await Promise.race([server.shutdown().then(() => true as const), bound]);
  } finally {
    clearTimeout(timer);
    await close();
  }
}

/**
 * Runs `onSignal` once on the first SIGINT or SIGTERM; a second signal exits at once with 130.
 * Returns a function that removes the listeners.
 *
 * @example
 * ```ts ignore
 * import { boundedShutdown, onTerminationSignals } from "@dormice/cluster/shared";
 * onTerminationSignals(() => boundedShutdown(server, 10_000, () => ledger.close()));
 * ```
 */
export function onTerminationSignals(onSignal: (signal: Deno.Signal) => void): () => void {
  let fired = false;
  const handlers = (["SIGINT", "SIGTERM"] as const).map((signal) => {
    const handler = () => {
      if (fired) Deno.exit(130);
      fired = true;
      onSignal(signal);
    };
    Deno.addSignalListener(signal, handler);
    return [signal, handler] as const;
  });
  return () => {
    for (const [signal, handler] of handlers) Deno.removeSignalListener(signal, handler);
  };
}
