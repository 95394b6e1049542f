/**
 * The small command interpreter of `FakeExecutor` (private). It understands what the E2B SDK and
 * the tests send: builtins (`echo`, `cat`, `ls`, `printf`, `sleep`, `exit`, ...), quotes, `$VAR`,
 * `>`, `>>`, `>&2`, `2>&1`, `<`, `;`, `&&`, `||`, and `bash -c` / `sh -c` wrapping.
 *
 * @module
 */
import { posix } from "node:path";
import { ExecutorError } from "./contract.ts";
import { type FakeFs, fakeHome, fakeUser, shellWording } from "./_fake_fs.ts";
import {
  type Env,
  expand,
  parse,
  ShellSyntaxError,
  type Simple,
  type Step,
  tokenize,
} from "./_fake_shell_syntax.ts";

/** What a running script can touch. */
export interface ShellHost {
  fs: FakeFs;
  /** Writes to the process's stdout (1) or stderr (2) as produced. */
  write(fd: 1 | 2, data: Uint8Array): Promise<void>;
  /** The next stdin chunk, or null at end of input. */
  readStdin(): Promise<Uint8Array | null>;
  /** Aborted when the process is killed. */
  signal: AbortSignal;
  /** Waits while the sandbox is paused. */
  gate(): Promise<void>;
  /** The run-as user. */
  user: string;
  /** The terminal's size now, or `null` when the command has no terminal. */
  tty(): { cols: number; rows: number } | null;
}

/** Thrown by `exit`; ends the current script. */
class Exit {
  constructor(readonly code: number) {}
}

/** Thrown when the process was killed; unwinds everything. */
export class Killed extends Error {
  constructor() {
    super("killed");
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function delay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new Killed());
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(new Killed());
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

type Sink = { fd: 1 | 2 } | { path: string };

/** The per-command context builtins see. */
interface Ctx {
  host: ShellHost;
  env: Env;
  out(text: string | Uint8Array): Promise<void>;
  err(text: string | Uint8Array): Promise<void>;
  stdin(): Promise<Uint8Array | null>;
  /** Where fd 1 or 2 points now (so redirections nest into `bash -c`). */
  sinkOf(fd: 1 | 2): Sink;
}

type Builtin = (args: string[], ctx: Ctx) => Promise<number>;

function fail(ctx: Ctx, cmd: string, path: string, e: unknown): Promise<number> {
  if (e instanceof ExecutorError) {
    return ctx.err(`${cmd}: ${path}: ${shellWording(e)}\n`).then(() => 1);
  }
  throw e;
}

const simpleEscapes: Record<string, number> = {
  n: 10,
  t: 9,
  r: 13,
  "\\": 92,
  a: 7,
  b: 8,
  e: 27,
  f: 12,
  v: 11,
};

/**
 * Bash's backslash escapes as bytes: `\n`, `\t`, ..., `\xHH` (one or two hex digits) and octal
 * (`\NNN` in a printf format, `\0NNN` for `echo -e`). They are bytes, not characters:
 * `printf '\xe2'` writes the one byte 0xE2, which is not UTF-8 on its own, as bash does.
 */
function unescapeBytes(s: string, octal: "printf" | "echo"): Uint8Array {
  const out: number[] = [];
  const octalRe = octal === "printf" ? /^[0-7]{1,3}/ : /^0[0-7]{0,3}/;
  let i = 0;
  while (i < s.length) {
    const at = s.indexOf("\\", i);
    const end = at < 0 ? s.length : at;
    if (end > i) out.push(...encoder.encode(s.slice(i, end)));
    if (at < 0) break;
    const rest = s.slice(at + 1);
    const hex = /^x([0-9a-fA-F]{1,2})/.exec(rest);
    const oct = octalRe.exec(rest);
    if (hex) {
      out.push(parseInt(hex[1], 16));
      i = at + 1 + hex[0].length;
    } else if (oct) {
      const digits = octal === "echo" ? oct[0].slice(1) : oct[0];
      out.push(parseInt(digits || "0", 8) & 0xff);
      i = at + 1 + oct[0].length;
    } else if (rest[0] !== undefined && Object.hasOwn(simpleEscapes, rest[0])) {
      out.push(simpleEscapes[rest[0]]);
      i = at + 2;
    } else {
      out.push(92); // an unknown escape stays as written
      i = at + 1;
    }
  }
  return new Uint8Array(out);
}

function joinBytes(parts: Uint8Array[]): Uint8Array {
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) all.set(p, at), at += p.length;
  return all;
}

