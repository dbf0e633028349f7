"""Workload spec: the RL job (algorithm, mode, models per role, batch and length shapes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from hetprof.errors import SpecError
from hetprof.specs.loader import field, from_data, non_negative, positive, to_data
from hetprof.specs.models import ModelShape, resolve_model
from hetprof.specs.positions import load_spec
from hetprof.specs.precision import Precision, TaskPrecision, precision_of, stored
from hetprof.specs.training_setup import DataParams, OptimizerParams
from hetprof.specs.vocabulary import TaskKind

LONGEST_DRAWS = 1 << 18  # lengths drawn to estimate the expected longest of a batch
# Size bounds, checked when a spec loads (before any search or worker starts): far above any real
# RL job, and low enough that sizing arrays or loops by them cannot hang or exhaust a machine.
MAX_TOKENS = 1 << 20  # a prompt or response length: a million-token context
MAX_SPREAD = 1000  # a length distribution's std over its mean (RL responses: ~0.3 to 2)
MAX_STALENESS = 64  # async versions ahead; each holds a step of rollouts in memory
MAX_SEQUENCES = 1 << 20  # prompts × responses in one step
MAX_RESPONSES = 4096  # responses sampled per prompt
MAX_PASSES = 1024  # PPO epochs, and mini-batches per epoch
MAX_MICROBATCH_TOKENS = 1 << 24  # packed tokens in one forward: far past any device's memory
# What training recomputes in its backward pass: nothing, each layer's attention core (Megatron's
# selective recomputation), or each whole layer from its input (full). Old files say true / false.
RECOMPUTE = ("none", "selective", "full")


def recompute_mode(value: bool | str) -> str:
    """A recompute setting as one of RECOMPUTE: true / false (the old boolean form) are full / none."""
    if value is True or value is False:
        return "full" if value else "none"
    if value not in RECOMPUTE:
        raise ValueError(f"recompute must be true, false or one of {', '.join(RECOMPUTE)}, got {value!r}")
    return str(value)


def _within(limit: int) -> tuple:
    return (lambda x: 0 < x <= limit), f"a positive number at most {limit:,}"


@dataclasses.dataclass
class LengthDist:
    """A token-length distribution; response lengths are long-tailed in RL, which the planner feels."""

    mean: float = field(help="mean length in tokens", check=_within(MAX_TOKENS)[0], expect=_within(MAX_TOKENS)[1])
    max: int | None = field(None, help="hard cap (defaults to 2 × mean)", check=_within(MAX_TOKENS)[0],
                            expect=_within(MAX_TOKENS)[1])
    dist: Literal["fixed", "uniform", "normal", "lognormal"] = field("fixed", help="shape of the distribution")
    std: float = field(0.0, help="standard deviation (normal, lognormal)", check=lambda x: 0 <= x <= MAX_TOKENS,
                       expect=f"a non-negative number at most {MAX_TOKENS:,}")

    def validate(self) -> None:
        if self.max is not None and self.max < self.mean:
            raise SpecError(None, "max", f"at least the mean ({self.mean})", self.max)
        if self.dist in ("normal", "lognormal") and self.std > MAX_SPREAD * self.mean:
            # the lognormal's sigma squares std/mean: past this it overflows, and no length spreads so
            raise SpecError(None, "std", f"at most {MAX_SPREAD} × the mean ({self.mean})", self.std)

    @property
    def cap(self) -> int:
        return int(self.max if self.max is not None else max(1, round(2 * self.mean)))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n integer lengths in [1, cap], drawn reproducibly from `rng`."""
        if self.dist == "fixed":
            x = np.full(n, self.mean)
        elif self.dist == "uniform":
            x = rng.uniform(1, 2 * self.mean - 1, n)
        elif self.dist == "normal":
            x = rng.normal(self.mean, self.std, n)
        else:
            sigma = np.sqrt(np.log1p((self.std / self.mean) ** 2)) if self.std > 0 else 0.5
            x = rng.lognormal(np.log(self.mean) - sigma**2 / 2, sigma, n)
        return np.clip(np.rint(x), 1, self.cap).astype(int)

    def expected_longest(self, k: int) -> float:
        """The expected longest of `k` lengths: what a batch of k is padded to (Monte Carlo, seeded
        by k, so the planner and the profiler's workload grid agree on it)."""
        k = max(1, int(k))
        if self.dist == "fixed":
            return float(min(self.mean, self.cap))
        groups = max(16, LONGEST_DRAWS // k)
        return float(self.sample(groups * k, np.random.default_rng(k)).reshape(groups, k).max(axis=1).mean())


@dataclasses.dataclass
class ModelRoles:
    """Which model plays each role: a preset (`qwen3-8b`) or a local HF config path."""

    actor: str = field(help="policy model")
    reference: str | None = field(None, help="frozen reference for the KL term (defaults to the actor's shape)")
    critic: str | None = field(None, help="value model (PPO only)")
    reward: str | None = field(None, help="reward model; none = rule-based reward")


@dataclasses.dataclass
class TrainingParams:
    lr: float = field(1e-5, help="learning rate", check=positive, expect="a positive number")
    critic_lr: float = field(1e-5, help="critic learning rate", check=positive, expect="a positive number")
    kl_coef: float = field(0.01, help="KL-to-reference coefficient", check=non_negative, expect="≥ 0")
    clip_eps: float = field(0.2, help="PPO ratio clip", check=positive, expect="a positive number")
    gamma: float = field(1.0, help="discount (PPO GAE)", check=non_negative, expect="≥ 0")
    lam: float = field(0.95, help="GAE lambda", check=non_negative, expect="≥ 0")
    temperature: float = field(1.0, help="sampling temperature", check=positive, expect="a positive number")
    top_p: float = field(1.0, help="nucleus sampling", check=lambda x: 0 < x <= 1, expect="in (0, 1]")
    recompute: bool | Literal["none", "selective", "full"] = field(
        False, help="activation recomputation in training: none; selective (Megatron's: each layer's attention "
        "core replayed in its backward); full (each layer replayed from its stored input); true / false = full / none")
    activation_offload: bool = field(False, help="training moves each layer's stored activations to host memory "
                                     "after its forward and back for its backward (Megatron-core's activation "
                                     "offloading, verl's enable_activation_offload)")
    optimizer_offload: float = field(0.0, help="share of the optimizer's state (fp32 master and moments) held and "
                                     "stepped in host memory: each update copies that share's gradients to the "
                                     "host and its new weights back (Megatron's optimizer_cpu_offload with "
                                     "optimizer_offload_fraction, DeepSpeed's ZeRO-Offload); `hetprof run` does not",
                                     check=lambda x: 0 <= x <= 1, expect="a fraction in [0, 1]")
    use_rollout_logprobs: bool = field(False, help="train on the generator's own log-probs as the old log-probs "
                                       "(skip the actor's log-prob recompute pass)")
    sequence_parallel: int | None = field(
        None, help="fixes the Ulysses sequence-parallel degree: each sequence of the training and log-prob passes "
        "split over this many of their data-parallel ranks, which exchange attention heads by all-to-all in "
        "every layer (verl's ulysses_sequence_parallel_size); none = the planner chooses it per task; `hetprof "
        "run` does not do it", check=positive, expect="a positive integer")
    context_parallel: int | None = field(
        None, help="fixes the context-parallel degree: each pipeline stage of the training and log-prob passes "
        "holds tp × this many GPUs, each with a share of every sequence, passing keys and values around a ring "
        "in every layer (Megatron's context_parallel_size); none = the planner chooses it per task; `hetprof "
        "run` does not do it", check=positive, expect="a positive integer")
    shard_group: int | None = field(None, help="hybrid sharding (HSDP, verl's fsdp_size): a sharded trainer splits "
                                    "its state over groups of this many replicas and replicates it across the "
                                    "groups; none = over all of them", check=positive, expect="a positive integer")
    padded_dispatch: bool = field(False, help="a single controller hands every pass its batch padded to prompt_len.max "
                                  "+ response_len.max through an object store (verl's DataProto put per "
                                  "data-parallel rank), inside the pass's time; `hetprof run` does not")
    max_tokens_per_microbatch: int | None = field(
        None, help="pack sequences without padding into micro-batches of at most this many tokens, in "
        "training and in the reference/critic/reward/log-prob passes; none = padded micro-batches of as many "
        "tokens as the planner chooses per task (the plan report says)",
        check=_within(MAX_MICROBATCH_TOKENS)[0], expect=_within(MAX_MICROBATCH_TOKENS)[1])

    @property
    def recompute_mode(self) -> str:
        """`recompute` as one of RECOMPUTE (none, selective, full)."""
        return recompute_mode(self.recompute)


@dataclasses.dataclass
class GenerationParams:
    """How a vLLM-style engine schedules generation (the hf loop decodes whole padded batches)."""

    max_num_seqs: int = field(256, help="most sequences a vllm engine decodes at once (vLLM's max_num_seqs)",
                              check=positive, expect="a positive integer")
    block_tokens: int = field(16, help="tokens per paged KV-cache block (vLLM's block_size)", check=positive,
                              expect="a positive integer")
    gpu_memory_utilization: float = field(0.9, help="share of each generator GPU's memory the engine may use for "
                                          "weights, workspace and KV cache (vLLM's gpu_memory_utilization)",
                                          check=lambda x: 0 < x <= 1, expect="in (0, 1]")
    partial_rollout: bool = field(False, help="async only: a weight sync interrupts unfinished responses and "
                                  "resumes them after it (verl's partial_rollout), so generation never waits for "
                                  "the step's longest response")


@dataclasses.dataclass
class WorkloadSpec:
    models: ModelRoles = field(help="models per role")
    prompt_len: LengthDist = field(help="prompt length distribution (tokens)")
    response_len: LengthDist = field(help="response length distribution (tokens)")
    algorithm: Literal["ppo", "grpo"] = field("grpo", help="RL algorithm")
    mode: Literal["sync", "async"] = field("sync", help="sync, or async with a staleness bound")
    staleness: int = field(1, help="async: generation may run at most this many weight versions ahead",
                           check=_within(MAX_STALENESS)[0], expect=_within(MAX_STALENESS)[1])
    prompts_per_step: int = field(64, help="prompts per iteration", check=_within(MAX_SEQUENCES)[0],
                                  expect=_within(MAX_SEQUENCES)[1])
    responses_per_prompt: int = field(8, help="responses sampled per prompt", check=_within(MAX_RESPONSES)[0],
                                      expect=_within(MAX_RESPONSES)[1])
    ppo_epochs: int = field(1, help="passes over each batch", check=_within(MAX_PASSES)[0],
                            expect=_within(MAX_PASSES)[1])
    mini_batches: int = field(1, help="optimizer steps per epoch", check=_within(MAX_PASSES)[0],
                              expect=_within(MAX_PASSES)[1])
    precision: Precision | TaskPrecision = field(
        "bf16", help="compute precision of every task (bf16, fp16, fp32, fp8; mixed-precision Adam), or one per "
        "task kind: {generation: fp8, training: fp8} (left out: bf16; inference follows training). fp8 is vLLM's "
        "FP8 weights and KV cache for generation, Transformer Engine's FP8 GEMMs over bf16 weights and fp32 "
        "master weights for training (hetprof/specs/precision.py)")
    training: TrainingParams = field(default_factory=TrainingParams, help="algorithm hyper-parameters")
    generation: GenerationParams = field(default_factory=GenerationParams, help="generation engine limits")
    optimizer: OptimizerParams = field(default_factory=OptimizerParams, help="AdamW, LR schedule, grad clip")
    data: DataParams = field(default_factory=DataParams, help="prompt files, fields, chat template, validation")
    expert_imbalance: float | None = field(
        None, help="MoE models: the busiest expert-parallel rank's routed tokens over the mean (≥ 1) — your "
        "router's measured load statistics, or 1 where routing is forced to balance; unset: the cited figure for "
        "how the model balances (auxiliary loss 1.52, DeepSeek's loss-free bias 1.04)",
        check=lambda x: x is None or 1 <= x <= 64, expect="a number in [1, 64]")
    name: str = field("workload", help="a name for reports")
    base_dir: str | None = field(None, help="(set on load) directory model paths are relative to")

    def validate(self) -> None:
        if self.algorithm == "ppo" and not self.models.critic:
            raise SpecError(None, "models.critic", "a critic model (PPO needs one)", None)
        if self.algorithm == "grpo" and self.models.critic:
            raise SpecError(None, "models.critic", "no critic (GRPO has none)", self.models.critic)
        if self.algorithm == "grpo" and self.responses_per_prompt < 2:
            raise SpecError(None, "responses_per_prompt", "at least 2 (GRPO normalises within a group)",
                            self.responses_per_prompt)
        for role in ("actor", "reference", "critic", "reward"):
            ref = getattr(self.models, role)
            if ref is None:
                continue
            try:
                resolve_model(ref, Path(self.base_dir) if self.base_dir else None)
            except KeyError:
                raise SpecError(None, f"models.{role}", "a model preset or a path to a HF config.json", ref) from None
        if self.sequences_per_step > MAX_SEQUENCES:
            raise SpecError(None, "prompts_per_step", f"prompts × responses at most {MAX_SEQUENCES:,}",
                            self.sequences_per_step)
        budget, longest = self.training.max_tokens_per_microbatch, self.prompt_len.cap + self.response_len.cap
        sp = self.training.sequence_parallel or 1  # a sequence split over sp ranks puts longest/sp tokens on each
        if budget is not None and budget * sp < longest:
            raise SpecError(None, "training.max_tokens_per_microbatch",
                            f"at least the longest sequence over training.sequence_parallel ((prompt_len.cap + "
                            f"response_len.cap) / {sp} = {longest / sp:g})", budget)
        if self.generation.partial_rollout and self.mode != "async":
            raise SpecError(None, "generation.partial_rollout", "false unless mode is async (a sync step has no "
                            "weight sync to interrupt generation)", True)
        if self.sequences_per_step % self.mini_batches:
            raise SpecError(None, "mini_batches", f"a divisor of prompts × responses ({self.sequences_per_step})",
                            self.mini_batches)

    def dtype_of(self, kind: str) -> str:
        """The precision a task of `kind` (generation, inference, training) computes in."""
        return precision_of(self.precision, kind)

    @property
    def weights_dtype(self) -> str:
        """The dtype the trainer keeps its weights in, and what a weight sync sends: the training
        precision's storage dtype (bf16 under FP8: the FP8 copies are derived, vLLM quantizes on load)."""
        return stored(self.dtype_of(TaskKind.TRAINING))

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    def roles(self) -> dict[str, ModelShape]:
        """Model shape per role that exists in this workload (reference defaults to the actor)."""
        base = Path(self.base_dir) if self.base_dir else None
        out = {"actor": resolve_model(self.models.actor, base),
               "reference": resolve_model(self.models.reference or self.models.actor, base)}
        if self.models.critic:
            out["critic"] = resolve_model(self.models.critic, base)
        if self.models.reward:
            out["reward"] = resolve_model(self.models.reward, base)
        return out

    @classmethod
    def load(cls, path: str | Path, overrides: Sequence[str] = ()) -> WorkloadSpec:
        """Read a workload spec, with `--set key.path=value` overrides applied before the checks."""
        def with_base_dir(data: Any) -> Any:
            if isinstance(data, dict) and "base_dir" not in data:
                return {**data, "base_dir": str(Path(path).resolve().parent)}
            return data

        return load_spec(cls, path, with_base_dir, overrides)

    @classmethod
    def from_dict(cls, data: dict, file: str | None = None) -> WorkloadSpec:
        return from_data(cls, data, file=file)

    def to_dict(self) -> dict:
        return to_data(self)
