"""Draft kinds: the one place that says what a kind of draft is.

A kind states
- its config fields: a JSON schema per field (besides `kind`) and which fields are required;
- the model it loads: none, the prepared model its `model` field names ("named"), or a model directory of its own
  that a workflow stage makes ("own", with the stage's name in `made_by`);
- how its proposer is built from the target (and that model);
- what one draft step costs, for the cost model (`DraftCost`);
- whether Hugging Face's assisted generation can run it (the peers benchmark);
- which GGUF file its model runs from in the gguf regime (`gguf_model`: its `model`'s file, whole or cut to its first
  `layers`; a kind with weights of its own cannot run there).

The config checks, the workflow's rules, the decode jobs, the cost model and the peers benchmark ask this registry
instead of testing kind names. A new kind is a proposer class plus `register(DraftKind(...))`; a module that does
that can be named under `plugins:` in the study config, so the workflow's jobs import it too. The built-in kinds
are registered by `specdec.drafts.kinds`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping

from ..errors import DraftSpecError


@dataclass(frozen=True)
class DraftCost:
    """What one draft step runs, for the cost model."""

    model: str | None = None  # the prepared model a step runs (profiled under this name)
    dtype: str | None = None  # its dtype, when not the runtime's
    target_layers: int | None = None  # an early exit: the target's own first n layers
    measured: bool = False  # priced at its measured proposal time per token (no model, or a mix of model and none)
    # a one-layer head over the target's features (a feature head): the fit prices a step as one target-shaped layer
    # plus the LM head's rows of its drafting vocabulary (head_vocab; None: the whole vocabulary or its base's)
    head_layer: bool = False
    head_vocab: int | None = None


@dataclass(frozen=True)
class DraftResources:
    """What a kind's build function gets: the target as the job runs it (a model or a session), the width of its
    logits, its EOS ids, a loader of the draft's own model (a model or a session over it; None for kinds that
    load no model), and, where the regime makes them (the gguf regime), sessions over the target's own first n
    layers with its norm and head, sharing its weights (`target_layers(n)`; None: cut a Hugging Face target)."""

    target: Any
    vocab_size: int
    eos_token_ids: frozenset[int]
    draft_model: Callable[[], Any] | None = None
    target_layers: Callable[[int], Any] | None = None


def _no_model_cost(name: str, spec: Mapping) -> DraftCost:
    return DraftCost(measured=True)


def _never(spec: Mapping) -> bool:
    return False


@dataclass(frozen=True)
class DraftKind:
    name: str
    build: Callable[[Mapping, DraftResources], Any]  # (spec, resources) -> a DraftProposer
    fields: Mapping[str, Mapping] = field(default_factory=dict)  # JSON schema of each config field but `kind`
    required: tuple[str, ...] = ()
    model: Literal["named", "own"] | None = None
    made_by: str | None = None  # the workflow stage that makes an "own" model directory
    cost: Callable[[str, Mapping], DraftCost] = _no_model_cost  # (draft name, spec) -> DraftCost
    assisted: Callable[[Mapping], bool] = _never  # (spec) -> can Hugging Face assisted generation run it?
    description: str = ""
    # an "own" model that is the first `layers` layers of its `model` (truncated): the gguf regime runs those layers
    # of that model's GGUF file over the same weights, with no file of its own
    gguf_cut: bool = False
    # an "own" model that is not a prepared Hugging Face model directory: (directory, target) -> the model its build
    # gets from `draft_model`; and (spec, target) -> a fresh untrained one (what training starts from; the shared
    # tests of every kind run it)
    load: Callable[[Any, Any], Any] | None = None
    untrained: Callable[[Mapping, Any], Any] | None = None
    # an "own" model's field that may name another draft of this kind whose model this one loads instead of
    # making its own (a lookup hybrid drafting with a head trained for another draft)
    shared_from: str | None = None

    def __post_init__(self):
        if self.model not in (None, "named", "own"):
            raise ValueError(f"draft kind {self.name!r}: model must be None, 'named' or 'own', got {self.model!r}")
        if (self.model == "own") != (self.made_by is not None):
            raise ValueError(f"draft kind {self.name!r}: a kind with a model of its own names the stage that makes "
                             "it (made_by), and only such a kind does")
        if self.model == "named" and "model" not in self.required:
            raise ValueError(f"draft kind {self.name!r} loads the model its 'model' field names: require it")
        unknown = set(self.required) - set(self.fields)
        if unknown:
            raise ValueError(f"draft kind {self.name!r}: required fields {sorted(unknown)} are not among its fields")
        if self.gguf_cut and (self.model != "own" or not {"model", "layers"} <= set(self.required)):
            raise ValueError(f"draft kind {self.name!r}: a GGUF cut is a model of its own with required 'model' and "
                             "'layers' fields")

    def model_name(self, draft: str, spec: Mapping) -> str | None:
        """The prepared model directory's name this draft loads: its `model` field, its own name, or None."""
        if self.model == "own" and (shared := self.shared_model(spec)):
            return shared
        return {"named": spec.get("model"), "own": draft, None: None}[self.model]

    def makes_own_model(self, spec: Mapping) -> bool:
        """Whether a draft of this kind has a model directory of its own for `made_by` to make."""
        return self.model == "own" and not self.shared_model(spec)

    def shared_model(self, spec: Mapping) -> str | None:
        """The other draft whose model this one loads (its `shared_from` field), or None."""
        return spec.get(self.shared_from) if self.shared_from else None

    def gguf_model(self, draft: str, spec: Mapping) -> tuple[str, int | None] | None:
        """In the gguf regime: (the model under `models` whose GGUF file this draft runs, the number of its first
        layers it keeps or None for all), or None for a kind that loads no GGUF file (no model, or one of its own
        kind that `load` reads in either regime). A kind whose model is its own and
        not a cut of another's (distilled: trained weights) has no GGUF file: DraftSpecError naming the draft."""
        if self.model is None:
            return None
        if self.model == "named":
            return spec["model"], None
        if self.gguf_cut:
            return spec["model"], int(spec["layers"])
        if self.load is not None:  # weights of its own kind (a feature head), loaded the same way in either regime
            return None
        raise DraftSpecError(f"draft {draft!r}: a {self.name!r} draft runs weights of its own (made by the "
                             f"{self.made_by!r} stage, saved as safetensors), which have no GGUF file: it cannot run "
                             "with runtime weights 'gguf'")

    def check_fields(self, spec: Mapping, key: str) -> None:
        """Unknown and missing fields, named by their config key (field values are the schema's job)."""
        for name in spec:
            if name != "kind" and name not in self.fields:
                raise DraftSpecError(f"config key '{key}.{name}': a {self.name!r} draft takes no field {name!r} "
                                     f"(its fields: {', '.join(sorted(self.fields)) or 'none'})")
        missing = [name for name in self.required if name not in spec]
        if missing:
            raise DraftSpecError(f"config key '{key}': a {self.name!r} draft needs {', '.join(map(repr, missing))}")

    def check_value(self, field: str, value: Any, key: str, defs: Mapping | None = None) -> None:
        """One field's value by the JSON schema this kind gives it, resolved against `defs` (the $defs a field may
        $ref: the study's config schema's); DraftSpecError naming the key and the first error."""
        import jsonschema  # here, not at import: the workflow reads the registry at every start-up
        from referencing.exceptions import Unresolvable

        validator = jsonschema.Draft202012Validator({**self.fields[field], "$defs": dict(defs or {})})
        try:
            errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        except Unresolvable as e:
            raise DraftSpecError(f"config key '{key}': its schema refers to {self.fields[field].get('$ref')!r}, "
                                 f"which only the study's config schema defines ({e})") from e
        if errors:
            path = ".".join([key, *map(str, errors[0].absolute_path)])
            raise DraftSpecError(f"config key '{path}': {errors[0].message}")