/** Bash's printf: escapes in the format are bytes, arguments are text, reused as bash does. */
function printf(format: string, args: string[]): Uint8Array {
  const parts: Uint8Array[] = [];
  let k = 0;
  do {
    let last = 0;
    for (const m of format.matchAll(/%(-?\d*)([sdif%])/g)) {
      parts.push(unescapeBytes(format.slice(last, m.index), "printf"));
      last = m.index + m[0].length;
      const [, width, conv] = m;
      if (conv === "%") {
        parts.push(encoder.encode("%"));
        continue;
      }
      const arg = args[k++] ?? "";
      const text = conv === "s"
        ? arg
        : String(conv === "f" ? Number(arg || 0).toFixed(6) : Math.trunc(Number(arg || 0)));
      const w = Number(width || 0);
      parts.push(encoder.encode(w < 0 ? text.padEnd(-w) : text.padStart(w)));
    }
    parts.push(unescapeBytes(format.slice(last), "printf"));
  } while (k > 0 && k < args.length);
  return joinBytes(parts);
}

const builtins: Record<string, Builtin> = {
  echo: async (args, ctx) => {
    let newline = true;
    let escapes = false;
    while (/^-[neE]+$/.test(args[0] ?? "")) {
      const flag = args.shift()!;
      if (flag.includes("n")) newline = false;
      if (flag.includes("e")) escapes = true;
    }
    const text = args.join(" ") + (newline ? "\n" : "");
    await ctx.out(escapes ? unescapeBytes(text, "echo") : text);
    return 0;
  },
  printf: async (args, ctx) => {
    if (args.length === 0) {
      await ctx.err("printf: usage: printf format [arguments]\n");
      return 2;
    }
    await ctx.out(printf(args[0], args.slice(1)));
    return 0;
  },
  cat: async (args, ctx) => {
    const files = args.filter((a) => a === "-" || !a.startsWith("-"));
    if (files.length === 0) files.push("-");
    let status = 0;
    for (const file of files) {
      if (file === "-") {
        for (let chunk = await ctx.stdin(); chunk; chunk = await ctx.stdin()) await ctx.out(chunk);
        continue;
      }
      try {
        await ctx.out(ctx.host.fs.read(ctx.host.fs.resolve(file, ctx.env.cwd)));
      } catch (e) {
        status = await fail(ctx, "cat", file, e);
      }
    }
    return status;
  },
  ls: async (args, ctx) => {
    const all = args.some((a) => /^-\w*a/.test(a));
    const paths = args.filter((a) => !a.startsWith("-"));
    if (paths.length === 0) paths.push(".");
    let status = 0;
    for (const p of paths) {
      try {
        const abs = ctx.host.fs.resolve(p, ctx.env.cwd);
        const entry = ctx.host.fs.stat(abs);
        if (entry.type !== "dir") {
          await ctx.out(p + "\n");
          continue;
        }
        if (paths.length > 1) await ctx.out(`${p}:\n`);
        const names = ctx.host.fs.list(abs, 1).map((e) => e.name)
          .filter((n) => all || !n.startsWith("."));
        if (names.length > 0) await ctx.out(names.join("\n") + "\n");
      } catch (e) {
        status = await fail(ctx, "ls", `cannot access '${p}'`, e);
      }
    }
    return status;
  },
  sleep: async (args, ctx) => {
    const seconds = Number((args[0] ?? "").replace(/s$/, ""));
    if (!Number.isFinite(seconds) || seconds < 0) {
      await ctx.err(`sleep: invalid time interval '${args[0] ?? ""}'\n`);
      return 1;
    }
    await delay(seconds * 1000, ctx.host.signal);
    return 0;
  },
  exit: async (args, ctx) => {
    const code = args[0] === undefined ? ctx.env.status : Number(args[0]);
    if (!Number.isInteger(code)) {
      await ctx.err(`exit: ${args[0]}: numeric argument required\n`);
      throw new Exit(2);
    }
    throw new Exit(((code % 256) + 256) % 256);
  },
  true: () => Promise.resolve(0),
  false: () => Promise.resolve(1),
  ":": () => Promise.resolve(0),
  pwd: async (_args, ctx) => {
    await ctx.out(ctx.env.cwd + "\n");
    return 0;
  },
  cd: async (args, ctx) => {
    const target = args[0] ?? fakeHome;
    try {
      const abs = ctx.host.fs.resolve(target, ctx.env.cwd);
      if (ctx.host.fs.stat(abs).type !== "dir") {
        throw new ExecutorError("not_dir", `${abs} is not a directory`);
      }
      ctx.env.cwd = abs;
      ctx.env.vars.set("PWD", abs);
      return 0;
    } catch (e) {
      return await fail(ctx, "cd", target, e);
    }
  },
  mkdir: async (args, ctx) => {
    const parents = args.some((a) => /^-\w*p/.test(a));
    let status = 0;
    for (const p of args.filter((a) => !a.startsWith("-"))) {
      try {
        const abs = ctx.host.fs.resolve(p, ctx.env.cwd);
        if (!ctx.host.fs.mkdir(abs, { parents, owner: fakeUser(ctx.host.user) }) && !parents) {
          throw new ExecutorError("exists", `${abs} exists`);
        }
      } catch (e) {
        status = await fail(ctx, "mkdir", `cannot create directory '${p}'`, e);
      }
    }
    return status;
  },
  rm: async (args, ctx) => {
    const flags = args.filter((a) => a.startsWith("-")).join("");
    const recursive = /[rR]/.test(flags);
    const force = flags.includes("f");
    let status = 0;
    for (const p of args.filter((a) => !a.startsWith("-"))) {
      try {
        const abs = ctx.host.fs.resolve(p, ctx.env.cwd);
        if (ctx.host.fs.stat(abs).type === "dir" && !recursive) {
          await ctx.err(`rm: cannot remove '${p}': Is a directory\n`);
          status = 1;
          continue;
        }
        ctx.host.fs.remove(abs);
      } catch (e) {
        if (force && e instanceof ExecutorError && e.code === "not_found") continue;
        status = await fail(ctx, "rm", `cannot remove '${p}'`, e);
      }
    }
    return status;
  },
  ln: async (args, ctx) => {
    const flags = args.filter((a) => a.startsWith("-")).join("");
    const [target, link] = args.filter((a) => !a.startsWith("-"));
    if (!flags.includes("s") || !target || !link) {
      await ctx.err("ln: the fake shell makes symbolic links only: ln -s TARGET LINK\n");
      return 1;
    }
    try {
      const abs = ctx.host.fs.resolve(link, ctx.env.cwd);
      if (flags.includes("f") && ctx.host.fs.exists(abs)) ctx.host.fs.remove(abs);
      ctx.host.fs.symlink(target, abs, fakeUser(ctx.host.user));
      return 0;
    } catch (e) {
      return await fail(ctx, "ln", `failed to create symbolic link '${link}'`, e);
    }
  },
  mv: async (args, ctx) => {
    const paths = args.filter((a) => !a.startsWith("-"));
    if (paths.length !== 2) {
      await ctx.err("mv: the fake shell moves one path: mv SOURCE TARGET\n");
      return 1;
    }
    try {
      const from = ctx.host.fs.resolve(paths[0], ctx.env.cwd);
      let to = ctx.host.fs.resolve(paths[1], ctx.env.cwd);
      if (ctx.host.fs.exists(to) && ctx.host.fs.stat(to).type === "dir") {
        to = posix.join(to, posix.basename(from));
      }
      ctx.host.fs.move(from, to);
      return 0;
    } catch (e) {
      return await fail(ctx, "mv", `cannot move '${paths[0]}'`, e);
    }
  },
  chmod: async (args, ctx) => {
    const [mode, ...paths] = args.filter((a) => !a.startsWith("-"));
    if (!/^[0-7]{3,4}$/.test(mode ?? "") || paths.length === 0) {
      await ctx.err("chmod: the fake shell takes an octal mode: chmod 644 FILE...\n");
      return 1;
    }
    let status = 0;
    for (const p of paths) {
      try {
        ctx.host.fs.chmod(ctx.host.fs.resolve(p, ctx.env.cwd), parseInt(mode, 8));
      } catch (e) {
        status = await fail(ctx, "chmod", `cannot access '${p}'`, e);
      }
    }
    return status;
  },
  touch: async (args, ctx) => {
    let status = 0;
    for (const p of args.filter((a) => !a.startsWith("-"))) {
      try {
        const abs = ctx.host.fs.resolve(p, ctx.env.cwd);
        ctx.host.fs.write(abs, new Uint8Array(), {
          append: true,
          parents: false,
          owner: fakeUser(ctx.host.user),
        });
      } catch (e) {
        status = await fail(ctx, "touch", `cannot touch '${p}'`, e);
      }
    }
    return status;
  },
  env: async (args, ctx) => {
    if (args.length > 0) return runArgv(args, ctx.host, ctx.env, ctx);
    const lines = [...ctx.env.vars].map(([k, v]) => `${k}=${v}\n`).join("");
    await ctx.out(lines);
    return 0;
  },
  export: (args, ctx) => {
    for (const a of args) {
      const eq = a.indexOf("=");
      if (eq > 0) ctx.env.vars.set(a.slice(0, eq), a.slice(eq + 1));
    }
    return Promise.resolve(0);
  },
  unset: (args, ctx) => {
    for (const a of args) ctx.env.vars.delete(a);
    return Promise.resolve(0);
  },
  whoami: async (_args, ctx) => {
    await ctx.out(ctx.host.user + "\n");
    return 0;
  },
  stty: async (args, ctx) => {
    const size = ctx.host.tty();
    if (!size) {
      await ctx.err("stty: 'standard input': Inappropriate ioctl for device\n");
      return 1;
    }
    // Only the size is known; every other setting is accepted and ignored.
    if (args[0] === "size") await ctx.out(`${size.rows} ${size.cols}\n`);
    return 0;
  },
  bash: (args, ctx) => shell(args, ctx),
  sh: (args, ctx) => shell(args, ctx),
};

