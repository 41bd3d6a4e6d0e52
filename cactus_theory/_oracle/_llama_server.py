"""A running llama-server as the engine oracle sees it (``LlamaServerEngine``): its rows are its own
post-sampling probabilities (``/completion`` with ``n_probs`` and ``post_sampling_probs``: the law its sampler
chain leaves, the candidates it draws from), and its samples are its own speculative decoding (a server started
with ``--model-draft``), one request per sample with its seed, its counters from the answer's ``timings``
(``draft_n``, ``draft_n_accepted``: kept where one position is tested, the only one then drafted).

What llama-server drafts (read in its source, ``tools/server/server-context.cpp`` and ``common/speculative.cpp``
of the llama.cpp llama-cpp-python 0.3.36 vendors): the first generated token is sampled from the prompt's last
row before any draft; from the second on, its draft model proposes greedy tokens (``common_speculative_draft``:
the draft's top candidate, while its probability reaches ``--draft-p-min``), at most as many as the tokens still
to generate less one, and the verifier samples its own token at each drafted position with the request's
sampler and accepts the draft when the two are equal (``common_sampler_sample_and_accept_n``): sampler-match
verification, lossless, accepting q(argmax p) per drafted token. A request therefore asks for the tested tokens
and one more, so the last tested position can be drafted.

The prompt cache: every request sets ``cache_prompt`` (the server reuses the context's KV and evaluates the
last prompt token again), rows and samples alike, so the first tested row is computed as the samples' is; the
rows of later positions are computed from a cached prefix too (one token fed), while a sample computes them in
its verification batch (the token and the draft after it): llama.cpp's kernels can round differently there, a
floor the oracle measures (``row_drift``) rather than hides. A row or a request that does not answer within
``timeout`` seconds (a stalled server) is an error naming the server.
"""

from __future__ import annotations

from .._math._sampling import SamplingSettings
from .._servers._http import LLAMA_NEUTRAL_SAMPLERS, ServerClient, ServerError
from ._engine import Engine

__all__ = ["LlamaServerEngine"]

#: The llama.cpp samplers a request runs, in llama.cpp's own order (what ``SamplingSettings(chain="llama.cpp")``
#: computes), the others off.
_SAMPLERS = ["top_k", "top_p", "min_p", "temperature"]


