/**
 * The ledger on a full data disk: how a write that failed for space is told apart, the 507 it
 * becomes, and the reserve file that lets a destroy through when the disk has no room left.
 *
 * Why a reserve: the ledger journals in WAL mode (a crash mid-write must not corrupt it, which
 * rules out `journal_mode=MEMORY` or `OFF`), so even a DELETE appends its pages to the WAL
 * before anything is freed, and a checkpoint that would shrink the WAL must first grow the
 * database file. On a disk with no byte left every write fails, the destroy that would free the
 * sandbox's space included. The node therefore keeps a small file of its own in the data dir
 * and gives it up for a write that frees space (a destroy), never for one that takes more.
 *
 * @module
 */
import { join } from "node:path";
import { HttpError } from "../shared/http_error.ts";

/** The reserve's size: room for a few dozen destroys (one takes about 16 KiB of WAL). */
export const LEDGER_RESERVE_BYTES: number = 256 * 1024;

/** The reserve's file name in the data dir. */
export const LEDGER_RESERVE_FILE = "ledger.reserve";

/**
 * Whether SQLite (or the file system) refused a write for want of space: SQLITE_FULL, or
 * ENOSPC / EDQUOT from the disk.
 *
 * @example
 * ```ts
 * import { isDiskFull } from "./ledger_space.ts";
 * isDiskFull(Object.assign(new Error("database or disk is full"), { errcode: 13 })); // true
 * ```
 */
export function isDiskFull(error: unknown): boolean {
  const e = error as { errcode?: unknown; code?: unknown; message?: unknown } | null;
  if (typeof e?.errcode === "number" && (e.errcode & 0xff) === 13) return true;
  if (e?.code === "ENOSPC" || e?.code === "EDQUOT") return true;
  return /database or disk is full|no space left on device|os error 28\b/i.test(
    String(e?.message ?? ""),
  );
}

/**
 * A ledger write refused for want of space on the data disk: a 507 whose sentence names
 * `DORMICE_DATA_DIR`, what could not be recorded and what to do.
 *
 * @example
 * ```ts
 * import { LedgerFullError } from "./ledger_space.ts";
 * const error = new LedgerFullError("/var/lib/dormice", "sandbox 'a'");
 * console.log(error.status); // 507
 * ```
 */
export class LedgerFullError extends HttpError {
  /** The data dir whose disk is full. */
  readonly dataDir: string;
  /**
   * Builds the 507 for one refused write; `what` completes "has no room to record …". Say
   * `reserveSpent` when even the reserve did not make room (then a destroy fails too).
   */
  constructor(dataDir: string, what: string, { reserveSpent = false } = {}) {
    super(
      507,
      `The node's data disk is full: DORMICE_DATA_DIR (${dataDir}) has no room to record ` +
        `${what}${reserveSpent ? ", even with its reserve given up" : ""}. Free space on ` +
        `that disk${reserveSpent ? "" : " (destroying a sandbox still works)"}, or move ` +
        "DORMICE_DATA_DIR to a larger one",
    );
    this.name = "LedgerFullError";
    this.dataDir = dataDir;
  }
}

/**
 * The reserve file of one data dir. `release()` deletes it (once) to make room for a write
 * that frees space; `restore()` writes it again once the disk has room, and is quiet when it
 * has not. Between the two, `spent` is true and the ledger refuses new sandboxes: the room the
 * reserve gave back is kept for destroys.
 *
 * @example
 * ```ts ignore
 * const reserve = new LedgerReserve("/var/lib/dormice");
 * reserve.restore(); // at boot: true once the file is there
 * ```
 */
export class LedgerReserve {
  /** The reserve's path. */
  readonly path: string;
  readonly #bytes: number;
  #spent = true;

  /** A reserve at `<dataDir>/ledger.reserve`; nothing is written until `restore()`. */
  constructor(dataDir: string, bytes: number = LEDGER_RESERVE_BYTES) {
    this.path = join(dataDir, LEDGER_RESERVE_FILE);
    this.#bytes = bytes;
  }

  /** True while the reserve is not on disk (given up, or never written for want of room). */
  get spent(): boolean {
    return this.#spent;
  }

  /**
   * Writes the reserve when it is not there; returns whether it is on disk afterwards. A disk
   * without room leaves no partial file behind.
   *
   * @throws {Error} for anything but a full disk (a data dir the node may not write).
   */
  restore(): boolean {
    if (!this.#spent) return true;
    try {
      if (Deno.statSync(this.path).size === this.#bytes) {
        this.#spent = false;
        return true;
      }
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
    try {
      // Zeros written, not a sparse file: the blocks must really be taken to be given back.
      Deno.writeFileSync(this.path, new Uint8Array(this.#bytes));
      this.#spent = false;
      return true;
    } catch (error) {
      try {
        Deno.removeSync(this.path);
      } catch { /* nothing was created */ }
      if (isDiskFull(error)) return false;
      throw error;
    }
  }

  /** Deletes the reserve; returns whether there was one to give up. */
  release(): boolean {
    if (this.#spent) return false;
    this.#spent = true;
    try {
      Deno.removeSync(this.path);
      return true;
    } catch {
      return false;
    }
  }
}
