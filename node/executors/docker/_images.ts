/**
 * Images in and out of the Docker engine for moves between nodes: `docker save` streamed out,
 * `docker load` streamed in, push to and pull from a registry. Spoken to the engine's HTTP API
 * with `fetch` over its unix socket, so a save streams straight into the response the holder
 * answers with, and a load reads straight from the request the receiver makes, each bounded by
 * the caller's signal (dockerode buffers neither, but its streams are Node streams the node's
 * `fetch` bodies would need adapting to).
 *
 * @module
 */
import { ExecutorError } from "../contract.ts";
import { withoutImageTags } from "./_load_untagged.ts";

/** The engine's HTTP API over a unix socket. */
export class EngineHttp {
  #client: Deno.HttpClient;
  readonly socketPath: string;

  /** A client on `socketPath`; no call until one is made. */
  constructor(socketPath: string) {
    this.socketPath = socketPath;
    this.#client = Deno.createHttpClient({ proxy: { transport: "unix", path: socketPath } });
  }

  /** One call: `path` with its query, the answer as it came. */
  request(
    method: string,
    path: string,
    init: { body?: ReadableStream<Uint8Array>; headers?: Record<string, string> } = {},
    signal?: AbortSignal,
  ): Promise<Response> {
    return fetch(`http://localhost${path}`, {
      method,
      client: this.#client,
      signal,
      headers: init.headers,
      body: init.body,
    });
  }

  /**
   * One call whose answer must be 2xx; an answer that streams progress (load, push, pull) is
   * read to its end and its `errorDetail` thrown.
   *
   * @throws {ExecutorError} `not_found` for a 404, `unavailable` otherwise.
   */
  async call(
    what: string,
    method: string,
    path: string,
    init: { body?: ReadableStream<Uint8Array>; headers?: Record<string, string> } = {},
    signal?: AbortSignal,
  ): Promise<string> {
    let response: Response;
    try {
      response = await this.request(method, path, init, signal);
    } catch (error) {
      if (signal?.aborted) {
        throw new ExecutorError("timeout", `The Docker engine did not finish ${what} in time`);
      }
      throw new ExecutorError(
        "unavailable",
        `The Docker engine on ${this.socketPath} failed ${what}: ${(error as Error).message}`,
      );
    }
    const text = await response.text();
    if (!response.ok) {
      const message = (() => {
        try {
          return (JSON.parse(text) as { message?: string }).message ?? text;
        } catch {
          return text;
        }
      })().trim().slice(0, 500);
      throw new ExecutorError(
        response.status === 404 ? "not_found" : "unavailable",
        `The Docker engine failed ${what}: ${message}`,
      );
    }
    // Progress answers are one JSON object a line; a failure mid-way is a line with an error.
    for (const line of text.split("\n")) {
      if (!line.includes('"error')) continue;
      try {
        const parsed = JSON.parse(line) as { error?: string; errorDetail?: { message?: string } };
        const message = parsed.errorDetail?.message ?? parsed.error;
        if (message) {
          throw new ExecutorError("unavailable", `The Docker engine failed ${what}: ${message}`);
        }
      } catch (error) {
        if (error instanceof ExecutorError) throw error;
      }
    }
    return text;
  }

  /** The image id (`sha256:…`) and labels of `ref`, or undefined when the engine has none. */
  async inspect(
    ref: string,
    signal?: AbortSignal,
  ): Promise<{ id: string; labels: Record<string, string>; tags: string[] } | undefined> {
    try {
      const text = await this.call(
        `inspecting image ${ref}`,
        "GET",
        `/images/${encodeURIComponent(ref)}/json`,
        {},
        signal,
      );
      const json = JSON.parse(text) as {
        Id: string;
        Config?: { Labels?: Record<string, string> | null };
        RepoTags?: string[] | null;
      };
      return { id: json.Id, labels: json.Config?.Labels ?? {}, tags: json.RepoTags ?? [] };
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") return undefined;
      throw error;
    }
  }