class LlamaServerEngine(Engine):
    """A running llama-server (``url``, started with ``--model-draft``) under ``settings`` (its chain must be
    llama.cpp's: the request sets the samplers in that order); ``draft_url``: a llama-server of the draft model
    alone, whose rows the candidate acceptance laws and a rule that is not lossless need; ``n_probs``: the
    probabilities a row asks for (at least the top-k, so the candidates' whole law comes back); ``timeout``:
    seconds a request may take before the server is called stalled. See the module docstring."""

    first_drafted = 1
    drafted = (
        "llama-server samples the first token from the prompt's last row before any draft; from the second on, its "
        "draft model's greedy tokens, each verified by matching the verifier's own sample"
    )

    def __init__(self, url, *, settings=None, draft_url=None, n_probs=None, timeout=60.0, m=None):
        self.settings = settings or SamplingSettings(chain="llama.cpp", min_p=0.05)
        if self.settings.steps != SamplingSettings(chain="llama.cpp").steps:
            raise ValueError(
                f"settings: llama-server samples with llama.cpp's chain (top-k, top-p, min-p, temperature); got "
                f"{self.settings.chain_name}: give chain='llama.cpp'"
            )
        self.url, self.draft_url, self.timeout, self.m = url, draft_url, float(timeout), m
        self.n_probs = int(n_probs) if n_probs is not None else max(self.settings.top_k, 1) + 20
        self._clients = None

    def _client(self, which):
        if self._clients is None:
            self._clients = {
                "verifier": ServerClient(self.url, timeout=self.timeout, retries=1, what="--server"),
                "draft": ServerClient(self.draft_url, timeout=self.timeout, retries=1, what="--draft-server")
                if self.draft_url
                else None,
            }
        return self._clients[which]

    def for_worker(self):
        return LlamaServerEngine(
            self.url,
            settings=self.settings,
            draft_url=self.draft_url,
            n_probs=self.n_probs,
            timeout=self.timeout,
            m=self.m,
        )

    def _body(self, prefix, n_predict, seed, n_probs):
        s = self.settings
        return {
            "prompt": [int(t) for t in prefix],
            "n_predict": int(n_predict),
            "n_probs": int(n_probs),
            "post_sampling_probs": True,
            "return_tokens": True,
            "cache_prompt": True,
            "stream": False,
            "seed": int(seed),
            "temperature": float(s.temperature),
            "top_k": int(s.top_k),
            "top_p": float(s.top_p),
            "min_p": float(s.min_p),
            "samplers": list(_SAMPLERS),
            **LLAMA_NEUTRAL_SAMPLERS,
        }

    def _ask(self, which, body):
        client = self._client(which)
        try:
            answer = client.post("/completion", body)
        except ServerError as exc:
            if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                raise ServerError(
                    f"{client.what} {client.public}: no answer within {self.timeout:g} s (a stalled server?)"
                ) from None
            raise
        if not isinstance(answer, dict):
            raise ServerError(f"{client.what} {client.public}/completion: the answer is not a JSON object")
        return answer

    def _row(self, which, prefix):
        answer = self._ask(which, self._body(prefix, 1, 0, self.n_probs))
        where = f"{self._client(which).what} {self._client(which).public}/completion"
        probs = answer.get("completion_probabilities")
        if not isinstance(probs, list) or not probs or not isinstance(probs[0], dict):
            raise ServerError(f"{where}: no probabilities in the answer (is n_probs ignored?)")
        top = probs[0].get("top_probs")
        if not isinstance(top, list) or not top:
            raise ServerError(
                f"{where}: no post-sampling probabilities ('top_probs'): the server ignores post_sampling_probs or "
                "n_probs"
            )
        row = {}
        for entry in top:
            if not isinstance(entry, dict) or "id" not in entry or "prob" not in entry:
                raise ServerError(f"{where}: a top_probs entry is not {{id, prob}}")
            row[int(entry["id"])] = float(entry["prob"])
        if len(row) >= self.n_probs:
            raise ServerError(
                f"{where}: all {self.n_probs} probabilities asked for came back: the law may hold more tokens than "
                "n_probs returns; ask for more (n_probs) or sample with a smaller top-k"
            )
        return row

    def rows(self, prefix):
        key = tuple(int(t) for t in prefix)
        kept = self.__dict__.setdefault("_rows", {})
        if key not in kept:
            kept[key] = (self._row("verifier", key), self._row("draft", key) if self.draft_url else None)
        return kept[key]

    def sample(self, context, tokens, seed):
        answer = self._ask("verifier", self._body(context, tokens + 1, seed, 0))
        got = answer.get("tokens")
        if not isinstance(got, list):
            raise ServerError(f"{self._client('verifier').public}/completion: no 'tokens' in the answer")
        timings = answer.get("timings") or {}
        counters = None
        # a request of one tested token drafts that token alone (at most the tokens left less one): its counters
        # are the first drafted position's; longer requests draft at several positions, which the totals mix
        if "draft_n" in timings and tokens == self.first_drafted + 1:
            counters = {"drafted": int(timings["draft_n"]), "accepted": int(timings.get("draft_n_accepted", 0))}
        return [int(t) for t in got[:tokens]], counters

    def setting(self) -> dict:
        info = {}
        for which in ("verifier", "draft"):
            client = self._client(which)
            if client is None:
                continue
            status, props = client.probe("/props")
            if status == 200 and isinstance(props, dict):
                info[which] = {
                    "model": props.get("model_path") or props.get("model_alias"),
                    "build": props.get("build_info"),
                }
        return {
            "engine": "llama-server",
            "servers": info,
            "sampling": self.settings.as_dict(),
            "n_probs": self.n_probs,
            "draft_rows": bool(self.draft_url),
        }

    def close(self) -> None:
        if self._clients:
            for client in self._clients.values():
                if client is not None:
                    client.close()
        self._clients = None
