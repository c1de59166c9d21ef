"""``kvpool explain``: each scenario shows what its text says, on every backend alike."""

from __future__ import annotations

import importlib.util
import json

import pytest

from kvpool.cli import main
from kvpool.explain import SCENARIOS

BACKENDS = ["spec", "reference"] + (["fast"] if importlib.util.find_spec("numba") else [])


def _steps(name: str, backend: str = "spec"):
    return {s.title: s for s in SCENARIOS[name].run(backend).snapshots}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_backend_shows_the_same_steps(name):
    runs = [SCENARIOS[name].run(b).snapshots for b in BACKENDS]
    for other in runs[1:]:
        assert other == runs[0]


def test_lru_cached_blocks_go_to_the_back_and_others_to_the_front():
    steps = _steps("lru")
    assert steps["finish a"].free_queue == (3, 6, 7, 8, 2, 1)  # tail first; 3 has no hash
    assert steps["finish b"].free_queue == (5, 3, 6, 7, 8, 2, 1, 4)
    assert dict(steps["admit c"].tables)["c"] == ((5, 3, 6, 7),)


def test_sharing_counts_two_references_on_the_shared_prefix():
    steps = _steps("sharing")
    admitted = steps["admit b"]
    a, b = dict(admitted.tables)["a"][0], dict(admitted.tables)["b"][0]
    assert a[:2] == b[:2]
    assert [admitted.block(x).ref_cnt for x in a[:2]] == [2, 2]
    assert [steps["finish a"].block(x).ref_cnt for x in a[:2]] == [1, 1]
    assert "c: 8 of 10 prompt tokens were prefix hits" in steps["admit c"].notes


def test_eviction_removes_a_key_only_when_its_block_is_reallocated():
    steps = _steps("eviction")
    assert not any("BlockRemoved" in e for e in steps["finish a"].events)
    freed = steps["finish a"]
    assert len(freed.hash_table) == 2  # still cached while free
    assert any(e.startswith("BlockRemoved") for e in steps["admit b"].events)
    assert "a2: 4 of 9 prompt tokens were prefix hits" in steps["admit a2"].notes


def test_copy_on_write_copies_the_shared_tail_and_holds_both_ends():
    steps = _steps("copy-on-write")
    admitted = steps["admit b"]
    (a_full, a_mamba), (b_full, b_mamba) = dict(admitted.tables)["a"], \
        dict(admitted.tables)["b"]
    assert a_full[0] == b_full[0] and a_full[1] != b_full[1]
    copies = steps["take_kv_cache_block_copies"].notes
    assert copies == (f"copy block {a_full[1]} -> {b_full[1]} (group 0)",
                      f"copy block {a_mamba[1]} -> {b_mamba[1]} (group 1)")
    assert admitted.block(b_full[1]).ref_cnt == 2  # table + held for the copy
    assert steps["release_copy_endpoints"].block(b_full[1]).ref_cnt == 1


def test_sliding_window_puts_the_null_block_in_place_of_old_blocks():
    snapshots = SCENARIOS["sliding-window"].run("spec").snapshots
    full, window = dict(snapshots[2].tables)["a"]
    assert 0 not in full and window[:2] == (0, 0)
    assert len([b for b in window if b]) < len(full)


def test_the_cli_prints_every_part_of_a_step(capsys):
    assert main(["explain", "lru"]) == 0
    out = capsys.readouterr().out
    for part in ("step 1/6", "free queue", "hash table", "block tables", "events",
                 "BlockStored"):
        assert part in out


def test_png_draws_one_picture_per_step(tmp_path, capsys):
    assert main(["explain", "sharing", "--png", str(tmp_path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    pictures = sorted(tmp_path.glob("sharing-*.png"))
    assert len(pictures) == len(record["steps"]) == 5
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pictures)


def test_png_into_a_file_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["explain", "lru", "--png", str(blocker)]) == 2
    assert "--png" in capsys.readouterr().err


def test_an_unknown_scenario_is_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["explain", "nope"])
    assert info.value.code == 2
