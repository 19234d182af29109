"""One run of a campaign, resolved once: ``ResolvedRun``.

A run name means nothing without its spec: its config is the control merged with a variant's
changes (and a replicate's seed), its ID hashes that config with the pinned corpus, the pinned
inputs and, for a recipe given by import path, the recipe's training source (its file
without the recipe class's ``predict`` and ``score``). ``CampaignSpec.
resolve_run`` does that work once where a phase starts (a task, a restart check's process, a
CLI command); everything below it receives the ``ResolvedRun`` instead of ``(spec, run)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucampaign.config.parts import RunConfig


@dataclass(frozen=True, kw_only=True)
class RunSize:
    """How many processes a run trains on: ``nodes`` machines of ``gpus_per_node`` processes.

    The spec's ``gpus: N`` is one node of N (the only size launched today); the GPU lock, the
    plan and the report read ``processes``, so a run over several nodes changes only this.
    """

    gpus_per_node: int
    nodes: int = 1

    @property
    def processes(self) -> int:
        """The run's processes (its ranks), one per GPU: the GPU slots it holds."""
        return self.nodes * self.gpus_per_node


def run_size(config: RunConfig) -> RunSize:
    """The size of a run of ``config`` (``gpus: N``: one node of N processes)."""
    return RunSize(gpus_per_node=config.gpus)


@dataclass(frozen=True, kw_only=True)
class ResolvedRun:
    """A run's identity, computed once: its name, config, ID and the hashes behind the ID.

    Attributes:
        name: The run's name in the spec (``control``, a variant, ``<base>.s<seed>``).
        config: The resolved ``RunConfig`` (control + the variant's changes + the seed).
        run_id: ``<name>-<10 hex of config_sha256>``: the run folder and checkpoint prefix.
        config_sha256: Full sha256 over the run's payload (config identity, pinned corpus,
            pinned inputs, recipe file); a checkpoint of another payload is refused.
        recipe_sha256: sha256 of the recipe's source file, which the run's model folder
            records; None for the built-in recipes, whose run IDs do not depend on the
            installed code.
        training_sha256: sha256 of the recipe file without the recipe class's ``predict``
            and ``score`` (what training depends on), part of the payload; None for the
            built-in recipes.
    """

    name: str
    config: RunConfig
    run_id: str
    config_sha256: str
    recipe_sha256: str | None
    training_sha256: str | None = None

    @property
    def size(self) -> RunSize:
        """How many processes it trains on (``size.processes``: its GPU slots)."""
        return run_size(self.config)

    @property
    def device(self) -> str:
        """The device the config asks for (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

        The torch device is chosen from it, and from the GPU lane, by the engine when the run
        starts (``engine.devices.pick_device``): this package does not import torch.
        """
        return self.config.device
