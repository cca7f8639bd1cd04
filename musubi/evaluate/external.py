"""The external-job contract: JOB/eval.json written by another program, validated field by field.

Contract (keys other than these are kept as they are):

    {"metrics": {"map50": 0.41, ...},        # required: name -> finite number
     "primary_metric": "map50",              # optional: defaults to map50 / top1 / val_acc, or the only metric
     "fps": 87.5 | {"fps": 87.5, ...},       # optional: measured by the program (its protocol kept verbatim)
     "input_shape": [1, 3, 640, 640],        # optional: fills symbolic axes of model.onnx for the FPS run
     "dataset_hash": "..."}                  # optional: the data version, for the registry
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from musubi.config.load import format_validation_error
from musubi.contract.errors import ConfigError
from musubi.evaluate.score import KNOWN_PRIMARY

#: An eval.json larger than this is refused unread (it is a few hundred bytes).
MAX_EVAL_BYTES = 1 << 20

Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class ExternalFps(BaseModel):
    """FPS the external program measured; its protocol fields are kept."""

    model_config = ConfigDict(extra="allow")

    fps: Number = Field(gt=0, description="Frames (samples) per second.")


class ExternalEval(BaseModel):
    """eval.json of an external job."""

    model_config = ConfigDict(extra="allow")

    metrics: dict[str, Number] = Field(min_length=1, description="Metric name -> value.")
    primary_metric: str | None = Field(None, description="The metric the leaderboard ranks by.")
    fps: ExternalFps | None = Field(None, description="Measured FPS (a number or an object with `fps`).")
    input_shape: list[Annotated[int, Field(strict=True, ge=1, le=1_000_000)]] | None = Field(
        None, min_length=1, max_length=8, description="Input shape of model.onnx (fills symbolic axes).")
    dataset_hash: str | None = Field(None, max_length=200, description="Data version, for the registry.")

    @field_validator("metrics")
    @classmethod
    def _names(cls, v: dict[str, float]) -> dict[str, float]:
        for name in v:
            if not name or len(name) > 64:
                raise ValueError(f"metric name {name[:20]!r}: must be 1-64 characters")
        return v

    @field_validator("fps", mode="before")
    @classmethod
    def _bare_number(cls, v: Any) -> Any:
        return {"fps": v} if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _primary(self) -> ExternalEval:
        if self.primary_metric is None:
            known = [m for m in KNOWN_PRIMARY if m in self.metrics]
            if known:
                self.primary_metric = known[0]
            elif len(self.metrics) == 1:
                self.primary_metric = next(iter(self.metrics))
            else:
                raise ValueError("primary_metric is required when metrics has several keys and none of "
                                 f"{', '.join(KNOWN_PRIMARY)}")
        elif self.primary_metric not in self.metrics:
            raise ValueError(f"primary_metric {self.primary_metric!r} is not a key of metrics")
        return self


def read_external_eval(path: Path) -> dict[str, Any]:
    """Parse and validate an external job's eval.json; ConfigError naming the file and field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: missing; an external job must write eval.json with {{\"metrics\": {{...}}}}")
    if path.stat().st_size > MAX_EVAL_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_EVAL_BYTES} bytes; eval.json holds metrics, not data")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}); write it with json.dump") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; write eval.json as UTF-8 JSON") from None
    except RecursionError:  # a hostile program's output: nesting deeper than the parser's stack
        raise ConfigError(f"{path}: JSON nested too deeply; write plain metrics with json.dump") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{path}: unreadable JSON value ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object with a \"metrics\" key")
    try:
        parsed = ExternalEval.model_validate(data)
    except ValidationError as err:
        message = format_validation_error(err, ExternalEval, str(path))
        raise ConfigError(message.replace("add it to the job file", "the external program must write it")) from None
    out = parsed.model_dump(exclude_none=True)
    return out
