"""A TEST DOUBLE of an SGLang server -- not SGLang. SGLang needs a GPU and cannot run here.

A real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port) that speaks the
documented native API closely enough to test the client's side of the wire
(shared/reference/sglang.md): ``POST /generate`` with ``input_ids`` and explicit
``sampling_params`` (unknown keys -> HTTP 400, as SGLang 0.5.23), ``GET /health``,
``POST /update_weights_from_disk``, ``/flush_cache``, ``/pause_generation``, ``/continue_generation``. Its
"model" is a deterministic toy: the next token is a hash of the sequence so far and its
log-prob is a fixed function of the token, so tests can check the client returns exactly what
the server sent. Knobs make it fail: answer 503 or drop the connection for the next N
requests, stop answering for good after N generations, delay answers (timeouts), report
unhealthy, lack the pause routes, drip the answer's bytes slowly.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KNOWN_PARAMS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "stop_token_ids",
                "skip_special_tokens", "no_stop_trim", "ignore_eos", "sampling_seed", "custom_params"}
VOCAB = 73


def toy_next(seq: list[int]) -> int:
    h = 7
    for t in seq:
        h = (h * 31 + t) % 1_000_003
    return h % VOCAB


def toy_logprob(tok: int) -> float:
    return -0.1 - (tok % 13) / 10.0


class FakeSGLang:
    def __init__(self, *, pause_routes: bool = True, retraction_key: str = "num_retractions"):
        self.requests: list[tuple[str, dict]] = []
        self.fail_next = 0  # answer 503 this many times
        self.drop_next = 0  # close the connection without an answer this many times
        self.delay = 0.0
        self.drip = 0.0  # seconds between the bytes of an answer (a server that drips slowly)
        self.stop_after: int | None = None  # after this many /generate answers, drop every request (dead server)
        self.generated = 0
        self.healthy = True
        self.pause_routes = pause_routes
        self.retraction_key = retraction_key
        self.weight_version = "default"
        self.flush_busy = 0  # refuse this many flushes (an update's own, /flush_cache): "requests still running"
        self.flushes = 0
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if double.drip and self.path == "/generate":
                    try:
                        for i in range(len(data)):
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            time.sleep(double.drip)
                    except OSError:  # the client hung up
                        return
                    return
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200 if double.healthy else 503, {} if double.healthy else {"error": "starting"})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with double.lock:
                    double.requests.append((self.path, body))
                    dead = (self.path == "/generate" and double.stop_after is not None
                            and double.generated >= double.stop_after)
                    drop = dead or double.drop_next > 0
                    double.drop_next -= drop and not dead
                    fail = not drop and double.fail_next > 0
                    double.fail_next -= fail
                    double.generated += self.path == "/generate" and not drop and not fail
                if drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fail:
                    return self._send(503, {"error": "overloaded"})
                time.sleep(double.delay)
                route = {"/generate": double.generate, "/update_weights_from_disk": double.update,
                         "/flush_cache": double.flush}
                if double.pause_routes:
                    route.update(
                        {"/pause_generation": lambda b: (200, {}), "/continue_generation": lambda b: (200, {})}
                    )
                path = self.path.split("?")[0]
                if path not in route:
                    return self._send(404, {"detail": "Not Found"})
                self._send(*route[path](body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeSGLang":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def flush(self, body: dict):
        with self.lock:
            if self.flush_busy > 0:
                self.flush_busy -= 1
                return 400, {"message": "Cache not flushed because there are pending requests."}
            self.flushes += 1
        return 200, {}

    def generate(self, body: dict):
        """One request, or a batch (``input_ids`` a list of lists, every other field a list with one
        entry per request, as SGLang takes it): a list of answers in order, or the first refusal."""
        ids = body.get("input_ids")
        if not (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            return self._generate_one(body)
        answers = []
        for i in range(len(ids)):
            code, answer = self._generate_one({k: v[i] for k, v in body.items() if v[i] is not None})
            if code != 200:
                return code, answer
            answers.append(answer)
        return 200, answers

    def _generate_one(self, body: dict):
        params = body.get("sampling_params", {})
        unknown = set(params) - KNOWN_PARAMS
        if unknown or "input_ids" not in body:
            return 400, {"error": {"message": f"unknown sampling params {sorted(unknown)} or no input_ids"}}
        seq, out = list(body["input_ids"]), []
        finish = {"type": "length", "length": params.get("max_new_tokens", 128)}
        for _ in range(params.get("max_new_tokens", 128)):
            tok = toy_next(seq)
            seq.append(tok)
            out.append(tok)
            if tok in params.get("stop_token_ids", []):
                finish = {"type": "stop", "matched": tok}
                break
        meta = {
            "id": "x",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "output_token_logprobs": [[toy_logprob(t), t, None] for t in out],
            self.retraction_key: 1,
        }
        return 200, {"text": "", "output_ids": out, "meta_info": meta}

    def update(self, body: dict):
        self.weight_version = body.get("weight_version", "default")
        ok = bool(body.get("model_path"))
        if ok and body.get("flush_cache", True):  # SGLang's default: the update flushes the cache itself
            with self.lock:
                if self.flush_busy > 0:  # loaded, its flush refused (SGLang 0.5.23's answer, word for word)
                    self.flush_busy -= 1
                    return 400, {"success": False, "num_paused_requests": 0, "message": (
                        "Weights were updated, but the cache was not flushed because requests are still running "
                        "or queued. Retract or finish them, then call /flush_cache.")}
                self.flushes += 1
        return 200, {"success": ok, "message": "ok" if ok else "no model_path", "num_paused_requests": 0}
