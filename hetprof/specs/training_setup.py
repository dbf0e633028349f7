"""The workload spec's `optimizer` and `data` sections: how the learner steps and where prompts come from.

Both sections only steer a run (`hetprof run`); the planner prices shapes, which neither changes.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from hetprof.errors import SpecError
from hetprof.specs.loader import field, non_negative, positive

LR_SCHEDULES = ("constant", "linear", "cosine")
DATA_FORMATS = ("auto", "jsonl", "json", "parquet", "arrow", "csv")
# Workload fields that name a file: in the spec relative to the spec's folder, in a `--set` typed on
# the command line relative to the current folder, as every other path there.
FILE_FIELDS = ("data.prompts", "data.validation")
MAX_WARMUP = 1 << 24  # optimizer steps; far beyond any run, low enough to stay an integer everywhere


@dataclasses.dataclass
class OptimizerParams:
    """AdamW with a learning-rate schedule and gradient clipping (actor and critic alike).

    The schedule counts optimizer steps (iterations × ppo_epochs × mini_batches): warm-up rises
    linearly from 0 to `training.lr`, then `linear` and `cosine` decay to `min_lr_ratio` × lr by the
    run's last step, as verl and OpenRLHF schedule theirs.
    """

    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], help="AdamW (beta1, beta2)",
                               check=lambda b: len(b) == 2 and all(0 <= x < 1 for x in b),
                               expect="two numbers in [0, 1)")
    eps: float = field(1e-8, help="AdamW epsilon", check=positive, expect="a positive number")
    weight_decay: float = field(0.0, help="AdamW decoupled weight decay", check=non_negative, expect="≥ 0")
    grad_clip: float | None = field(1.0, help="largest global gradient norm (0 or null: no clipping)",
                                    check=non_negative, expect="≥ 0 (0: no clipping)")
    lr_schedule: Literal["constant", "linear", "cosine"] = field("constant", help="learning-rate schedule after warm-up")
    warmup_steps: int = field(0, help="optimizer steps of linear warm-up from 0",
                              check=lambda x: 0 <= x <= MAX_WARMUP, expect=f"an integer in [0, {MAX_WARMUP:,}]")
    min_lr_ratio: float = field(0.0, help="linear/cosine: the last step's lr as a fraction of lr",
                                check=lambda x: 0 <= x <= 1, expect="in [0, 1]")

    @property
    def max_grad_norm(self) -> float | None:
        return self.grad_clip if self.grad_clip else None


@dataclasses.dataclass
class DataParams:
    """Prompt files, the names of their fields, chat templates and the validation split."""

    prompts: str | None = field(None, help="prompt file or saved dataset folder, relative to the spec "
                                "(hetprof run --prompts overrides it; none: the built-in arithmetic set)")
    format: Literal["auto", "jsonl", "json", "parquet", "arrow", "csv"] = field(
        "auto", help="file format (auto: from the file's suffix)")
    prompt_field: str = field("prompt", help="the column holding the prompt: text, or chat turns "
                              "[{role, content}, ...]; a.b names a nested field", check=bool,
                              expect="a non-empty column name")
    answer_field: str = field("answer", help="the column holding the reference answer (may be absent); a.b names "
                              "a nested field (verl's reward_model.ground_truth)", check=bool,
                              expect="a non-empty column name")
    chat_template: bool = field(True, help="wrap each prompt in the tokenizer's chat template when it has one")
    validation: str | None = field(None, help="validation prompt file (same format and fields), relative to the spec")
    validation_size: int = field(0, help="without a validation file: prompts held out of the training file",
                                 check=non_negative, expect="≥ 0")
    eval_every: int = field(0, help="iterations between validation evaluations (0: never)", check=non_negative,
                            expect="≥ 0")
    eval_prompts: int = field(64, help="validation prompts scored per evaluation (the first ones)", check=positive,
                              expect="a positive integer")

    def validate(self) -> None:
        if self.eval_every and not (self.validation or self.validation_size):
            raise SpecError(None, "eval_every", "a validation set too (data.validation or data.validation_size)",
                            self.eval_every)
        if self.validation and self.validation_size:
            raise SpecError(None, "validation_size", "0 when data.validation names a file", self.validation_size)
