/**
 * A node app for tests that need one in process: an in-memory ledger, the fake executor, no
 * gateway, and a host reading that never changes, so only what a test sets differs between them.
 * It lives in tests/support/node_app.ts, which the benchmarks use too.
 *
 * @module
 */
export { steadySampler, testNodeApp, type TestNodeOptions } from "../tests/support/node_app.ts";
