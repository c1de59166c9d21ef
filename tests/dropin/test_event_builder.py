"""Optional tier: the drop-in's event builder makes vLLM's own ``BlockStored`` from kvpool's
fields, by name where the fields are the ones it knows (``stored_direct``), equal to what
filtering the fields gives; a group outside the metadata is logged, as vLLM logs it, and
left unannotated. Runs in each kit's python (skipped without one)."""

from __future__ import annotations

import subprocess

import pytest

from dropin.test_scheduler_conformance import PYTHONS, ROOT, kit_env, need

SCRIPT = r"""
import logging
from vllm.distributed import kv_events as ve
from kvpool.vllm.manager import vllm_event_builder

warnings = []
class Catch(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("kvpool.vllm").addHandler(Catch())

builder = vllm_event_builder((("full_attention", None), ("sliding_window", 128)))
stored = builder.keywords["stored"]
assert stored.__name__ == "stored_direct", stored.__name__
names = set(ve.BlockStored.__struct_fields__)

def fields(group):
    return dict(block_hashes=[7, 8], parent_block_hash=6, token_ids=list(range(32)),
                block_size=16, lora_id=3, medium="GPU", lora_name="l", extra_keys=[None, ("x",)],
                group_idx=group, session_id="s", lookahead_token_ids=[[1], [2]], seq=9)

def filtered(group, annotate):
    event = ve.BlockStored(**{k: v for k, v in fields(group).items() if k in names})
    if annotate is not None:
        event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = annotate
    return event

assert stored(**fields(0)) == filtered(0, ("full_attention", None))
assert stored(**fields(1)) == filtered(1, ("sliding_window", 128))
assert stored(**fields(None)) == filtered(None, None) and not warnings
assert stored(**fields(5)) == filtered(5, None)
assert warnings == ["Group index `5` not in KV cache metadata"], warnings
print("ok")
"""


@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_the_builder_names_vllms_fields_and_logs_an_unknown_group(version: str) -> None:
    python = need(version)
    done = subprocess.run([python, "-c", SCRIPT], capture_output=True, text=True,
                          env=kit_env(python), timeout=600, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
