"""The models a server serves, one a language pair: routed by source and target (through a pivot language where no
model translates a pair), loaded when first asked for, the least recently used unloaded past `max_loaded`."""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanomt.core.checkpoint import CheckpointError, checkpoint_weights, file_sha256, find_run_files
from nanomt.core.config import Config, ConfigError, load_config
from nanomt.core.languages import PLACEHOLDERS, language_pair, served_code
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding.shortlist import SHORTLIST
from nanomt.decoding.translate import Translator

log = logging.getLogger("nanomt.serve")


def served_pair(cfg: Config) -> tuple[str, str]:
    """The pair a run is served as when none is given: its config's, else src-tgt (the toy pair's files)."""
    return language_pair(cfg.data) or PLACEHOLDERS


def shortlist_file(model: Model) -> Path | None:
    """A served model's vocabulary shortlist beside its weights, None where it has none."""
    if model.translator is not None and model.path is None:
        directory = model.translator.directory
    else:
        directory = checkpoint_weights(model.path).parent
    path = None if directory is None else directory / SHORTLIST
    return path if path is not None and path.is_file() else None


def has_shortlist(model: Model) -> bool:
    """Whether a served model has a vocabulary shortlist beside its weights."""
    return shortlist_file(model) is not None


def model_fingerprint(model: Model, int8: bool) -> str:
    """A hash of what a model's translations depend on besides the request: its weights (their file's, else the
    tensors'), its tokenizer, its shortlist's table and int8 or not (the sentence cache's key)."""
    h = hashlib.sha256(b"int8" if int8 else b"float")
    if model.path is not None:
        h.update(file_sha256(checkpoint_weights(model.path)).encode())
    else:
        for name, tensor in model.translator.model.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    h.update(model.tokenizer.fingerprint().encode())
    shortlist = shortlist_file(model)
    h.update(b"no shortlist" if shortlist is None else file_sha256(shortlist).encode())
    return h.hexdigest()[:32]


class NoRoute(ValueError):
    """No model, and no two through the pivot language, translates the pair asked for."""


@dataclass(eq=False)
class Model:
    """One pair the server serves: its run's config and tokenizer (read at start), its Translator once loaded. A
    multilingual run is a Model for each target language it serves, each with its code, sharing one Translator
    (loaded by the first of them, the `owner` of the others)."""

    source: str
    target: str
    cfg: Config
    tokenizer: Tokenizer
    path: str | None = None  # None: given loaded (a Translator), never unloaded
    translator: Translator | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    fingerprint: str | None = None  # model_fingerprint, once computed
    code: str | None = None  # a multilingual run's target-language token (>>code<<), given with every request
    owner: Model | None = None  # the Model that loads a multilingual run's weights for all its targets

    @property
    def name(self) -> str:
        return f"{self.source}-{self.target}"


def targets_of(tokenizer: Tokenizer, target: str | None, where: str) -> list[tuple[str, str | None]]:
    """(served target, token code) of each language a run serves: its one target (`target`), or for a
    multilingual run each of its codes (`target` None or 'mul'), or the one `target` names (by its code or the
    code a server lists it by); ValueError naming the run's codes where it has no such target."""
    codes = tokenizer.target_codes
    if not codes:
        return [(target, None)]
    if target in (None, "mul"):
        return [(served_code(c), c) for c in codes]
    found = [c for c in codes if target in (c, served_code(c))]
    if not found:
        raise ValueError(
            f"{where}: a multilingual model with no target language {target}; its codes: {', '.join(codes)}"
        )
    return [(target, found[0])]


def siblings(
    source: str,
    pairs: list[tuple[str, str | None]],
    cfg: Config,
    tokenizer: Tokenizer,
    owner: Model | None = None,
    **kw,
) -> list[Model]:
    """The Models of one run's pairs from `source` (a target that is the source itself left out: a many-to-many
    run's): the first (or `owner`, the run's Model from another source) loads the run, the others share its lock
    and Translator."""
    pairs = [(target, code) for target, code in pairs if target != source] or pairs
    models = []
    for target, code in pairs:
        shared = {} if owner is None else {"owner": owner, "lock": owner.lock}
        models.append(Model(source, target, cfg, tokenizer, code=code, **shared, **kw))
        owner = owner or models[0]
    return models


