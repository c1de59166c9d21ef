"""``kvpool simulate --publish`` and ``kvpool subscribe``: the exact index, and bad arguments.

The end-to-end tests run ``simulate --publish`` in a thread over ``ipc://`` (no port to
collide with a parallel test run) and follow it with a :class:`Subscriber`, or with
``kvpool subscribe`` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from kvpool.cli import main
from kvpool.events import replay
from kvpool.wire import Source, Subscriber
from kvpool.workload.simulate import simulate

from .conftest import WAIT_S

SMALL = ["--backend", "spec", "--requests", "12", "--num-blocks", "200"]


def _expected_index():
    events = []
    simulate(backend="spec", num_requests=12, num_blocks=200, warmup=False,
             event_sink=events.extend)
    renumbered = [type(e)(**{**vars(e), "seq": i}) for i, e in enumerate(events)]
    return replay(renumbered)


def _publish_in_thread(args, out):
    def run():
        out["status"] = main(args)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_late_subscriber_rebuilds_the_exact_index_of_a_simulate_publish_run(
        ipc, capsys, monkeypatch):
    """It connects only after every live batch was sent (all lost to it) and replays them."""
    from kvpool.cli import _publish

    sent = threading.Event()
    finish = _publish.Publishing.finish

    def finish_and_signal(self):
        self.publisher.flush()
        sent.set()
        return finish(self)

    monkeypatch.setattr(_publish.Publishing, "finish", finish_and_signal)
    done = threading.Event()
    monkeypatch.setattr(_publish, "_linger", lambda seconds: done.wait(WAIT_S * 6))
    pub_ep, replay_ep = ipc
    out: dict = {}
    thread = _publish_in_thread(["simulate", *SMALL, "--json", "--publish", pub_ep,
                                 "--replay", replay_ep], out)
    try:
        expected = _expected_index()
        assert sent.wait(WAIT_S * 3)
        with Subscriber([Source(pub_ep, replay_ep, "sim")],
                        probe_interval=0.01) as subscriber:
            assert subscriber.run_until(
                lambda: subscriber.index.rank("sim", 0).cache_index() == expected, WAIT_S)
            stats = subscriber.stats()["sim"]
    finally:
        done.set()
        thread.join(WAIT_S)
    assert out["status"] == 0
    record = json.loads(capsys.readouterr().out)
    assert record["publisher"]["published_batches"] == stats.batches
    assert stats.late_joins == 1 and stats.exact and stats.lost_batches == 0


def test_kvpool_subscribe_shows_the_index_of_a_simulate_publish_run(ipc, capsys, monkeypatch):
    """``kvpool subscribe`` in a subprocess follows the run, live or (if it starts late)
    through replay; the publisher lingers until the subscriber has printed its summary."""
    from kvpool.cli import _publish

    done = threading.Event()
    monkeypatch.setattr(_publish, "_linger", lambda seconds: done.wait(WAIT_S * 6))
    pub_ep, replay_ep = ipc
    sub = subprocess.Popen(
        [sys.executable, "-m", "kvpool", "subscribe", pub_ep, "--replay", replay_ep,
         "--json", "--idle-exit", "2", "--duration", str(WAIT_S * 6)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: dict = {}
    thread = _publish_in_thread(["simulate", *SMALL, "--json", "--publish", pub_ep,
                                 "--replay", replay_ep], out)
    try:
        summary_text, err = sub.communicate(timeout=WAIT_S * 7)
    finally:
        sub.kill()
        done.set()
        thread.join(WAIT_S)
    assert out["status"] == 0 and sub.returncode == 0, err
    summary = json.loads(summary_text)
    expected = _expected_index()
    assert summary["keys"] == len(expected) and summary["blocks"] == sum(expected.values())
    published = json.loads(capsys.readouterr().out)["publisher"]
    source = summary["sources"][pub_ep]
    assert source["exact"] and source["batches"] == published["published_batches"]
    assert 0.0 < summary["predicted_hit_rate"] < 1.0


@pytest.mark.parametrize("args, message", [
    (["subscribe", "localhost:5557"], "bad endpoint"),
    (["subscribe", "tcp://127.0.0.1:5557", "--ranks", "0"], "--ranks"),
    (["subscribe", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5560", "--replay",
      "tcp://127.0.0.1:6557"], "one per endpoint"),
    (["subscribe", "tcp://127.0.0.1:5557", "--no-replay", "--replay", "tcp://127.0.0.1:1"],
     "exclude"),
    (["subscribe", "tcp://127.0.0.1:0"], "give the replay endpoint"),
    (["subscribe", "tcp://*:5557"], "cannot connect"),
    (["subscribe"], "required: ENDPOINT"),
    (["subscribe", "tcp://127.0.0.1:5557", "--ranks", "two"], "--ranks"),
    (["subscribe", "tcp://127.0.0.1:5557", "--duration", "-1"], "--duration"),
    (["simulate", *SMALL, "--publish", "tcp://127.0.0.1"], "bad endpoint"),
    (["simulate", *SMALL, "--replay", "tcp://127.0.0.1:6557"], "--replay needs --publish"),
    (["simulate", *SMALL, "--dp-rank", "2"], "--dp-rank needs --publish"),
])
def test_bad_arguments_exit_2_with_one_line(args, message, capsys):
    try:
        status = main(args)
    except SystemExit as exit_:  # argparse's own checks exit from inside parse_args
        status = exit_.code
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err


def test_publishing_on_an_endpoint_in_use_exits_2(monkeypatch, capsys):
    from kvpool.wire import EventPublisher, PublisherConfig

    monkeypatch.setattr("kvpool.wire.publisher.BIND_RETRY_S", 0.05)
    with EventPublisher(PublisherConfig("tcp://127.0.0.1:0")) as taken:
        assert main(["simulate", *SMALL, "--publish", taken.endpoint,
                     "--replay", "tcp://127.0.0.1:0"]) == 2
    assert "cannot bind" in capsys.readouterr().err


def test_the_summary_reports_what_was_published(ipc, capsys):
    pub_ep, replay_ep = ipc
    assert main(["simulate", *SMALL, "--publish", pub_ep, "--replay", replay_ep,
                 "--linger", "0"]) == 0
    out = capsys.readouterr().out
    for label in ("published", "publish time", "queue full", "replays"):
        assert label in out


def test_subscribe_follows_each_rank_on_its_offset_ports():
    from kvpool.cli import build_parser
    from kvpool.cli.subscribe import _sources

    args = build_parser().parse_args(["subscribe", "tcp://127.0.0.1:5557", "--ranks", "3"])
    assert [(s.endpoint, s.replay_endpoint, s.name) for s in _sources(args)] == [
        ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:6557", "tcp://127.0.0.1:5557#dp0"),
        ("tcp://127.0.0.1:5558", "tcp://127.0.0.1:6558", "tcp://127.0.0.1:5557#dp1"),
        ("tcp://127.0.0.1:5559", "tcp://127.0.0.1:6559", "tcp://127.0.0.1:5557#dp2"),
    ]


def test_simulate_hands_over_each_steps_events_without_changing_a_decision():
    batches = []
    published = simulate(backend="reference", num_requests=10, num_blocks=120, warmup=False,
                         event_sink=batches.append)
    plain = simulate(backend="reference", num_requests=10, num_blocks=120, warmup=False)
    assert published.decisions() == plain.decisions()
    seqs = [e.seq for events in batches for e in events]
    assert all(batches) and seqs == list(range(len(seqs)))
    assert len(batches) <= published.steps
