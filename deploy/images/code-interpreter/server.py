#!/usr/bin/env python3
"""The code interpreter of a dormice sandbox: the HTTP server `@e2b/code-interpreter` talks to on
port 49999, in front of Jupyter kernels (Debian's ipykernel, driven by jupyter_client).

Routes (the shapes the official client parses):
  GET    /health                  "OK" once the default context's kernel answers
  POST   /execute                 {code, context_id?, language?, env_vars?} -> newline-delimited
                                  JSON, one line per output as the kernel sends it: stdout,
                                  stderr, result, error, number_of_executions, end_of_execution
  POST   /contexts                {language?, cwd?} -> {id, language, cwd}
  GET    /contexts                [{id, language, cwd}, ...]
  POST   /contexts/<id>/restart   a fresh kernel in the same context
  DELETE /contexts/<id>           stops the context's kernel

One kernel per context; at most DORMICE_CODE_INTERPRETER_MAX_CONTEXTS (8) contexts run at once
(a create past it is a 429 naming what to do). One cell runs at a time in a context; a second
waits for it, at most DORMICE_CODE_INTERPRETER_QUEUE_S (300 s). Settings come from the
environment: DORMICE_CODE_INTERPRETER_PORT (49999), DORMICE_CODE_INTERPRETER_CWD (/home/user).
"""

