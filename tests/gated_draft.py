"""A test plugin (config key `plugins`): the draft kind `gated_prompt_lookup`, the built-in prompt lookup behind a
gate that the test holds, so that an interruption test can stop a decode job at a moment it chooses instead of one
it guesses.

On its first proposal a job writes `<gate>/<token>.running` (its wildcards, as JSON; the token is the job's own)
and waits until `<gate>/<token>.go` or `<gate>/open` exists; an interrupt ends the wait like any other part of the
job. Past the gate it proposes exactly as `prompt_lookup` with the same fields, so its tables equal a plain lookup
draft's.

Only the workflow's jobs import this module (through `plugins`, with tests/ on PYTHONPATH): imported in the test
process it would add a kind whose proposals block to the shared checks of tests/test_registry.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import uuid
from pathlib import Path

from specdec.drafts import get_kind, register

KIND = "gated_prompt_lookup"
GATE_TIMEOUT_S = 900  # a job whose test died never hangs for good


class GatedDraft:
    def __init__(self, proposer, gate: Path):
        self._proposer, self._gate, self._passed = proposer, gate, False

    def __getattr__(self, name):  # vocab_size, prefill, rollback: the lookup's own
        return getattr(self._proposer, name)

    def propose(self, context, k, sampling, generator):
        if not self._passed:
            self._wait_at_gate()
            self._passed = True
        return self._proposer.propose(context, k, sampling, generator)

    def _wait_at_gate(self) -> None:
        snakemake = getattr(sys.modules.get("__main__"), "snakemake", None)
        wildcards = dict(getattr(snakemake, "wildcards", {}) or {})
        token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # not the pid alone: a later job may reuse it
        running = self._gate / f"{token}.running"
        running.with_suffix(".tmp").write_text(json.dumps(wildcards))
        running.with_suffix(".tmp").rename(running)  # the test never reads a half-written marker
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not ((self._gate / f"{token}.go").exists() or (self._gate / "open").exists()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{KIND}: the gate {self._gate} stayed shut for {GATE_TIMEOUT_S} s")
            time.sleep(0.05)


def _build(spec, resources):
    gate = Path(spec["gate"])
    gate.mkdir(parents=True, exist_ok=True)
    lookup_spec = {key: value for key, value in spec.items() if key != "gate"} | {"kind": "prompt_lookup"}
    return GatedDraft(get_kind("prompt_lookup").build(lookup_spec, resources), gate)


_lookup = get_kind("prompt_lookup")
register(dataclasses.replace(_lookup, name=KIND, build=_build, fields={**_lookup.fields, "gate": {"type": "string"}},
                             required=(*_lookup.required, "gate"),
                             description="prompt lookup that waits at a gate the test opens (tests only)"))