/** `bash [-l] [-e] -c script` / `bash file` / `bash` reading the script from stdin. */
async function shell(args: string[], ctx: Ctx): Promise<number> {
  const rest = [...args];
  let script: string | undefined;
  while (rest.length > 0 && rest[0].startsWith("-")) {
    const flag = rest.shift()!;
    if (flag.includes("c")) {
      script = rest.shift();
      if (script === undefined) {
        await ctx.err("bash: -c: option requires an argument\n");
        return 2;
      }
      break;
    }
  }
  if (script === undefined && rest.length > 0) {
    try {
      script = decoder.decode(ctx.host.fs.read(ctx.host.fs.resolve(rest[0], ctx.env.cwd)));
    } catch (e) {
      return fail(ctx, "bash", rest[0], e);
    }
  }
  // A child shell: its variables and cwd do not leak back into the parent.
  const child: Env = { vars: new Map(ctx.env.vars), cwd: ctx.env.cwd, status: 0 };
  if (script !== undefined) return runScript(script, ctx.host, child, ctx);
  // Commands from stdin run a line at a time as they arrive, as bash reads a pipe or a
  // terminal (`bash -i` under a pty waits for each line typed).
  const lines = new TextDecoder();
  let pending = "";
  const runLine = (line: string) => runScript(line, ctx.host, child, ctx, { exitEnds: false });
  try {
    for (let c = await ctx.stdin(); c; c = await ctx.stdin()) {
      pending += lines.decode(c, { stream: true });
      for (let nl = pending.indexOf("\n"); nl >= 0; nl = pending.indexOf("\n")) {
        const line = pending.slice(0, nl + 1);
        pending = pending.slice(nl + 1);
        await runLine(line);
      }
    }
    pending += lines.decode();
    if (pending) await runLine(pending);
  } catch (e) {
    if (e instanceof Exit) return e.code;
    throw e;
  }
  return child.status;
}

