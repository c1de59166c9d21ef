"""Run in a vLLM kit's python (imports no kvpool): each request's block hashes, by vLLM.

stdin: a pickled list of ``(prompt, block_size, hash name)``; stdout: a pickled list of each
request's ``block_hashes`` (bytes) as vLLM's ``Request`` computes them when it is built, with
``PYTHONHASHSEED`` (set by the caller) seeding NONE_HASH; ``None`` for an xxhash job where
the kit has no ``xxhash`` package (it is optional in vLLM too).
"""

import importlib.util
import pickle
import sys

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request


def main() -> None:
    jobs = pickle.load(sys.stdin.buffer)
    out = []
    has_xxhash = importlib.util.find_spec("xxhash") is not None
    for i, (prompt, block_size, name) in enumerate(jobs):
        if name.startswith("xxhash") and not has_xxhash:
            out.append(None)
            continue
        hash_fn = get_hash_fn_by_name(name)
        kv_cache_utils.init_none_hash(hash_fn)
        hasher = kv_cache_utils.get_request_block_hasher(block_size, hash_fn)
        request = Request(f"r{i}", prompt, SamplingParams(max_tokens=16), None,
                          block_hasher=hasher)
        out.append([bytes(h) for h in request.block_hashes])
    sys.stdout.buffer.write(pickle.dumps(out))


if __name__ == "__main__":
    main()