import datetime
import json
import os
import queue
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("DORMICE_CODE_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = os.environ.get("DORMICE_CODE_INTERPRETER_CWD", os.path.expanduser("~"))
MAX_CONTEXTS = int(os.environ.get("DORMICE_CODE_INTERPRETER_MAX_CONTEXTS", "8"))
QUEUE_S = float(os.environ.get("DORMICE_CODE_INTERPRETER_QUEUE_S", "300"))
# The largest request body read (a cell's code and its env_vars).
BODY_LIMIT = 16 * 1024 * 1024
# How long a kernel may take to start and answer, and a silent helper cell to finish.
KERNEL_READY_S = 60
# Languages this image has a kernel for, by the name the client sends.
KERNELS = {"python": "python3"}
# Kernel data keys, by mime type, as the client's Result reads them; other types go to `extra`.
MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def to_line(message):
    """One message of the /execute stream: compact JSON and a newline, as bytes."""
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


def result_message(content, is_main_result):
    """A `result` line from an execute_result or display_data content."""
    message = {"type": "result", "is_main_result": is_main_result}
    extra = {}
    for mime, value in (content.get("data") or {}).items():
        key = MIME_KEYS.get(mime)
        if key:
            message[key] = value
        else:
            extra[mime] = value
    if extra:
        message["extra"] = extra
    return message


def translate(msg):
    """The /execute lines an iopub message of a cell gives (a list, often empty), and whether the
    cell ended (the kernel went idle)."""
    kind = msg["header"]["msg_type"]
    content = msg.get("content") or {}
    if kind == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return [{"type": name, "text": content.get("text", ""), "timestamp": now_iso()}], False
    if kind == "execute_result":
        return [result_message(content, True)], False
    if kind == "display_data":
        return [result_message(content, False)], False
    if kind == "error":
        return [{
            "type": "error",
            "name": content.get("ename", ""),
            "value": content.get("evalue", ""),
            "traceback": "\n".join(content.get("traceback") or []),
        }], False
    if kind == "execute_input":
        count = content.get("execution_count")
        if count is not None:
            return [{"type": "number_of_executions", "execution_count": count}], False
        return [], False
    if kind == "status" and content.get("execution_state") == "idle":
        return [{"type": "end_of_execution"}], True
    return [], False


class RequestError(Exception):
    """A refusal: its status and the sentence saying what is wrong and what to do."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Context:
    """One kernel, its working directory and its language; one cell at a time."""

    def __init__(self, language, cwd):
        from jupyter_client import KernelManager

        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.busy = threading.Lock()
        self.manager = KernelManager(kernel_name=KERNELS[language])
        self.manager.start_kernel(cwd=cwd)
        self.client = None
        self._connect()

    def _connect(self):
        if self.client is not None:
            self.client.stop_channels()
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=KERNEL_READY_S)
        except RuntimeError as error:
            self.stop()
            raise RequestError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"The {self.language} kernel did not start within {KERNEL_READY_S} s ({error}): "
                "the sandbox may be short of memory; try again or restart the context",
            ) from error

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def restart(self):
        with self._hold():
            self.manager.restart_kernel(now=True)
            self._connect()

    def stop(self):
        try:
            if self.client is not None:
                self.client.stop_channels()
            self.manager.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 -- a kernel already gone is stopped
            pass

    def _hold(self):
        if not self.busy.acquire(timeout=QUEUE_S):
            raise RequestError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"Context {self.id} ran one cell for over {QUEUE_S:.0f} s while this request "
                "waited: restart the context (POST /contexts/<id>/restart) or use another",
            )
        return _Release(self.busy)

    def _silent(self, code):
        """Runs helper code with no output and waits for it (bounded)."""
        msg_id = self.client.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + KERNEL_READY_S
        while time.monotonic() < deadline:
            try:
                reply = self.client.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return

    def execute(self, code, env_vars, emit):
        """Runs one cell, calling emit(line) for each output as it comes. emit returning False
        means the caller went away: the cell is interrupted."""
        with self._hold():
            if env_vars:
                self._silent(
                    "import os as __dormice_os\n"
                    f"__dormice_env = {{k: __dormice_os.environ.get(k) for k in {list(env_vars)!r}}}\n"
                    f"__dormice_os.environ.update({env_vars!r})\n"
                )
            try:
                self._run(code, emit)
            finally:
                if env_vars and self.manager.is_alive():
                    self._silent(
                        "for __k, __v in __dormice_env.items():\n"
                        "    if __v is None: __dormice_os.environ.pop(__k, None)\n"
                        "    else: __dormice_os.environ[__k] = __v\n"
                        "del __dormice_env, __k, __v\n"
                    )

    def _run(self, code, emit):
        msg_id = self.client.execute(code, allow_stdin=False)
        interrupted = False
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not self.manager.is_alive():
                    emit(to_line({
                        "type": "error",
                        "name": "KernelDied",
                        "value": "The kernel stopped while running the cell; it was restarted "
                        "and its variables are gone",
                        "traceback": "",
                    }))
                    emit(to_line({"type": "end_of_execution"}))
                    self.manager.restart_kernel(now=True)
                    self._connect()
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            lines, ended = translate(msg)
            for line in lines:
                if not emit(to_line(line)) and not interrupted:
                    interrupted = True
                    self.manager.interrupt_kernel()
            if ended:
                return


class _Release:
    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.lock.release()


class Contexts:
    """Every context of this sandbox, with a default one per language."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}

    def create(self, language, cwd):
        language = self._language(language)
        cwd = cwd or DEFAULT_CWD
        if not os.path.isdir(cwd):
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"cwd '{cwd}' is not a directory in the sandbox: create it first, or leave cwd "
                f"out for {DEFAULT_CWD}",
            )
        with self.lock:
            if len(self.by_id) >= MAX_CONTEXTS:
                raise RequestError(
                    HTTPStatus.TOO_MANY_REQUESTS,
                    f"This sandbox runs {len(self.by_id)} contexts, its limit "
                    f"(DORMICE_CODE_INTERPRETER_MAX_CONTEXTS={MAX_CONTEXTS}): remove one "
                    "(DELETE /contexts/<id>) first",
                )
            # Reserved under the lock, so parallel creates cannot pass the bound.
            placeholder = object()
            key = "pending-" + str(uuid.uuid4())
            self.by_id[key] = placeholder
        try:
            context = Context(language, cwd)
        finally:
            with self.lock:
                del self.by_id[key]
        with self.lock:
            self.by_id[context.id] = context
        return context

    def default(self, language):
        language = self._language(language)
        with self.lock:
            context = self.defaults.get(language)
            if context is not None and context.id in self.by_id:
                return context
        context = self.create(language, None)
        with self.lock:
            if language in self.defaults and self.defaults[language].id in self.by_id:
                # Another request made it first: keep one.
                del self.by_id[context.id]
                extra, context = context, self.defaults[language]
            else:
                self.defaults[language] = context
                extra = None
        if extra is not None:
            extra.stop()
        return context

    def get(self, context_id):
        with self.lock:
            context = self.by_id.get(context_id)
        if not isinstance(context, Context):
            raise RequestError(
                HTTPStatus.NOT_FOUND,
                f"Context '{context_id}' does not exist in this sandbox: create one with "
                "POST /contexts, or list them with GET /contexts",
            )
        return context

    def remove(self, context_id):
        context = self.get(context_id)
        with self.lock:
            self.by_id.pop(context_id, None)
        context.stop()

    def list(self):
        with self.lock:
            return [c.describe() for c in self.by_id.values() if isinstance(c, Context)]

    @staticmethod
    def _language(language):
        language = (language or "python").strip().lower()
        if language not in KERNELS:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"Language '{language}' has no kernel in this sandbox: use one of "
                f"{', '.join(KERNELS)}",
            )
        return language


