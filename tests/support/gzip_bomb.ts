/**
 * A gzip bomb for the liveness test and bench: many MiB of zeros in a few KiB of valid gzip.
 *
 * @module
 */
import zlib from "node:zlib";

const MiB = 1024 * 1024;

/**
 * A valid gzip of `mib` MiB of zeros, built from one compressed MiB repeated: after a full flush
 * deflate starts afresh, so every MiB compresses to the same bytes (~1 KiB).
 */
export function gzipOfZeros(mib: number): Uint8Array<ArrayBuffer> {
  const zeros = new Uint8Array(MiB);
  const piece = zlib.deflateRawSync(zeros, { level: 9, finishFlush: zlib.constants.Z_FULL_FLUSH });
  const out = new Uint8Array(10 + piece.length * mib + 2 + 8);
  out.set([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
  let crc = 0;
  for (let i = 0; i < mib; i++) {
    out.set(piece, 10 + i * piece.length);
    crc = zlib.crc32(zeros, crc);
  }
  let at = 10 + piece.length * mib;
  out.set([3, 0], at); // the last, empty, fixed-Huffman block
  at += 2;
  const view = new DataView(out.buffer);
  view.setUint32(at, crc >>> 0, true);
  view.setUint32(at + 4, (mib * MiB) >>> 0, true);
  return out;
}
