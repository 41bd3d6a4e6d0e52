"""The analysis on a real Dask cluster (LocalCluster with worker processes over the loopback; no mocks):
bit for bit the single-process path, a worker killed mid-run, and the CLI's local cluster."""

import json
import os
import signal
import socket
import threading
import time

import pytest
from trace_builders import same_rows, split_parts

from cactus_theory import SamplingSettings, analyze_trace, load_trace
from cactus_theory._analysis._engines import connect_scheduler
from cactus_theory._cli import main
from cactus_theory.traces import parse_rules

SAMPLING = {"sampling": SamplingSettings(temperature=1.0, top_k=8, top_p=1.0).as_dict()}
RULES = ("sps", "cactus(delta=0.5)", "cactus-exact(delta=1)", "topk(k=3)")


# --- prompt parts ----------------------------------------------------------------------------


# --- trace sets ----------------------------------------------------------------------------------


# --- merging --------------------------------------------------------------------------------------


# --- the synthetic generator ----------------------------------------------------------------------


# --- Dask ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1")
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.distributed
def test_dask_analysis_equals_the_single_process_path_bit_for_bit(dask_client, tmp_path):
    dirs = split_parts(tmp_path)
    local = analyze_trace(dirs, RULES, ms=(2, 4), n_boot=300, seed=3)
    remote = analyze_trace(dirs, RULES, ms=(2, 4), n_boot=300, seed=3, client=dask_client)
    same_rows(local.rows, remote.rows)
    same_rows(local.trace_rows, remote.trace_rows)
    assert json.dumps([s.as_dict() for s in local.sequences], sort_keys=True) == json.dumps(
        [s.as_dict() for s in remote.sequences], sort_keys=True
    )
    with pytest.raises(ValueError, match="either client"):
        analyze_trace(dirs, RULES, client=dask_client, processes=2)


@pytest.mark.distributed
def test_a_worker_killed_mid_run_loses_and_double_counts_nothing(dask_client, tmp_path):
    trace = load_trace()
    rules = parse_rules("sps,cactus,cactus-exact,mentored", (0.5, 1.0))
    want = analyze_trace(trace, rules, ms=(4, 8), n_boot=200)
    pids = dask_client.run(os.getpid)

    def states(dask_scheduler):
        return [ts.state for key, ts in dask_scheduler.tasks.items() if "shard_statistics" in str(key)]

    killed = {}

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            s = dask_client.run_on_scheduler(states)
            if s.count("memory") >= 1 and s.count("processing") >= 1:
                busy = dask_client.processing()
                victim = next((w for w, keys in busy.items() if keys), None)
                if victim is not None:
                    os.kill(pids[victim], signal.SIGKILL)
                    killed.update(worker=victim, states=s)
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=killer)
    thread.start()
    got = analyze_trace(trace, rules, ms=(4, 8), n_boot=200, client=dask_client)
    thread.join()
    assert killed, "the run finished before a worker could be killed mid-run"
    assert set(dask_client.run(os.getpid).values()) != set(pids.values())  # the nanny restarted it
    same_rows(want.rows, got.rows)
    assert [s.id for s in got.sequences] == sorted(s.id for s in trace)  # each sequence once


@pytest.mark.distributed
def test_cli_workers_runs_a_local_cluster(tmp_path, capsys):
    dirs = split_parts(tmp_path)
    out = tmp_path / "res"
    args = ["analyze", *dirs, "--rules", "sps,cactus", "--delta", "1", "--m", "2", "--quiet", "--no-figures"]
    assert main([*args, "--workers", "2", "--out", str(out)]) == 0
    assert main([*args, "--out", str(tmp_path / "ref")]) == 0
    assert (out / "analysis.csv").read_text() == (tmp_path / "ref" / "analysis.csv").read_text()
    assert main([*args, "--workers", "2", "--processes", "2"]) == 2
    capsys.readouterr()


@pytest.mark.distributed
def test_a_listener_that_is_not_a_scheduler_fails_within_the_timeout():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(4)), daemon=True).start()
    with pytest.raises(ConnectionError, match="not a Dask scheduler"):  # the handshake's timeout, not a hang
        connect_scheduler(f"tcp://127.0.0.1:{server.getsockname()[1]}", timeout=2)
    server.close()


@pytest.mark.distributed
def test_a_refused_or_malformed_scheduler_address_fails_at_once(capsys):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    assert main(["analyze", "--scheduler", f"tcp://127.0.0.1:{port}", "--rules", "sps", "--quiet"]) == 1
    assert "connection refused" in capsys.readouterr().err
    assert main(["analyze", "--scheduler", "inproc://x", "--rules", "sps", "--quiet"]) == 2
    assert "tcp://HOST:PORT" in capsys.readouterr().err


@pytest.mark.distributed
def test_sigterm_while_the_local_cluster_starts_stops_it_whole_in_one_line(tmp_path):
    """A SIGTERM that arrives while ``analyze --workers`` starts its cluster is held until the cluster is up, then
    stops it: one line said, exit 143, no traceback, no worker process left (found by a marker in their
    environment)."""
    import subprocess
    import sys
    import textwrap

    from locations import HANG_GUARD

    dirs = split_parts(tmp_path)
    marker = f"CACTUS_TEST_MARKER_{os.getpid()}_{time.monotonic_ns()}"
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from cactus_theory._analysis import _engines
        real = _engines.local_dask_cluster

        def starting(workers):
            os.kill(os.getpid(), signal.SIGTERM)  # as a user would, while the cluster starts
            return real(workers)

        _engines.local_dask_cluster = starting
        from cactus_theory._cli import main
        sys.exit(main(["analyze", *{dirs!r}, "--rules", "sps", "--m", "2", "--quiet", "--workers", "2"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env={**os.environ, marker: "1"},
    )
    assert done.returncode == 143, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "stopped the local Dask cluster (2 workers)" in done.stderr

    def marked():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    deadline = time.monotonic() + 60
    while marked() and time.monotonic() < deadline:  # a worker's exit is asynchronous: wait, never assume
        time.sleep(0.2)
    assert not marked()
