/**
 * Templates of the Docker executor: which image a sandbox of each template runs, as the
 * operator writes it in `DORMICE_TEMPLATES`.
 *
 * @module
 */

/** The template map when `DORMICE_TEMPLATES` is unset. */
export const DEFAULT_TEMPLATES: string = "base=dormice-base:latest";

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
