"""SGLang's native ``/generate``.

Which log-probabilities (checked in its source, see ``docs/howto/servers.md``):

- SGLang (``return_logprob``, ``top_logprobs_num``, ``logprob_start_len``): per position a list
  of ``[logprob, token_id, text]``; ``input_top_logprobs`` for the teacher-forced draft. Its
  output log-probs follow the request's temperature unless the server runs with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``: dump SGLang at temperature 1 or set it (the manifest
  records the temperature).
"""

from __future__ import annotations

from .._math._validation import is_integer
from ._http import ServerError
from ._protocol import (
    AlignmentError,
    Generation,
    ServerInfo,
    ServerProtocol,
    rows_from_entries,
    sampling_fields,
    token_id,
)


class SGLangGenerate(ServerProtocol):
    """SGLang's native ``/generate`` (``input_ids``, ``return_logprob``, ``top_logprobs_num``,
    ``logprob_start_len``); the prompt's ids from a local tokenizer (``tokenizer=``)."""

    name = "sglang"
    detect_order = 20

    @classmethod
    def detects(cls, client):
        status, info = client.probe("/get_model_info")
        return status == 200 and isinstance(info, dict) and "model_path" in info

    def _read_info(self):
        status, info = self.client.probe("/get_model_info")
        if status != 200 or not isinstance(info, dict):
            status, info = self.client.probe("/model_info")
        if status != 200 or not isinstance(info, dict):
            raise ServerError(
                f"{self.client.what} {self.client.public}: GET /get_model_info answered {status}: not an SGLang server"
            )
        _, server = self.client.probe("/get_server_info")
        version = server.get("version") if isinstance(server, dict) else None
        return ServerInfo(
            url=self.client.public,
            protocol=self.name,
            engine="sglang",
            version=version,
            model=info.get("model_path"),
            vocab_size=info.get("vocab_size") if is_integer(info.get("vocab_size")) else None,
        )

    def prompt_ids(self, text, chat=True, special=True):
        if self.tokenizer is None:
            return self._local_ids(text, chat)
        return self.tokenizer(text, chat)

    def _call(self, input_ids, max_new_tokens, k, sampling, start):
        body = {
            "input_ids": list(map(int, input_ids)),
            "sampling_params": {"max_new_tokens": int(max_new_tokens), **sampling},
            "return_logprob": True,
            "top_logprobs_num": int(k),
            "logprob_start_len": int(start),
            "return_text_in_logprobs": False,
            "stream": False,
        }
        answer = self.client.post("/generate", body)
        if isinstance(answer, list):
            answer = answer[0] if answer else None
        meta = answer.get("meta_info") if isinstance(answer, dict) else None
        if not isinstance(meta, dict):
            raise ServerError(f"{self.client.what} {self.client.public}/generate: no meta_info in the answer")
        return answer, meta

    @staticmethod
    def _entries(rows, where):
        out = []
        for i, row in enumerate(rows):
            if row is None:
                out.append(None)
                continue
            if not isinstance(row, list):
                raise ServerError(f"{where}, position {i}: expected [[logprob, token_id, text], ...]")
            out.append([(e[1], e[0]) for e in row if isinstance(e, (list, tuple)) and len(e) >= 2])
        return out

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        sampling = sampling_fields(settings)
        sampling["sampling_seed"] = int(seed) % 2**31
        answer, meta = self._call(prompt_ids, max_new_tokens, k, sampling, len(prompt_ids))
        where = f"{self.client.what} {self.client.public}/generate"
        tokens = answer.get("output_ids")
        if not isinstance(tokens, list):
            tokens = [e[1] for e in meta.get("output_token_logprobs") or []]
        tokens = [token_id(t, self.vocab, where) for t in tokens]
        rows = meta.get("output_top_logprobs")
        if not isinstance(rows, list):
            raise ServerError(f"{where}: the server returned no output_top_logprobs")
        if len(rows) != len(tokens):
            raise ServerError(f"{where}: {len(tokens)} tokens but {len(rows)} rows of log-probs")
        values, ids = rows_from_entries(self._entries(rows, where), k, self.vocab, where)
        finish = meta.get("finish_reason")
        return Generation(tokens, values, ids, finish.get("type") if isinstance(finish, dict) else finish, None)

    def score(self, prompt_ids, tokens, k, ends=False, partial=()):
        _, meta = self._call(list(prompt_ids) + list(tokens), 1, k, {"temperature": 0.0}, len(prompt_ids))
        where = f"{self.client.what} {self.client.public}/generate (input_top_logprobs)"
        rows = meta.get("input_top_logprobs")
        if not isinstance(rows, list):
            raise ServerError(f"{where}: the server returned no input_top_logprobs")
        if len(rows) != len(tokens):
            raise AlignmentError(f"{where}: {len(rows)} input positions from logprob_start_len, expected {len(tokens)}")
        return rows_from_entries(self._entries(rows, where), k, self.vocab, where)