  /** `docker save` of `ref` as a stream. */
  async save(ref: string, signal: AbortSignal): Promise<ReadableStream<Uint8Array>> {
    const response = await this.request(
      "GET",
      `/images/${encodeURIComponent(ref)}/get`,
      {},
      signal,
    );
    if (!response.ok || !response.body) {
      const text = (await response.text()).slice(0, 300);
      throw new ExecutorError(
        response.status === 404 ? "not_found" : "unavailable",
        `The Docker engine failed saving image ${ref}: ${text}`,
      );
    }
    return response.body;
  }

  /**
   * `docker load` of `body`, with every tag it names taken out first (`_load_untagged.ts`):
   * what loads is found by its image id, and no tag this engine has moves.
   */
  async load(body: ReadableStream<Uint8Array>, signal: AbortSignal): Promise<void> {
    await this.call(
      "loading an image another node sent",
      "POST",
      "/images/load?quiet=1",
      { body: withoutImageTags(body), headers: { "content-type": "application/x-tar" } },
      signal,
    );
  }

  /** Tags `ref` as `repo:tag`. */
  async tag(ref: string, repo: string, tag: string, signal?: AbortSignal): Promise<void> {
    const q = new URLSearchParams({ repo, tag });
    await this.call(
      `tagging ${ref} as ${repo}:${tag}`,
      "POST",
      `/images/${encodeURIComponent(ref)}/tag?${q}`,
      {},
      signal,
    );
  }

  /** Removes the tag or image `ref` (an image another tag or a child keeps stays). */
  async untag(ref: string, signal?: AbortSignal): Promise<void> {
    await this.call(
      `removing image ${ref}`,
      "DELETE",
      `/images/${encodeURIComponent(ref)}`,
      {},
      signal,
    )
      .catch((error) => {
        if (!(error instanceof ExecutorError && error.code === "not_found")) throw error;
      });
  }

  /** Pushes `repo:tag` to its registry (no credentials: a registry on loopback). */
  async push(repo: string, tag: string, signal: AbortSignal): Promise<void> {
    await this.call(
      `pushing ${repo}:${tag}`,
      "POST",
      `/images/${encodeURIComponent(repo)}/push?${new URLSearchParams({ tag })}`,
      { headers: { "x-registry-auth": btoa("{}") } },
      signal,
    );
  }

  /** Pulls `repo:tag` from its registry. */
  async pull(repo: string, tag: string, signal: AbortSignal): Promise<void> {
    await this.call(
      `pulling ${repo}:${tag}`,
      "POST",
      `/images/create?${new URLSearchParams({ fromImage: repo, tag })}`,
      { headers: { "x-registry-auth": btoa("{}") } },
      signal,
    );
  }

  /**
   * A new image from `image` with `labels` added, tagged `repo:tag`: a container created (never
   * started) and committed, then removed. Shares every layer with `image`.
   */
  async relabel(
    image: string,
    labels: Record<string, string>,
    repo: string,
    tag: string,
    signal?: AbortSignal,
  ): Promise<void> {
    const created = JSON.parse(
      await this.call(
        `creating a container from ${image} to label it`,
        "POST",
        "/containers/create",
        {
          body: ReadableStream.from([
            new TextEncoder().encode(
              JSON.stringify({ Image: image, HostConfig: { NetworkMode: "none" } }),
            ),
          ]),
          headers: { "content-type": "application/json" },
        },
        signal,
      ),
    ) as { Id: string };
    try {
      const q = new URLSearchParams({ container: created.Id, repo, tag, pause: "false" });
      for (const [k, v] of Object.entries(labels)) {
        q.append("changes", `LABEL ${k}=${JSON.stringify(v)}`);
      }
      await this.call(`committing ${image} as ${repo}:${tag}`, "POST", `/commit?${q}`, {}, signal);
    } finally {
      await this.call(
        `removing the container that labelled ${image}`,
        "DELETE",
        `/containers/${created.Id}?force=true`,
      ).catch(() => {});
    }
  }

  /** Releases the client. */
  close(): void {
    this.#client.close();
  }
}
