/**
 * A small seeded generator (mulberry32) for tests whose inputs are drawn at random: the same seed
 * gives the same draws on every run, so a red case can be replayed.
 *
 * @module
 */

/** Uniform draws in [0, 1) from `seed`. */
export function seeded(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