class ModelSet:
    """The served models by pair; `translator(model)` loads one on first use (the decoding worker calls it)."""

    def __init__(self, models: list[Model], pivot: str = "en", max_loaded: int | None = None, device="cpu", int8=False):
        if not models:
            raise ValueError("no model to serve")
        self.by_pair: dict[tuple[str, str], Model] = {}
        for m in models:
            if (m.source, m.target) in self.by_pair:
                raise ValueError(f"two models translate {m.name}; give each pair one (SRC-TGT=RUN names a run's pair)")
            self.by_pair[(m.source, m.target)] = m
        self.models, self.pivot, self.max_loaded = models, pivot, max_loaded
        self.device, self.int8 = device, int8
        self._loaded: OrderedDict[str, Model] = OrderedDict((m.name, m) for m in models if m.translator is not None)
        self.on_load = self.on_unload = lambda model: None  # metrics hooks

    @classmethod
    def of(cls, translator: Translator, languages: tuple[str, str] | None = None) -> ModelSet:
        """One run, given loaded (a multilingual one: each of its targets)."""
        source, target = languages or served_pair(translator.cfg)
        tokenizer = translator.tokenizer
        asked = languages[1] if languages else None if tokenizer.target_codes else target
        pairs = targets_of(tokenizer, asked, "the model")
        return cls(siblings(source, pairs, translator.cfg, tokenizer, translator=translator))

    @classmethod
    def read(cls, specs, pivot: str, max_loaded: int | None, device: str, int8: bool) -> ModelSet:
        """The runs of `specs` (ModelSpec), each config and tokenizer read now (a run that cannot be read is a
        one-line error naming it), their weights when first used."""
        models, owners = [], {}
        for spec in specs:
            try:
                config_path, tokenizer_dir = find_run_files(spec.path)
                cfg, tokenizer = load_config(config_path), Tokenizer.load(tokenizer_dir)
            except (CheckpointError, ConfigError, OSError, ValueError) as e:
                raise CheckpointError(f"{spec.path}: cannot serve it: {e}") from None
            source, target = served_pair(cfg)
            try:
                pairs = targets_of(
                    tokenizer, spec.target if tokenizer.target_codes else spec.target or target, spec.path
                )
            except ValueError as e:
                raise CheckpointError(str(e)) from None
            # A multilingual run served from several sources (a many-to-many one) is loaded once; a run of one pair
            # named twice is two models, each loaded and unloaded on its own.
            run = owners.get(spec.path) if tokenizer.target_codes else None
            models += siblings(spec.source or source, pairs, cfg, tokenizer, run, path=spec.path)
            owners.setdefault(spec.path, models[-1].owner or models[-1])
        return cls(models, pivot, max_loaded, device, int8)

    @property
    def default(self) -> Model:
        """The model of nanomt's API requests that name no pair: the first one given."""
        return self.models[0]

    def route(self, source: str, target: str) -> list[Model]:
        """The model of the pair, or the two through the pivot language; NoRoute if there are none."""
        if (source, target) in self.by_pair:
            return [self.by_pair[(source, target)]]
        first, second = self.by_pair.get((source, self.pivot)), self.by_pair.get((self.pivot, target))
        if first is not None and second is not None and source != target:
            return [first, second]
        raise NoRoute(f"no model translates {source} to {target} (served: {', '.join(self.pairs())})")

    def pairs(self) -> list[str]:
        return [m.name for m in self.models]

    def targets(self, source: str) -> list[str]:
        """Every target a source reaches, directly or through the pivot."""
        out = []
        for m in self.models:
            if m.source == source:
                out.append(m.target)
            if m.source == source and m.target == self.pivot:
                out += [n.target for n in self.models if n.source == self.pivot and n.target != source]
        return sorted(set(out))

    def sources(self) -> list[str]:
        return sorted({m.source for m in self.models})

    def fingerprint(self, model: Model) -> str:
        """The model's model_fingerprint (its run's, shared by a multilingual run's targets), computed once (a
        weights file is read whole: call it in a thread)."""
        owner = model.owner or model
        if owner.fingerprint is None:
            int8 = owner.translator.int8 if owner.path is None else self.int8
            owner.fingerprint = model_fingerprint(owner, int8)
        return owner.fingerprint

    def translator(self, model: Model) -> Translator:
        """The model's Translator, loaded now if need be (a multilingual run's once, for all its targets); past
        max_loaded runs the least recently used is unloaded."""
        owner = model.owner or model
        with owner.lock:
            if owner.translator is None:
                log.info("loading %s (%s)", owner.name, owner.path)
                translator = Translator.from_checkpoint(owner.path, device=self.device, int8=self.int8)
                for m in self._group(owner):
                    m.translator = translator
                owner.fingerprint = model_fingerprint(owner, self.int8)  # of the weights just read
                # The calibration read now: a damaged file is logged once at load, never a failed request.
                calibrated = translator.calibration is not None
                log.info("loaded %s (%s)", owner.name, "calibrated" if calibrated else "no calibration")
                self.on_load(owner)
            self._loaded[owner.name] = owner
            self._loaded.move_to_end(owner.name)
        while self.max_loaded is not None and len(self._loaded) > self.max_loaded:
            _, old = self._loaded.popitem(last=False)
            if old.path is not None and old is not owner:
                with old.lock:
                    for m in self._group(old):
                        m.translator = None
                log.info("unloaded %s (the least recently used, past --max-loaded %d)", old.name, self.max_loaded)
                self.on_unload(old)
                gc.collect()
        return model.translator

    def _group(self, owner: Model) -> list[Model]:
        """A run's Models: the owner and those that share its Translator."""
        return [m for m in self.models if m is owner or m.owner is owner]
