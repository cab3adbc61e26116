"""Flow parameters: pydantic models, so the Prefect UI shows a form and refuses bad input."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from paravt_core.config import PipelineConfig, load_config


class PipelineParams(BaseModel):
    """Which pipeline config to run, with optional `section.key=value` overrides."""

    model_config = ConfigDict(extra="forbid")

    config_path: str = Field("conf/pipeline/tiny.yaml", description="pipeline YAML, relative to the project root")
    overrides: list[str] = Field(default_factory=list, description='e.g. ["sft.max_steps=20", "run.seed=1"]')
    rl_row: str | None = Field(None, description="RL ablation row laid over the rl section, e.g. conf/rl/vanilla_grpo.yaml")

    @model_validator(mode="after")
    def _config_loads(self) -> PipelineParams:
        self.load()  # refuse a bad path or value before any stage starts
        return self

    def load(self) -> PipelineConfig:
        return load_config(self.config_path, self.overrides, self.rl_row)