async function runArgv(argv: string[], host: ShellHost, env: Env, ctx: Ctx): Promise<number> {
  const name = posix.basename(argv[0]);
  const builtin = Object.hasOwn(builtins, name) ? builtins[name] : undefined;
  if (!builtin) {
    await ctx.err(`${argv[0]}: command not found\n`);
    return 127;
  }
  return await builtin(argv.slice(1), { ...ctx, host, env });
}

async function runSimple(command: Simple, host: ShellHost, env: Env, parent: Ctx): Promise<number> {
  const words: string[] = [];
  for (const w of command.words) {
    const value = expand(w, env);
    const onlyVariables = w.parts.every((p) => "variable" in p);
    if (value === "" && !w.quoted && onlyVariables) continue;
    words.push(value);
  }
  const assignments: [string, string][] = [];
  while (words.length > 0 && /^[A-Za-z_][A-Za-z0-9_]*=/.test(words[0])) {
    const a = words.shift()!;
    const eq = a.indexOf("=");
    assignments.push([a.slice(0, eq), a.slice(eq + 1)]);
  }
  if (words.length === 0 && command.redirs.length === 0) {
    for (const [k, v] of assignments) env.vars.set(k, v);
    return 0;
  }

  const sinks: Record<1 | 2, Sink> = { 1: parent.sinkOf(1), 2: parent.sinkOf(2) };
  let stdinData: Uint8Array | null = null;
  for (const r of command.redirs) {
    if (r.dup) {
      if (r.fd !== 0 && r.fd !== "both") sinks[r.fd] = sinks[r.dup];
      continue;
    }
    const target = expand(r.target!, env);
    let path: string;
    try {
      path = host.fs.resolve(target, env.cwd);
      if (r.fd === 0) {
        stdinData = host.fs.read(path);
        continue;
      }
      if (!r.append || !host.fs.exists(path)) {
        host.fs.write(path, new Uint8Array(), { parents: false, owner: fakeUser(host.user) });
      }
    } catch (e) {
      return fail(parent, "bash", target, e);
    }
    if (r.fd === "both") sinks[1] = sinks[2] = { path };
    else sinks[r.fd] = { path };
  }

  const write = async (sink: Sink, data: string | Uint8Array) => {
    if (host.signal.aborted) throw new Killed();
    await host.gate();
    const bytes = typeof data === "string" ? encoder.encode(data) : data;
    if ("fd" in sink) await host.write(sink.fd, bytes);
    else host.fs.write(sink.path, bytes, { append: true, parents: false });
  };
  let stdinUsed = false;
  const ctx: Ctx = {
    host,
    env,
    out: (d) => write(sinks[1], d),
    err: (d) => write(sinks[2], d),
    stdin: () => {
      if (stdinData === null) return parent.stdin();
      if (stdinUsed) return Promise.resolve(null);
      stdinUsed = true;
      return Promise.resolve(stdinData);
    },
    sinkOf: (fd) => sinks[fd],
  };
  if (words.length === 0) return 0;
  const commandEnv: Env = assignments.length === 0
    ? env
    : { ...env, vars: new Map([...env.vars, ...assignments]) };
  return await runArgv(words, host, commandEnv, ctx);
}

