"""A server protocol in one file: the worked example of ``docs/contributing/house.md``, and the test that
adding a protocol needs nothing else (``test_server_protocols``: ``dump --server`` with ``--plugin`` this
file detects it and dumps through it).

The toy API ("toyrpc"): ``GET /toy/identify`` says what the server is; ``POST /toy/tokenize`` gives a
text's ids; ``POST /toy/sample`` samples a continuation with the top-k log-probs of the raw model at each
new position; ``POST /toy/score`` gives them for given tokens (teacher forcing). Each row is a list of
``[token id, log-prob]``."""

from cactus_theory.servers import Generation, ServerError, ServerInfo, ServerProtocol, rows_from_entries, token_id


class ToyRPC(ServerProtocol):
    name = "toyrpc"
    detect_order = 5  # asked before the built-in ones

    @classmethod
    def detects(cls, client):
        status, body = client.probe("/toy/identify")
        return status == 200 and isinstance(body, dict) and body.get("engine") == "toyserve"

    def _read_info(self):
        _, body = self.client.probe("/toy/identify")
        return ServerInfo(
            url=self.client.public,
            protocol=self.name,
            engine=body["engine"],
            version=body["version"],
            model=body["model"],
            vocab_size=body["vocab"],
        )

    def prompt_ids(self, text, chat=True, special=True):
        body = self.client.post("/toy/tokenize", {"text": text, "chat": bool(chat)})
        return [token_id(t, self.vocab, "/toy/tokenize") for t in body["ids"]]

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        where = f"{self.client.public}/toy/sample"
        body = self.client.post(
            "/toy/sample", {"ids": list(map(int, prompt_ids)), "n": int(max_new_tokens), "seed": int(seed), "k": int(k)}
        )
        if len(body["top"]) != len(body["tokens"]):
            raise ServerError(f"{where}: {len(body['tokens'])} tokens but {len(body['top'])} rows")
        values, ids = rows_from_entries(body["top"], k, self.vocab, where)
        return Generation([int(t) for t in body["tokens"]], values, ids, "length")

    def score(self, prompt_ids, tokens, k, ends=False, partial=()):
        where = f"{self.client.public}/toy/score"
        body = self.client.post(
            "/toy/score", {"ids": list(map(int, prompt_ids)), "tokens": list(map(int, tokens)), "k": int(k)}
        )
        return rows_from_entries(body["top"], k, self.vocab, where)
