"""The quality referee's problems spread over a Dask cluster (``evaluate --scheduler tcp://HOST:PORT``, or a
``client=`` of ``evaluate_on_cluster``): each worker loads the model pair once (from the paths or ids given,
with the load options given) and keeps it for every shard it is handed; a shard is one group of problems as
one process decodes them (``batch`` problems, every method on the group, each answer seeded by its problem,
method and sample), so the records are those one process writes, bit for bit where the arithmetic does not
depend on the process (float32 on the Hugging Face engine; llama.cpp at batch 1). The records come back to
this process and go into the one records file, under its lock, as each shard completes; the summary is
computed from them as from one process's.

Several GPUs: start one worker per GPU, each seeing its own (``CUDA_VISIBLE_DEVICES=0 dask worker
tcp://HOST:8786 --nthreads 1``, then ``=1``, ...), and give ``--device cuda``: every worker loads the pair
on its GPU once.
"""

from __future__ import annotations

from .._util._progress import progress_bar
from .._util._records import open_records, resumable_run

__all__ = ["evaluate_on_cluster"]

#: The pairs a worker loaded: {(verifier, draft, options): (verifier triple, draft triple)}.
_PAIRS: dict = {}
#: Problems a shard of the exact referee holds (its answers do not depend on the grouping).
EXACT_SHARD = 8


def _pair(verifier, draft, options):
    """The model pair of this worker, loaded the first time a shard asks for it."""
    from .._models._hf import load_model

    key = (verifier, draft, tuple(sorted(options.items())))
    if key not in _PAIRS:
        _PAIRS[key] = (load_model(verifier, **options), load_model(draft, **options))
    return _PAIRS[key]


def _worker_shard(job) -> list:
    """(on a worker) The records of one shard of problems: the referee run there, with no records file."""
    verifier, draft, options, how, problems, rules, kwargs = job
    v, d = _pair(verifier, draft, options)
    if how == "exact":
        from ._exact_choice import exact_choice_referee

        return exact_choice_referee(v, d, problems, rules, progress=False, **kwargs)
    from ._quality import evaluate_rules

    return evaluate_rules(v, d, problems, rules, progress=False, **kwargs)


def evaluate_on_cluster(
    verifier, draft, problems, rules, *, client, load_options=None, exact=False, out=None, progress=None, **kwargs
) -> list:
    """The quality referee (``evaluate_rules``, or with ``exact`` the exact one, ``exact_choice_referee``) with
    its problems spread over ``client``'s Dask cluster (see the module docstring). ``verifier`` and ``draft``:
    what ``load_model`` takes (paths or ids), loaded on each worker with ``load_options`` (device, dtype,
    engine, ...). ``kwargs``: the referee's own (m, settings, max_new_tokens, samples, seed, batch, drift,
    allow_code_execution, benchmarks, threads...). ``out``: the records file, appended here as shards
    complete. Returns the records in the order one process returns them."""
    from ._exact_choice import KIND as EXACT_KIND
    from ._quality import KIND, _done_records, check_evaluate_limits

    options = dict(load_options or {})
    how = "exact" if exact else "sampled"
    if not problems:
        raise ValueError("problems: give at least one problem (load_problems)")
    if not exact:
        check_evaluate_limits(
            m=kwargs.get("m", 8),
            max_new_tokens=kwargs.get("max_new_tokens", 512),
            batch=kwargs.get("batch", 1),
            samples=kwargs.get("samples", 1),
        )
    rules = [r if isinstance(r, str) else r.describe() for r in rules]
    # one worker loads the pair and says the run's setting (every argument checked there, as one process
    # checks it) before the records file is opened or any shard is sent
    ask = (verifier, draft, options, how, problems, rules, {**kwargs, "_setting_only": True})
    setting = client.submit(_worker_shard, ask, pure=False).result()
    done, (log, held) = {}, open_records(out, EXACT_KIND if exact else KIND, setting)
    key = (lambda r: (r["id"], r["method"])) if exact else (lambda r: (r["id"], r["method"], r["sample"]))
    if log is not None:
        try:
            done = {key(r): r for r in held} if exact else _done_records(held, {p.id: p.digest for p in problems}, out)
        except BaseException:
            log.close()
            raise
    size = EXACT_SHARD if exact else int(kwargs.get("batch", 1))
    groups = [problems[s : s + size] for s in range(0, len(problems), size)]
    jobs = [
        (verifier, draft, options, how, group, rules, kwargs)
        for group in groups
        if not all(_complete(p, done, rules, kwargs, exact) for p in group)
    ]
    bar = progress_bar(total=len(jobs), desc=f"referee on the cluster ({how})", unit="shard", enabled=progress)
    from distributed import as_completed

    futures = [client.submit(_worker_shard, job, pure=False) for job in jobs]
    try:
        with resumable_run(out, lambda: "the shards completed are kept") as run:
            run.bar = bar
            for future in as_completed(futures):
                records = [r for r in future.result() if key(r) not in done]
                if log is not None and records:
                    log.append(records)
                    records = [log.stamped(r) for r in records]
                for r in records:
                    done[key(r)] = r
                bar.update(1)
    finally:
        client.cancel(futures)
        bar.close()
        if log is not None:
            log.close()
    return _ordered(done, problems, rules, kwargs, exact)


def _complete(problem, done, rules, kwargs, exact) -> bool:
    methods = ["verifier alone", *rules]
    if exact:
        return all((problem.id, m) in done for m in methods)
    return all((problem.id, m, k) in done for k in range(int(kwargs.get("samples", 1))) for m in methods)


def _ordered(done, problems, rules, kwargs, exact) -> list:
    """The records in the order one process returns them."""
    from .._models._decode_spec import DecodeSpec

    labels = ["verifier alone", *(DecodeSpec().with_rule(r).label for r in rules)]
    if exact:
        return [done[(p.id, m)] for p in problems for m in labels]
    samples = int(kwargs.get("samples", 1))
    return [done[(p.id, m, k)] for k in range(samples) for m in labels for p in problems]
