/**
 * Templates of the Docker executor: which image a sandbox of each template runs, as the
 * operator writes it in `DORMICE_TEMPLATES`. The fake executor accepts the same names and
 * refuses others with the same sentence, so a test on the fake fails where Docker would.
 *
 * @module
 */
import { ExecutorError } from "../contract.ts";

/**
 * The template map when `DORMICE_TEMPLATES` is unset: `base` is the Debian image with python3,
 * pip, git, curl and sudo that E2B's SDKs expect (`deploy/images/build-base.sh`), `minimal` the
 * 6 MB busybox + bash image the fast tests use (`deploy/images/build-minimal.sh`), and
 * `code-interpreter` (also `code-interpreter-v1`, the default of `@e2b/code-interpreter`) the
 * base plus Jupyter's Python kernel and its server on port 49999
 * (`deploy/images/build-code-interpreter.sh`).
 */
export const DEFAULT_TEMPLATES: string =
  "base=dormice-base:latest,minimal=dormice-minimal:latest," +
  "code-interpreter=dormice-code-interpreter:latest," +
  "code-interpreter-v1=dormice-code-interpreter:latest";

/** The repositories this project's scripts build, by the script that builds them. */
const BUILDERS: Record<string, string> = {
  "dormice-base": "deploy/images/build-base.sh",
  "dormice-code-interpreter": "deploy/images/build-code-interpreter.sh",
  "dormice-minimal": "deploy/images/build-minimal.sh",
};

/**
 * The command that builds `image` locally (a path relative to the repository's root, then the
 * image), or null for an image these scripts do not make. Each script builds any tag of its
 * repository, so `dormice-base:v2` is built by `deploy/images/build-base.sh dormice-base:v2`.
 *
 * @example
 * ```ts
 * import { buildCommandOf } from "@dormice/cluster/docker";
 * console.log(buildCommandOf("dormice-base:latest")); // ["deploy/images/build-base.sh", "dormice-base:latest"]
 * console.log(buildCommandOf("python:3.12")); // null
 * ```
 */
export function buildCommandOf(image: string): [script: string, image: string] | null {
  const slash = image.lastIndexOf("/");
  const colon = image.lastIndexOf(":");
  const repository = colon > slash ? image.slice(0, colon) : image;
  const script = BUILDERS[repository];
  return script ? [script, image] : null;
}

const TEMPLATE_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/**
 * Parses `DORMICE_TEMPLATES` (`base=dormice-base:latest,python=my-python:3`) into a map, or
 * returns a sentence saying what is wrong. Unset or empty means {@link DEFAULT_TEMPLATES}.
 *
 * @example
 * ```ts
 * import { parseTemplates } from "@dormice/cluster/docker";
 * const templates = parseTemplates("base=dormice-base:latest,python=my-python:3");
 * if (typeof templates === "string") throw new Error(templates);
 * console.log(templates.get("python")); // "my-python:3"
 * ```
 */
export function parseTemplates(value: string | undefined): Map<string, string> | string {
  const text = value?.trim() ? value : DEFAULT_TEMPLATES;
  const map = new Map<string, string>();
  for (const raw of text.split(",")) {
    const item = raw.trim();
    if (!item) continue;
    const eq = item.indexOf("=");
    const name = eq === -1 ? "" : item.slice(0, eq).trim();
    const image = eq === -1 ? "" : item.slice(eq + 1).trim();
    if (!name || !image) {
      return `DORMICE_TEMPLATES='${text}' has '${item}', which is not name=image: write e.g. ` +
        `base=dormice-base:latest,python=my-python:3`;
    }
    if (!TEMPLATE_NAME.test(name)) {
      return `DORMICE_TEMPLATES='${text}' names template '${name}': a template name is 1-64 ` +
        `lowercase letters, digits, '.', '_' or '-', starting with a letter or digit`;
    }
    if (/\s/.test(image)) {
      return `DORMICE_TEMPLATES='${text}' gives template '${name}' the image '${image}', which ` +
        `has a space: write a Docker image reference such as dormice-base:latest`;
    }
    if (map.has(name)) {
      return `DORMICE_TEMPLATES='${text}' names template '${name}' twice: keep one`;
    }
    map.set(name, image);
  }
  if (!map.has("base")) {
    return `DORMICE_TEMPLATES='${text}' has no 'base' template: add base=dormice-base:latest ` +
      `(the image deploy/images/build-base.sh builds)`;
  }
  return map;
}

/** The template map of {@linkcode DEFAULT_TEMPLATES}, as an executor given none serves. */
export function defaultTemplates(): Map<string, string> {
  const parsed = parseTemplates(undefined);
  if (typeof parsed === "string") throw new TypeError(parsed);
  return parsed;
}

/**
 * The refusal of a create naming a template the node does not have: `invalid` (a 400), with the
 * one sentence both executors answer.
 *
 * @example
 * ```ts
 * import { unknownTemplateError } from "@dormice/cluster/docker";
 * unknownTemplateError("nope", ["base"]).message;
 * // "Template 'nope' is not known on this node: use one of base (DORMICE_TEMPLATES)"
 * ```
 */
export function unknownTemplateError(template: string, known: Iterable<string>): ExecutorError {
  return new ExecutorError(
    "invalid",
    `Template '${template}' is not known on this node: use one of ${[...known].join(", ")} ` +
      "(DORMICE_TEMPLATES)",
  );
}