/** Runs a script; `exit` ends it with its code, or, with `exitEnds: false`, is thrown on. */
async function runScript(
  script: string,
  host: ShellHost,
  env: Env,
  parent: Ctx,
  { exitEnds = true }: { exitEnds?: boolean } = {},
): Promise<number> {
  let steps: Step[];
  try {
    steps = parse(tokenize(script));
  } catch (e) {
    if (!(e instanceof ShellSyntaxError)) throw e;
    await parent.err(`bash: ${e.message}\n`);
    return 2;
  }
  try {
    for (const step of steps) {
      if (step.after === "&&" && env.status !== 0) continue;
      if (step.after === "||" && env.status === 0) continue;
      if (host.signal.aborted) throw new Killed();
      await host.gate();
      env.status = await runSimple(step.command, host, env, parent);
    }
  } catch (e) {
    if (e instanceof Exit && exitEnds) return e.code;
    throw e;
  }
  return env.status;
}

/**
 * Runs an argv (`["/bin/bash", "-l", "-c", "echo hi"]`, `["echo", "hi"]`) to its end and returns
 * the exit code. Throws {@linkcode Killed} when the host's signal aborts.
 */
export async function runCommand(
  argv: string[],
  host: ShellHost,
  options: { cwd: string; vars: Map<string, string> },
): Promise<number> {
  const env: Env = { vars: options.vars, cwd: options.cwd, status: 0 };
  const root: Ctx = {
    host,
    env,
    out: (d) => host.write(1, typeof d === "string" ? encoder.encode(d) : d),
    err: (d) => host.write(2, typeof d === "string" ? encoder.encode(d) : d),
    stdin: () => host.readStdin(),
    sinkOf: (fd) => ({ fd }),
  };
  if (argv.length === 0) return 0;
  try {
    return await runArgv(argv, host, env, root);
  } catch (e) {
    if (e instanceof Exit) return e.code;
    throw e;
  }
}
