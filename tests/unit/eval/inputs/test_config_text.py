"""`config_text`: values written back as an eval config that the config reader takes again
(what `eval submit --model/-n/--limit` sends, and the official CLI's submit on the server)."""

from __future__ import annotations

import datetime

import pytest

from osmosis.eval.inputs.config import parse_eval_config
from osmosis.eval.inputs.config_text import config_text
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.services import submit_source

EXPERIMENT = {"rollout": "r", "entrypoint": "main.py", "model_path": "openai/b", "dataset": "d"}


def test_the_written_text_reads_back_as_the_same_values():
    advanced = {"temperature": 0.2, "stop": ["a", "b"], "extra": {"odd key": True}}
    env = {"GREETING": 'say "hi"\x7f é'}  # a quote, DEL (raw in TOML it is an error), non-ASCII
    text = config_text(
        experiment=EXPERIMENT,
        evaluation={"n": 2, "limit": 4, "pass_threshold": 0.5},
        advanced=advanced,
        env=env,
        required=["OPENAI_API_KEY"],
    )
    config = parse_eval_config(text, path="configs/eval/x.toml")
    assert config.experiment.model_dump(exclude_none=True) == EXPERIMENT
    assert (config.evaluation.n, config.evaluation.limit) == (2, 4)
    assert config.evaluation.pass_threshold == 0.5
    assert (config.advanced, config.env) == (advanced, env)
    assert config.secrets.required == ("OPENAI_API_KEY",)


def test_a_value_toml_cannot_hold_is_named_and_the_server_refuses_it_as_validation():
    values = {
        "experiment": EXPERIMENT,
        "evaluation": {},
        "advanced": {"when": datetime.date(2026, 1, 1)},
        "env": {},
        "required": [],
    }
    with pytest.raises(ValueError, match=r"datetime.date\(2026, 1, 1\) cannot be written"):
        config_text(**values)
    with pytest.raises(ValidationFailed, match="cannot be written in an eval config"):
        submit_source.config_text(**values)
