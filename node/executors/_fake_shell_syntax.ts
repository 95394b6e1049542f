/**
 * The fake shell's syntax (private): words with quotes and `$VAR`, redirections, and steps joined
 * by `;`, `&&` and `||`, parsed into what `_fake_shell.ts` runs.
 *
 * @module
 */

/** Shell state that a subshell copies. */
export interface Env {
  vars: Map<string, string>;
  cwd: string;
  status: number;
}

export type Part = { lit: string } | { variable: string };
export interface Word {
  parts: Part[];
  quoted: boolean;
}
export type Token =
  | { kind: "word"; word: Word }
  | { kind: "op"; op: ";" | "&&" | "||" | "|" | "&" }
  | { kind: "redir"; fd: 0 | 1 | 2 | "both"; append: boolean; dup?: 1 | 2 };
export interface Redir {
  fd: 0 | 1 | 2 | "both";
  append: boolean;
  dup?: 1 | 2;
  target?: Word;
}
export interface Simple {
  words: Word[];
  redirs: Redir[];
}
export interface Step {
  command: Simple;
  /** How this step is joined to the previous one. */
  after: ";" | "&&" | "||";
}

/** A script the fake shell cannot parse. */
export class ShellSyntaxError extends Error {}

export function tokenize(src: string): Token[] {
  const tokens: Token[] = [];
  let word: Word | null = null;
  const lit = (s: string) => {
    word ??= { parts: [], quoted: false };
    const last = word.parts.at(-1);
    if (last && "lit" in last) last.lit += s;
    else word.parts.push({ lit: s });
  };
  const end = () => {
    if (word) tokens.push({ kind: "word", word });
    word = null;
  };
  const variable = (i: number): number => {
    // i points just after '$'
    const c = src[i];
    if (c === "{") {
      const close = src.indexOf("}", i);
      if (close < 0) throw new ShellSyntaxError("bad substitution: missing '}'");
      word ??= { parts: [], quoted: false };
      word.parts.push({ variable: src.slice(i + 1, close) });
      return close + 1;
    }
    const m = /^(\?|[A-Za-z_][A-Za-z0-9_]*|[0-9])/.exec(src.slice(i));
    if (!m) {
      lit("$");
      return i;
    }
    word ??= { parts: [], quoted: false };
    word.parts.push({ variable: m[1] });
    return i + m[1].length;
  };
  let i = 0;
  while (i < src.length) {
    const c = src[i];
    if (c === " " || c === "\t") {
      end();
      i++;
    } else if (c === "\n" || c === ";") {
      end();
      tokens.push({ kind: "op", op: ";" });
      i++;
    } else if (c === "#" && word === null) {
      while (i < src.length && src[i] !== "\n") i++;
    } else if (c === "&") {
      end();
      if (src[i + 1] === "&") {
        tokens.push({ kind: "op", op: "&&" }), i += 2;
      } else if (src[i + 1] === ">") {
        const append = src[i + 2] === ">";
        tokens.push({ kind: "redir", fd: "both", append });
        i += append ? 3 : 2;
      } else tokens.push({ kind: "op", op: "&" }), i++;
    } else if (c === "|") {
      end();
      if (src[i + 1] === "|") tokens.push({ kind: "op", op: "||" }), i += 2;
      else tokens.push({ kind: "op", op: "|" }), i++;
    } else if (c === ">" || c === "<") {
      let fd: 0 | 1 | 2 = c === "<" ? 0 : 1;
      const w = word as Word | null;
      const only = w && !w.quoted && w.parts.length === 1 && "lit" in w.parts[0]
        ? w.parts[0].lit
        : null;
      if (c === ">" && (only === "1" || only === "2")) {
        fd = only === "1" ? 1 : 2;
        word = null;
      } else end();
      i++;
      let append = false;
      if (c === ">" && src[i] === ">") append = true, i++;
      if (c === ">" && src[i] === "&" && (src[i + 1] === "1" || src[i + 1] === "2")) {
        tokens.push({ kind: "redir", fd, append, dup: src[i + 1] === "1" ? 1 : 2 });
        i += 2;
      } else tokens.push({ kind: "redir", fd, append });
    } else if (c === "'") {
      const close = src.indexOf("'", i + 1);
      if (close < 0) throw new ShellSyntaxError("unexpected EOF while looking for matching `''");
      lit(src.slice(i + 1, close));
      word!.quoted = true;
      i = close + 1;
    } else if (c === '"') {
      lit("");
      word!.quoted = true;
      i++;
      for (;;) {
        if (i >= src.length) {
          throw new ShellSyntaxError("unexpected EOF while looking for matching `\"'");
        }
        const d = src[i];
        if (d === '"') {
          i++;
          break;
        }
        if (d === "\\" && '"\\$`\n'.includes(src[i + 1] ?? "")) {
          if (src[i + 1] !== "\n") lit(src[i + 1]);
          i += 2;
        } else if (d === "$") i = variable(i + 1);
        else lit(d), i++;
      }
    } else if (c === "\\") {
      if (src[i + 1] !== "\n" && i + 1 < src.length) lit(src[i + 1]);
      i += 2;
    } else if (c === "$") {
      i = variable(i + 1);
    } else {
      lit(c);
      i++;
    }
  }
  end();
  return tokens;
}

export function parse(tokens: Token[]): Step[] {
  const steps: Step[] = [];
  let current: Simple = { words: [], redirs: [] };
  let after: Step["after"] = ";";
  let pending: Redir | null = null;
  const finish = (next: Step["after"]) => {
    if (pending) {
      throw new ShellSyntaxError("syntax error near unexpected token: a redirection needs a file");
    }
    if (current.words.length > 0 || current.redirs.length > 0) {
      steps.push({ command: current, after });
    } else if (next !== ";") {
      throw new ShellSyntaxError(`syntax error near unexpected token \`${next}'`);
    }
    current = { words: [], redirs: [] };
    after = next;
  };
  for (const token of tokens) {
    if (token.kind === "word") {
      if (pending) {
        pending.target = token.word;
        current.redirs.push(pending);
        pending = null;
      } else current.words.push(token.word);
    } else if (token.kind === "redir") {
      if (pending) throw new ShellSyntaxError("syntax error: a redirection needs a file");
      const r: Redir = { fd: token.fd, append: token.append, dup: token.dup };
      if (token.dup) current.redirs.push(r);
      else pending = r;
    } else if (token.op === "|" || token.op === "&") {
      throw new ShellSyntaxError(
        `the fake executor does not support '${token.op}' (pipes and background jobs): ` +
          "use ';', '&&' or '||', or run on the docker executor",
      );
    } else finish(token.op);
  }
  finish(";");
  return steps;
}

export function expand(word: Word, env: Env): string {
  return word.parts.map((p) => {
    if ("lit" in p) return p.lit;
    if (p.variable === "?") return String(env.status);
    return env.vars.get(p.variable) ?? "";
  }).join("");
}