CONTEXTS = Contexts()
READY = threading.Event()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "dormice-code-interpreter"

    def log_message(self, format, *args):  # noqa: A002 -- the base class's name
        pass

    def _reply(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            # A body left unread: the connection cannot carry another request.
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, error):
        self._reply(error.status, {"error": error.message})

    def _too_large(self, length):
        return RequestError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"The request body has {length} bytes or more, over the limit of {BODY_LIMIT}: "
            "send less code per cell, or write large data to a file first",
        )

    def _raw_body(self):
        # The port door forwards a body as it streams, so it may come chunked, without a length.
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks, total = [], 0
            while True:
                size_line = self.rfile.readline(1024)
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError as error:
                    raise RequestError(
                        HTTPStatus.BAD_REQUEST, "The request body's chunked framing is broken"
                    ) from error
                if size == 0:
                    # Trailers, up to the blank line.
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > BODY_LIMIT:
                    self.close_connection = True
                    raise self._too_large(total)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(1024)
        length = int(self.headers.get("Content-Length") or 0)
        if length > BODY_LIMIT:
            self.close_connection = True
            raise self._too_large(length)
        return self.rfile.read(length) if length else b""

    def _body(self):
        raw = self._raw_body()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"The request body is not JSON ({error}): send a JSON object"
            ) from error
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "The request body must be a JSON object")
        return body

    def _route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        try:
            if method == "GET" and path == "/health":
                if not READY.is_set():
                    raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "The kernel is starting")
                return self._reply(HTTPStatus.OK, b"OK", "text/plain")
            if method == "POST" and path == "/execute":
                return self._execute(self._body())
            if parts[0] == "contexts":
                return self._contexts(method, parts[1:])
            raise RequestError(
                HTTPStatus.NOT_FOUND,
                f"No route {method} {path}: the code interpreter serves /execute, /contexts "
                "and /health",
            )
        except RequestError as error:
            self._error(error)

    def _contexts(self, method, rest):
        if not rest and method == "GET":
            return self._reply(HTTPStatus.OK, CONTEXTS.list())
        if not rest and method == "POST":
            body = self._body()
            language, cwd = body.get("language"), body.get("cwd")
            for name, value in (("language", language), ("cwd", cwd)):
                if value is not None and not isinstance(value, str):
                    raise RequestError(HTTPStatus.BAD_REQUEST, f"'{name}' must be a string")
            return self._reply(HTTPStatus.OK, CONTEXTS.create(language, cwd).describe())
        if len(rest) == 1 and method == "DELETE":
            CONTEXTS.remove(rest[0])
            return self._reply(HTTPStatus.NO_CONTENT, b"")
        if len(rest) == 2 and rest[1] == "restart" and method == "POST":
            CONTEXTS.get(rest[0]).restart()
            return self._reply(HTTPStatus.NO_CONTENT, b"")
        raise RequestError(
            HTTPStatus.NOT_FOUND,
            f"No route {method} /contexts/{'/'.join(rest)}: use GET or POST /contexts, "
            "DELETE /contexts/<id> or POST /contexts/<id>/restart",
        )

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            raise RequestError(HTTPStatus.BAD_REQUEST, "'code' must be a string: the cell to run")
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, "Give context_id or language, not both"
            )
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
        ):
            raise RequestError(
                HTTPStatus.BAD_REQUEST, "'env_vars' must be an object of string values"
            )
        context = CONTEXTS.get(context_id) if context_id else CONTEXTS.default(language)

        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        state = {"open": True}

        def emit(line):
            if not state["open"]:
                return False
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            except OSError:
                state["open"] = False
            return state["open"]

        try:
            context.execute(code, env_vars, emit)
        except RequestError as error:
            emit(to_line({"type": "error", "name": "ContextBusy", "value": error.message,
                          "traceback": ""}))
        if state["open"]:
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                state["open"] = False
        # The connection stays open for the next request (the port door keeps a pool), unless
        # the client went away.
        if not state["open"]:
            self.close_connection = True

    def do_GET(self):  # noqa: N802 -- http.server's name
        self._route("GET")

    def do_POST(self):  # noqa: N802
        self._route("POST")

    def do_DELETE(self):  # noqa: N802
        self._route("DELETE")


def main():
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True

    def warm():
        try:
            CONTEXTS.default("python")
            READY.set()
        except Exception as error:  # noqa: BLE001 -- said on stderr; /health stays 503
            print(f"code-interpreter: the default python kernel did not start: {error}",
                  file=sys.stderr, flush=True)

    threading.Thread(target=warm, daemon=True).start()
    print(f"code-interpreter: listening on port {PORT}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