_KINDS: dict[str, DraftKind] = {}


def register(kind: DraftKind) -> DraftKind:
    """Add a kind; registering the same name again replaces it (a module imported twice)."""
    _KINDS[kind.name] = kind
    return kind


def kind_names() -> list[str]:
    return sorted(_KINDS)


def get_kind(name: str, key: str = "kind") -> DraftKind:
    if name not in _KINDS:
        raise DraftSpecError(f"config key '{key}': unknown draft kind {name!r} (known: {', '.join(kind_names())}; "
                             "a kind of your own is registered by a module named under 'plugins')")
    return _KINDS[name]


def check_spec(spec: Mapping, key: str, defs: Mapping | None = None) -> DraftKind:
    """A draft's spec ({kind, ...fields}) checked whole, before anything is built: a known kind, no unknown or
    missing field, each value by its field's JSON schema (defs: what a field's $ref resolves against). The study's
    config check and the command line both ask this; DraftSpecError naming `key`. Returns the kind."""
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise DraftSpecError(f"config key '{key}': a draft is a mapping with a 'kind', got {spec!r}")
    kind = get_kind(spec["kind"], f"{key}.kind")
    kind.check_fields(spec, key)
    for name, value in spec.items():
        if name != "kind":
            kind.check_value(name, value, f"{key}.{name}", defs)
    return kind


def load_plugins(modules: Iterable[str]) -> None:
    """Import the modules that register kinds of their own (config key `plugins`)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise DraftSpecError(f"config key 'plugins': cannot import {module!r} ({e})") from e


def gguf_draft_source(name: str, spec: Mapping) -> tuple[str, int | None] | None:
    """For a draft in the gguf regime: (the model of `models` whose GGUF file it runs, how many of its first layers
    (None: all)), or None for a kind that loads no model. DraftSpecError, naming the draft, for a kind that cannot
    run here (its weights are its own, e.g. distilled) and for a `dtype` (a GGUF file's tensor types are its weights'
    precision; nothing converts them)."""
    kind = get_kind(spec["kind"], f"draft {name!r}: kind")
    dtype = spec.get("dtype")
    if dtype not in (None, "float32") and kind.model is not None and kind.load is None:
        raise DraftSpecError(f"draft {name!r}: dtype {dtype!r} has no meaning with runtime weights 'gguf' (the draft "
                             "runs its GGUF file's own tensor types); define the draft without 'dtype'")
    return kind.gguf_model(name, spec)
